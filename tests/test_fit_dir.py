"""`planner fit` writes to the user's folder, never into the package; predictions read --models / PLANNER_MODELS_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.cost.regressors.artifacts import SHIPPED_MODELS_DIR
from costmodel.fitting.datasets.schema import save_dataset
from planner.models_dir import fit_output_dir, models_dir_for, user_models_dir
from tests.helpers import tiny_dataset

REPO = Path(__file__).resolve().parent.parent


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _planner(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """`planner fit` of one tiny CPU GEMM profile with no --out, HOME and XDG_CACHE_HOME in a temporary folder."""
    root = tmp_path_factory.mktemp("fit")
    profile = root / "profile"
    save_dataset(tiny_dataset(), profile / "gemm_cpu.csv")
    env = {**os.environ, "HOME": str(root / "home"), "XDG_CACHE_HOME": str(root / "xdg")}
    env.pop("PLANNER_MODELS_DIR", None)
    before = _snapshot(SHIPPED_MODELS_DIR)
    res = _planner(["fit", "--profile", str(profile), "--no-public", "--quick"], env)
    return root, env, before, res


def test_fit_default_goes_to_xdg_cache_not_the_package(fitted):
    root, _, before, res = fitted
    assert res.returncode == 0, res.stderr
    out = root / "xdg" / "planner" / "models"
    assert (out / "index.json").is_file() and (out / "cpu" / "gemm.fwd.json").is_file()
    assert _snapshot(SHIPPED_MODELS_DIR) == before, "planner fit changed the shipped models folder"
    assert f"--models {out}" in res.stdout  # the fit says how to use what it wrote


def test_user_models_dir_without_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_models_dir() == tmp_path / ".cache" / "planner" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    assert user_models_dir() == tmp_path / ".cache" / "planner" / "models"
    assert fit_output_dir(tmp_path / "mine") == tmp_path / "mine"


def test_predict_reads_models_dir_from_env_and_flag(fitted):
    root, env, _, _ = fitted
    out = root / "xdg" / "planner" / "models"
    # the same plan with the shipped models, then with PLANNER_MODELS_DIR set to a fit that covers only the CPU
    args = ["predict", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--format", "json"]
    shipped = json.loads(_planner(args, env).stdout)
    assert Path(shipped["models_dir"]) == SHIPPED_MODELS_DIR
    # a user folder that lacks the GPU keeps the shipped models for it and says so
    with_env = json.loads(_planner(args, {**env, "PLANNER_MODELS_DIR": str(out)}).stdout)
    assert Path(with_env["models_dir"]) == SHIPPED_MODELS_DIR
    assert with_env["iteration_time_s"] == shipped["iteration_time_s"]


def test_models_dir_for_follows_lookup_order(fitted, monkeypatch):
    root, _, _, _ = fitted
    out = root / "xdg" / "planner" / "models"
    from costmodel.cost.measured import MeasuredCostModel

    monkeypatch.setenv("PLANNER_MODELS_DIR", str(out))
    cm = MeasuredCostModel()
    assert models_dir_for("cpu", cm) == str(out)
    assert Path(models_dir_for("a100-80gb", cm)) == SHIPPED_MODELS_DIR
    assert models_dir_for("no-such-gpu", cm) == ""


def test_models_flag_is_used_and_checked(fitted):
    root, env, _, _ = fitted
    out = root / "xdg" / "planner" / "models"
    bad = _planner(["predict", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--models",
                    str(root / "nothing")], env)
    assert bad.returncode == 2 and "holds no index.json" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # --models sets the lookup for the process: a CPU prediction reads the user's CPU GEMM model
    code = ("import json, os, sys; from planner.models_dir import use_models_dir, models_dir_for; "
            f"use_models_dir(__import__('pathlib').Path({str(out)!r})); "
            "print(os.environ['PLANNER_MODELS_DIR']); print(models_dir_for('cpu'))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(out.resolve()), str(out.resolve())]
