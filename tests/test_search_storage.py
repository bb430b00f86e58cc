"""Persistent studies (issue 16): Ctrl-C leaves a resumable study and one line; several worker processes
share one study (SQLite file, journal file, PostgreSQL where a server is given) with every trial once.

PostgreSQL: PLANNER_TEST_POSTGRES_URL (e.g. postgresql+psycopg://user@localhost/db, a database the test may
write to) runs that case; .ci/run starts a throwaway server and sets it (.ci/postgres.sh), so under CI=true a
missing server or driver is a failure; on a developer machine without one the case is skipped with the reason.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import in_ci

REPO = Path(__file__).resolve().parents[1]
PLANNER = [sys.executable, "-c", "from planner.cli import main; main()"]
SPACE = ["--tp", "1,2,4,8", "--pp", "1,2,4", "--cp", "1,2", "--vpp", "1", "--mbs", "1,2,4", "--recompute",
         "selective,full", "--zero", "1,3"]
"""256 valid plans on llama-13b / 32 GPUs: more than any study below runs, so none stops early for having
evaluated every valid plan (planner.search.answers)."""
BIG = ["--gpu", "a100-80gb", "--gpu", "h100-sxm", "--gpu", "h200"]
"""Three GPU types on 128 GPUs with the default space: thousands of valid plans, more than an in-memory search
evaluates in the seconds before the test interrupts it."""
PG_ENV = "PLANNER_TEST_POSTGRES_URL"


def _cmd(url: str, name: str, trials: int, seed: int, *extra: str) -> list[str]:
    return PLANNER + ["search", "--model", "llama-13b", "--gpus", "32", *SPACE, "--storage", url, "--study-name",
                      name, "--trials", str(trials), "--seed", str(seed), "--no-progress", "--format", "csv", *extra]


def _trials(url: str, name: str) -> list:
    import optuna

    from planner.search.study import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)


def _stored(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("select count(*) from trials where state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


def test_ctrl_c_mid_search_is_one_line_exit_130_and_resumes_to_the_same_ranking(tmp_path):
    from planner.search.study import FLUSH_ENV

    ref = subprocess.run(_cmd(f"sqlite:///{tmp_path / 'ref.db'}", "s", 200, 3), cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    # each trial written as it finishes, so the signal can be sent once the first trials are stored
    p = subprocess.Popen(_cmd(url, "s", 200, 3), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, FLUSH_ENV: "0"})
    deadline = time.time() + 120
    while _stored(db) < 5 and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "the search ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted; resume with planner search "), err
    assert lines[0].endswith("--resume") and "Traceback" not in err and "[W" not in err
    trials = _trials(url, "s")
    assert trials and 5 <= len(trials) < 200
    assert all(t.state.name == "COMPLETE" for t in trials)  # nothing left RUNNING
    resumed = subprocess.run(_cmd(url, "s", 200, 3, "--resume"), cwd=REPO, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert len(_trials(url, "s")) == 200
    assert resumed.stdout == ref.stdout  # the same ranked plans as the uninterrupted run


def test_ctrl_c_without_a_study_says_interrupted(tmp_path):
    """An in-memory Optuna search has nothing to resume: "interrupted", exit 130."""
    p = subprocess.Popen(PLANNER + ["search", "--model", "llama-13b", "--gpus", "128", *BIG, "--mode", "optuna",
                                    "--trials", "100000", "--no-progress"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # imports and the first trials
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip() == "interrupted", err


def _workers(url: str, name: str, n: int, trials: int) -> None:
    procs = [subprocess.Popen(_cmd(url, name, trials, seed), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in range(n)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err and "[W" not in err, err


def _best(stdout: str) -> str:
    """The top-ranked row's plan columns (the CSV's first data row up to the trial number)."""
    head, row = stdout.splitlines()[:2]
    cols = head.split(",")
    return ",".join(v for c, v in zip(cols, row.split(",")) if c not in ("trial", "rank"))


def _shared_study(url: str, tmp_path: Path, name: str = "shared") -> None:
    n, trials = 3, 40
    _workers(url, name, n, trials)
    got = _trials(url, name)
    assert sorted(t.number for t in got) == list(range(n * trials))  # every trial once
    assert all(t.state.name == "COMPLETE" for t in got)
    one = subprocess.run(_cmd(f"sqlite:///{tmp_path / 'one.db'}", "one", trials, 0), cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    again = subprocess.run(_cmd(url, name, 0, 0), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and again.returncode == 0, one.stderr + again.stderr
    assert _best(again.stdout) == _best(one.stdout)  # the same best plan as one worker


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_worker_processes_share_one_study(tmp_path, kind):
    url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 's.journal'}"
    _shared_study(url, tmp_path)


def _postgres_url() -> str:
    """The server's URL; a skip on a developer machine without one, a failure under CI=true (.ci/run starts one)."""
    url = os.environ.get(PG_ENV)
    missing = None if url else (f"no PostgreSQL server: set {PG_ENV}=postgresql+psycopg://USER@HOST/DB (.ci/run "
                                "starts a throwaway one, .ci/postgres.sh)")
    if missing is None and url.startswith("postgresql+psycopg:"):
        try:
            import psycopg  # noqa: F401  (the driver SQLAlchemy loads for postgresql+psycopg://)
        except ImportError:
            missing = "the PostgreSQL driver psycopg is not installed: pip install -e '.[test]'"
    if missing is not None:
        if in_ci():
            pytest.fail(f"CI: {missing}")
        pytest.skip(missing)
    return url


def test_worker_processes_share_one_postgresql_study(tmp_path):
    url = _postgres_url()
    # a study name of its own: the database may hold studies of earlier runs (.ci/run's two test passes share it)
    _shared_study(url, tmp_path, name=f"shared-{os.getpid()}-{time.time_ns()}")
