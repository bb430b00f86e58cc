"""costmodel/profiling/torchrun.py: why a torchrun job failed, and ending a worker without interpreter teardown."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from costmodel.profiling.torchrun import failure_reason

FIXTURES = Path(__file__).parent / "fixtures"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install 'planner[profile]')")


def test_reason_names_the_rank_the_signal_and_what_the_process_said():
    # torchrun 2.13's stderr of the collective sweep that failed in CI (rank 1 aborted at interpreter
    # shutdown, reproduced on the 2-core VM with three sweeps at once); the old message was its last line,
    # a row of '='
    text = (FIXTURES / "torchrun_sigabrt.stderr").read_text()
    assert failure_reason(text) == "rank 1 died of SIGABRT (terminate called without an active exception)"


def test_reason_for_a_python_exception_is_the_worker_exception_not_the_agent_one():
    # torchrun 2.13's stderr when rank 1 raised RuntimeError("boom from rank 1")
    text = (FIXTURES / "torchrun_exception.stderr").read_text()
    assert failure_reason(text) == "rank 1 exited with code 1 (RuntimeError: boom from rank 1)"


def test_reason_prefers_the_worker_error_line_and_never_returns_a_rule():
    assert failure_reason("noise\nerror: unknown plan 'x'; run planner profile --list\nmore") == \
        "unknown plan 'x'; run planner profile --list"
    assert failure_reason("") == "no output"
    assert failure_reason("last words\n=====\n") == "last words"


def test_exit_worker_flushes_the_streams_keeps_the_code_and_skips_interpreter_teardown():
    code = textwrap.dedent("""
        import atexit, sys
        from costmodel.profiling.torchrun import exit_worker
        atexit.register(lambda: print("teardown ran", flush=True))
        sys.stdout.write("out-unflushed")
        sys.stderr.write("err-unflushed")
        exit_worker(3)
        print("after exit")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 3
    assert res.stdout == "out-unflushed" and res.stderr == "err-unflushed"  # flushed; no atexit, no later code


@needs_torch
def test_reason_from_a_real_torchrun_job_whose_rank_aborts(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import os, sys
        if os.environ["RANK"] == "1":
            print("terminate called without an active exception", file=sys.stderr, flush=True)
            os.abort()
    """))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(worker)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert failure_reason(res.stderr) == "rank 1 died of SIGABRT (terminate called without an active exception)"
