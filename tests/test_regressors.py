"""Regressor contract (every registered implementation), features, selection and the fit pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GroupKFold, cross_validate

from costmodel.core.kinds import FEATURES
from costmodel.cost.regressors import REGISTRY, register
from costmodel.cost.regressors.features import CPU_NOMINAL, build_features, feature_names
from costmodel.cost.regressors.loading import load_regressor
from costmodel.cost.regressors.selection import select, shape_groups
from tests.helpers import synthetic, tiny_dataset

SMALL = {"forest": dict(n_estimators=15, max_depth=5), "boosted": dict(n_estimators=30, max_depth=4)}


@pytest.fixture(params=sorted(REGISTRY))
def est(request):
    return REGISTRY[request.param](**SMALL[request.param])


def test_fit_returns_self_and_params(est):
    raw, X, y = synthetic()
    assert est.fit(X, y) is est
    assert est.n_features_in_ == X.shape[1] and est.feature_ranges_.shape == (X.shape[1], 2)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "booster_")
    c.set_params(random_state=3)
    assert c.get_params()["random_state"] == 3


def test_cross_validate(est):
    raw, X, y = synthetic()
    res = cross_validate(est, X, y, groups=shape_groups(raw), cv=GroupKFold(3),
                         scoring="neg_mean_absolute_percentage_error")
    assert np.all(np.isfinite(res["test_score"])) and -res["test_score"].mean() < 0.5


def test_deterministic(est):
    raw, X, y = synthetic()
    a = clone(est).fit(X, y).predict(X)
    b = clone(est).fit(X, y).predict(X)
    assert np.array_equal(a, b)


def test_save_load_round_trip(est, tmp_path):
    raw, X, y = synthetic()
    est.fit(X, y)
    p = est.save(tmp_path / "m.json", {"note": "x"})
    back = load_regressor(p)
    assert type(back) is type(est) and back.get_params() == est.get_params()
    assert np.array_equal(back.predict(X), est.predict(X))
    for u, v in zip(back.predict_interval(X), est.predict_interval(X)):
        assert np.array_equal(u, v)
    assert b"pickle" not in p.read_bytes()[:0] and back.meta_["note"] == "x"


def test_wrong_feature_count(est):
    raw, X, y = synthetic()
    est.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :-1])


def test_interval_brackets(est):
    raw, X, y = synthetic()
    est.fit(X, y)
    p = est.predict(X)
    lo, hi = est.predict_interval(X)
    assert np.all(lo <= p) and np.all(p <= hi) and np.any(hi > lo)


def test_rejects_bad_targets(est):
    raw, X, y = synthetic()
    with pytest.raises(ValueError):
        clone(est).fit(X, -y)


def test_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        @register
        class Again(REGISTRY["forest"]):
            name = "forest"


def test_features_shape_every_kind():
    for kind in FEATURES:
        raw = np.full((4, len(FEATURES[kind])), 8.0)
        X = build_features(kind, raw, "bf16", False, CPU_NOMINAL)
        assert X.shape == (4, len(feature_names(kind))) and np.all(np.isfinite(X)) and np.all(X[:, -1] > 0)


def test_select_picks_a_candidate():
    raw, X, y = synthetic(200)
    s = select(X, y, shape_groups(raw), quick=True, n_splits=3)
    assert s.estimator in REGISTRY and len(s.candidates) == 2
    assert s.cv["mape"] == min(c["mape"] for c in s.candidates)


def test_fit_pipeline_deterministic(tmp_path):
    from costmodel.fitting.fit import fit_all

    ds = {("gemm", "cpu"): tiny_dataset()}
    a, b = tmp_path / "a", tmp_path / "b"
    fit_all(ds, a, quick=True, log=lambda s: None)
    fit_all(ds, b, quick=True, log=lambda s: None)
    files = sorted(p.relative_to(a) for p in a.rglob("*.json"))
    assert {str(f) for f in files} >= {"index.json", "cpu/gemm.fwd.json", "cpu/gemm.fwd.meta.json"}
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_fit_pipeline_skips_small(tmp_path):
    from costmodel.fitting.fit import fit_all

    ds = tiny_dataset().select(np.arange(10))
    idx = fit_all({("gemm", "cpu"): ds}, tmp_path, quick=True, log=lambda s: None)
    assert "gemm.fwd" in idx["skipped"]["cpu"] and "10 samples" in idx["skipped"]["cpu"]["gemm.fwd"]


def test_report_formats(tmp_path):
    from costmodel.fitting.fit import fit_all, render_report

    fit_all({("gemm", "cpu"): tiny_dataset()}, tmp_path, quick=True, log=lambda s: None)
    for fmt in ("table", "json", "md"):
        text = render_report(tmp_path, fmt)
        assert "gemm" in text
