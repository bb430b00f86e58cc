"""Resumable journal: one JSONL file per operator kind, one line per finished sample.

The first line is a header ``{"type": "header", "identity": ..., "kind": ...}``; every other line is a
finished sample ``{"type": "sample", "key": ..., ...}`` (measured, or ``"status": "skipped"`` with a
reason, e.g. out of memory). Each line is written with one ``write`` then flushed and fsync'd, so a killed
run loses at most the sample in flight. On reopening, a last line without its newline (or not valid JSON)
is the trace of a kill: it is dropped and the file rewritten without it. A bad line elsewhere is
corruption and an error.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.schema import _atomic_write

FAULT_ENV = "PLANNER_FAULT_KILL_AT_SAMPLE"
"""Fault injection for tests (tests/test_sampling.py): at this process's N-th appended sample, write half
of its line and SIGKILL the process, the worst moment a real kill can hit."""
_appended = [0]


class Journal:
    """Append-only record of the finished samples of one kind in one output folder."""

    def __init__(self, path: Path, kind: str, identity: dict, resume: bool = True) -> None:
        self.path = Path(path)
        self.kind = kind
        self.records: dict[str, dict] = {}
        """key -> record of every finished sample (first occurrence wins)."""
        self.dropped_partial = 0
        """Partial trailing lines dropped when opening (0 or 1)."""
        header = {"type": "header", "kind": kind, "identity": identity}
        if resume and self.path.exists():
            self._load(identity)
        else:
            _atomic_write(self.path, json.dumps(header, sort_keys=True) + "\n")
        self._fh = open(self.path, "a", encoding="utf-8")

    def _load(self, identity: dict) -> None:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        complete, tail = lines[:-1], lines[-1]  # tail is '' when the file ends with a newline
        good: list[str] = []
        for lineno, line in enumerate(complete, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if lineno == len(complete) and not tail:
                    self.dropped_partial += 1  # a torn last line that happens to end in a newline
                    continue
                raise PlannerError(f"journal {self.path} line {lineno} is corrupted; delete the file to "
                                   "re-measure this operator kind") from None
            good.append(line)
            if lineno == 1:
                if rec.get("type") != "header" or rec.get("kind") != self.kind:
                    raise PlannerError(f"journal {self.path} does not start with a {self.kind} header; delete it")
                if rec.get("identity") != identity:
                    diff = sorted(k for k in set(identity) | set(rec.get("identity", {}))
                                  if identity.get(k) != rec.get("identity", {}).get(k))
                    raise PlannerError(f"journal {self.path} was recorded in another environment (differs in "
                                       f"{', '.join(diff)}); use another --out folder or delete the journal")
            elif rec.get("type") == "sample":
                self.records.setdefault(rec["key"], rec)
        if tail:
            self.dropped_partial += 1
        if not good:
            raise PlannerError(f"journal {self.path} has no header; delete it to re-measure")
        if self.dropped_partial:
            _atomic_write(self.path, "\n".join(good) + "\n")

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def append(self, record: dict) -> None:
        """Record one finished sample durably (one write, flush, fsync)."""
        record = {"type": "sample", **record}
        line = json.dumps(record, sort_keys=True) + "\n"
        _appended[0] += 1
        if os.environ.get(FAULT_ENV, "") == str(_appended[0]):
            self._fh.write(line[: len(line) // 2])
            self._fh.flush()
            os.fsync(self._fh.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records.setdefault(record["key"], record)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
