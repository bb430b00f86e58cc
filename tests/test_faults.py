"""Faults: a process killed while writing never leaves a file that later loads half-written.

* Every writer in planner/, costmodel/, scripts/ and benchmarks/ goes through costmodel/core/fileio.py (a static
  scan of the source; the sampling journal is the one append-only exception, with torn-line recovery
  tested in tests/test_sampling.py).
* A real process is SIGKILLed at the worst moments of an atomic write (after the data is written and
  fsync'd but before the rename; and mid-write) for each kind of file planner writes: the old file is
  still there and still loads, and the leftover temporary file is invisible to the loaders.
* Multi-file outputs (dataset CSV + sidecar, model files + sidecar) carry hashes, so a crash between
  two atomic writes gives a clean error instead of a mixed pair.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.schema import load_dataset, save_dataset
from tests.helpers import python_sources, synthetic, three_row_dataset

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("planner", "costmodel", "scripts", "benchmarks")
ALLOWED = {"costmodel/core/fileio.py", "costmodel/profiling/sampling/journal.py"}
"""The atomic-write implementation itself, and the append-only sampling journal."""


def _writes(tree: ast.AST) -> list[int]:
    """Line numbers of direct file writes: open(..., 'w'/'a'/'x'...), Path.write_text/write_bytes, os.replace."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
        if name in ("write_text", "write_bytes"):
            out.append(node.lineno)
        elif name == "replace" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "os":
            out.append(node.lineno)
        elif name in ("open", "fdopen"):
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                out.append(node.lineno)
    return out


def test_every_writer_goes_through_fileio():
    offenders = []
    n_files = 0
    for rel, tree in python_sources(SCANNED):
        n_files += 1
        if rel not in ALLOWED:
            offenders += [f"{rel}:{n}" for n in _writes(tree)]
    assert n_files > 50
    assert not offenders, f"direct file writes (use costmodel.core.fileio.atomic_*): {offenders}"


def test_scanner_finds_direct_writes():
    src = "open(p, 'w')\nPath(p).write_text('x')\nos.replace(a, b)\nopen(p)\nopen(p, mode='ab')\n"
    assert _writes(ast.parse(src)) == [1, 2, 3, 5]


# ------------------------------------------------------------------ SIGKILL during atomic writes
WRITERS = {
    # name: (python that writes version `v` of the file at `path`, python that loads it and prints a token)
    "report": ("from costmodel.core.fileio import atomic_write_text; "
               "atomic_write_text(path, f'# report v{v}\\n' * 20000)",
               "print(open(path, encoding='utf-8').read().splitlines()[0])"),
    "dataset": ("from tests.helpers import three_row_dataset; "
                "from costmodel.fitting.datasets.schema import save_dataset; "
                "save_dataset(three_row_dataset(v), path)",
                "from costmodel.fitting.datasets.schema import load_dataset; print(load_dataset(path).time_s[0])"),
    "calibration": ("from planner.calibrate import identity, save_calibration; import pathlib; "
                    "c = identity({'iteration_overhead_s': float(v)}, name='c'); "
                    "save_calibration(c, pathlib.Path(path).parent)",
                    "from planner.calibrate import load_calibration; "
                    "print(load_calibration(path).iteration_overhead_s)"),
    "index": ("from costmodel.cost.regressors.artifacts import write_index; import pathlib; "
              "write_index(pathlib.Path(path).parent, {'format': 1, 'models': {}, 'v': v})",
              "from costmodel.cost.regressors.artifacts import read_index; import pathlib; "
              "print(read_index(pathlib.Path(path).parent)['v'])"),
    "runs": ("from costmodel.profiling.workloads.runner import write_runs_csv; "
             "write_runs_csv([{'id': f'R-{v}', 'measured_value': v}], path)",
             "import csv; print(list(csv.DictReader(open(path, encoding='utf-8')))[0]['id'])"),
}
FILENAMES = {"report": "r.md", "dataset": "gemm.csv", "calibration": "c.json", "index": "index.json",
             "runs": "runs.csv"}


def _py(code: str, path: Path, v: int, kill_at: str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter. ``kill_at='write'``: a 16-byte file-size limit, so the kernel kills
    the process (SIGXFSZ) in the middle of writing the first file; ``kill_at='replace'``: SIGKILL after the
    data is written and fsync'd, just before the rename."""
    hook = ""
    if kill_at == "replace":
        hook = "import os, signal; os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
    elif kill_at == "write":
        # Python ignores SIGXFSZ (writes then fail with EFBIG); the default action kills, as a crash would
        hook = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.RLIM_INFINITY))\n")
    prog = hook + f"path = {str(path)!r}; v = {v}\n" + code
    return subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})


KILLED = {"write": -signal.SIGXFSZ, "replace": -signal.SIGKILL}


@pytest.mark.parametrize("moment", ["write", "replace"])
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_sigkill_mid_write_keeps_the_old_file(tmp_path, kind, moment):
    write, load = WRITERS[kind]
    path = tmp_path / FILENAMES[kind]
    first = _py(write, path, 1)
    assert first.returncode == 0, first.stderr
    before = _py(load, path, 1)
    assert before.returncode == 0, before.stderr
    killed = _py(write, path, 2, kill_at=moment)
    assert killed.returncode == KILLED[moment], (killed.returncode, killed.stderr)
    after = _py(load, path, 1)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr   # old version, intact
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers and all(n.startswith(".") for n in leftovers)  # hidden temp file, never the target name


def test_loaders_ignore_leftover_temporary_files(tmp_path):
    from costmodel.fitting.fit import dataset_dirs_to_datasets

    save_dataset(three_row_dataset(), tmp_path / "gemm.csv")
    killed = _py(WRITERS["dataset"][0], tmp_path / "norm.csv", 3, kill_at="replace")
    assert killed.returncode == -signal.SIGKILL
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    got = dataset_dirs_to_datasets([tmp_path])
    assert list(got) == [("gemm", "cpu")]


# ------------------------------------------------------------------ crash between two atomic writes
def test_dataset_with_a_stale_sidecar_is_refused(tmp_path):
    p = save_dataset(three_row_dataset(1.0), tmp_path / "gemm.csv")
    old_side = p.with_suffix(".json").read_text()
    save_dataset(three_row_dataset(2.0), p)
    p.with_suffix(".json").write_text(old_side)  # as if killed after the CSV's rename, before the sidecar's
    with pytest.raises(PlannerError, match="does not match its sidecar"):
        load_dataset(p)


def test_model_files_with_a_stale_sidecar_are_refused(tmp_path):
    from costmodel.cost.regressors import REGISTRY
    from costmodel.cost.regressors.base import sidecar_path
    from costmodel.cost.regressors.loading import load_regressor
    from costmodel.cost.regressors.runtime import RuntimeRegressor

    _, X, y = synthetic(60, 0)
    path = tmp_path / "m.json"
    REGISTRY["forest"](n_estimators=5, random_state=0).fit(X, y).save(path)
    old_side = sidecar_path(path).read_text()
    REGISTRY["forest"](n_estimators=5, random_state=1).fit(X, 2 * y).save(path)
    sidecar_path(path).write_text(old_side)  # killed after the model file's rename, before the sidecar's
    for load in (load_regressor, RuntimeRegressor):
        with pytest.raises(PlannerError, match="does not match its sidecar"):
            load(path)
    assert "file_sha256" in json.loads(old_side)
