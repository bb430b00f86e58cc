"""The numpy tree evaluator used at prediction time must agree with xgboost itself."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel.cost.regressors.artifacts import SHIPPED_MODELS_DIR, read_index
from costmodel.cost.regressors.runtime import RuntimeRegressor


def _shipped():
    idx = read_index(SHIPPED_MODELS_DIR)
    for gpu, names in sorted(idx.get("models", {}).items()):
        for name in sorted(names):
            yield gpu, name


@pytest.mark.parametrize("gpu,name", list(_shipped()))
def test_runtime_matches_xgboost_on_shipped_models(gpu, name):
    from costmodel.cost.regressors.loading import load_regressor

    path = SHIPPED_MODELS_DIR / gpu / f"{name}.json"
    est = load_regressor(path)
    fast = RuntimeRegressor(path)
    rng = np.random.default_rng(0)
    lo, hi = est.feature_ranges_[:, 0], est.feature_ranges_[:, 1]
    X = lo + (hi - lo) * rng.random((64, len(lo)))
    X[:, -1] = np.maximum(X[:, -1], 1e-9)     # reference (roofline) column stays positive
    want = est.predict_with_interval(X)
    got = fast.predict_with_interval(X)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-4)


def test_runtime_refuses_wrong_feature_count():
    gpu, name = next(_shipped())
    fast = RuntimeRegressor(SHIPPED_MODELS_DIR / gpu / f"{name}.json")
    with pytest.raises(ValueError, match="features"):
        fast.predict_with_interval(np.ones((2, fast.n_features_in_ + 1)))


def test_prediction_path_imports_neither_sklearn_nor_xgboost():
    code = ("import sys; from planner.requests import build_request; from planner.prediction import predict; "
            "r = build_request({'model': 'llama-7b', 'gpu': 'h100-sxm', 'gpus': 8, 'tp': 2, 'gbs': 64}); "
            "p = predict(r.model, r.plan, r.hardware); "
            "assert p.cost_model == 'measured'; "
            "bad = [m for m in ('sklearn', 'xgboost', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0, res.stderr


def test_tree_cache_is_used_and_a_corrupt_cache_falls_back(tmp_path, monkeypatch):
    from costmodel.cost.regressors import runtime

    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    gpu, name = next(_shipped())
    path = SHIPPED_MODELS_DIR / gpu / f"{name}.json"
    X = None
    first = RuntimeRegressor(path)
    files = list((tmp_path / "trees").glob("*.bin"))
    assert len(files) == 1
    rng = np.random.default_rng(1)
    X = rng.random((8, first.n_features_in_)) + 1e-6
    want = first.predict_with_interval(X)
    files[0].write_bytes(b'{"format": 2, "tables": {"main": ["left"]}}\n' + b"\x00" * 10)  # truncated cache
    again = RuntimeRegressor(path)
    for w, g in zip(want, again.predict_with_interval(X)):
        np.testing.assert_array_equal(g, w)
    assert runtime._decode(files[0]) is not None   # rewritten with a good copy
