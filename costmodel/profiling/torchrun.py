"""Helpers for the project's ``torchrun`` jobs (the collective sweep and the training workload).

Imports no torch: the launchers use :func:`failure_reason`, the workers :func:`exit_worker`.
"""

from __future__ import annotations

import os
import re
import sys

_ROOT_CAUSE = "Root Cause (first observed failure):"
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:.*)?$")
_AGENT_ERROR = "ChildFailedError"


def exit_worker(rc: int) -> None:
    """End a torchrun worker with exit status ``rc`` once its results are written and its process group is
    destroyed, without running the interpreter's finalization.

    On the 2-core VM about 1 in 40 collective sweeps launched next to other load (three sweeps at once,
    2026-11-25) had a rank die with SIGABRT ("terminate called without an active exception") after
    ``worker()`` had returned 0 on both ranks -- during interpreter shutdown, after the barrier and
    ``destroy_process_group``; the project's CI failed on it once. PyTorch describes the cause: gloo's C++
    worker threads still hold objects whose destruction needs the interpreter that is being torn down
    (pytorch/pytorch pull request 179291, "Register atexit handler to destroy process groups before
    interpreter finalization", abandoned). ``os._exit`` skips that teardown; the streams are flushed first.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(int(rc))


def failure_reason(stderr: str) -> str:
    """One line saying why a torchrun job failed, from its captured stderr.

    Prefers the worker's own ``error: ...`` line (a PlannerError, exit code 2); else names the rank torchrun
    reports as the root cause with its exit code or signal, followed by the last thing that rank's process
    said about it (an exception line, ``terminate called ...``); else the last non-empty line."""
    lines = stderr.splitlines()
    own = [ln for ln in lines if ln.startswith("error: ")]
    if own:
        return own[0][len("error: "):]
    cause = ""
    if _ROOT_CAUSE in lines:
        block = lines[lines.index(_ROOT_CAUSE) + 1:]
        block = block[:next((i for i, ln in enumerate(block) if ln and set(ln) <= {"=", "-"}), len(block))]
        fields = {m.group(1): m.group(2) for m in (re.match(r"^\s+(\w+)\s*:\s*(.*)$", ln) for ln in block) if m}
        rank = re.match(r"(\d+)", fields.get("rank", ""))
        code = re.match(r"(-?\d+)\b.*?(?:\((SIG\w+)\))?\s*$", fields.get("exitcode", ""))
        if rank and code:
            how = f"died of {code.group(2)}" if code.group(2) else f"exited with code {code.group(1)}"
            cause = f"rank {rank.group(1)} {how}"
    agent = next((i for i, ln in enumerate(lines) if _AGENT_ERROR in ln), len(lines))
    said = [ln.strip() for ln in lines[:agent]
            if ln.startswith("terminate called") or ln.strip().startswith("what():") or _EXCEPTION.match(ln)]
    detail = said[-1] if said else ""
    if cause and detail:
        return f"{cause} ({detail})"
    if cause or detail:
        return cause or detail
    return next((ln.strip() for ln in reversed(lines) if ln.strip() and set(ln.strip()) != {"="}), "no output")
