"""Model selection by grouped cross-validation (scikit-learn ``GroupKFold`` + ``GridSearchCV``).

Groups are whole shapes (identical raw-feature rows, e.g. one (m, n, k) across dtypes and sources), so
a shape never sits in both the training and the test fold. Candidates: every registered family
(forest, boosted) over a small grid, and both targets (log ratio to the unit roofline, log time).
Score: MAPE of the predicted *time* (the estimators' ``predict`` returns seconds), via
``sklearn.metrics.mean_absolute_percentage_error``. The median and 90th-percentile absolute
percentage errors are recorded from the same folds (mean over folds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.metrics import make_scorer, mean_absolute_percentage_error
from sklearn.model_selection import GridSearchCV, GroupKFold

from costmodel.cost.regressors import REGISTRY

GRIDS: dict[str, dict] = {
    "forest": {"n_estimators": [50], "max_depth": [8], "target": ["ratio", "time"]},
    "boosted": {"n_estimators": [200], "max_depth": [6], "learning_rate": [0.15], "target": ["ratio", "time"]},
}
"""The shipped grid (small on purpose: the whole fit must run on 2 cores in minutes, and every artifact
stays around 1 MB of JSON so loading all defaults takes well under a second)."""

QUICK_GRIDS: dict[str, dict] = {
    "forest": {"n_estimators": [30], "max_depth": [8], "target": ["ratio"]},
    "boosted": {"n_estimators": [100], "max_depth": [6], "learning_rate": [0.2], "target": ["ratio"]},
}
"""``--quick``: one candidate per family."""


def _ape(y, p):
    return np.abs(np.asarray(p) / np.asarray(y) - 1.0)


def median_ape(y, p) -> float:
    return float(np.median(_ape(y, p)))


def p90_ape(y, p) -> float:
    return float(np.quantile(_ape(y, p), 0.9))


SCORING = {
    "mape": make_scorer(mean_absolute_percentage_error, greater_is_better=False),
    "median_ape": make_scorer(median_ape, greater_is_better=False),
    "p90_ape": make_scorer(p90_ape, greater_is_better=False),
}


@dataclass
class Selection:
    """Outcome of :func:`select`."""

    estimator: str
    """Winning family (registry name)."""
    params: dict
    """Its winning parameters (grid values only)."""
    cv: dict
    """Winner's CV metrics: mape, median_ape, p90_ape (fractions), folds, groups."""
    candidates: list = field(default_factory=list)
    """Every candidate: {estimator, params, mape, median_ape, p90_ape}."""


def shape_groups(raw: np.ndarray) -> np.ndarray:
    """Group id per row: identical raw feature rows share a group."""
    _, inv = np.unique(np.asarray(raw, dtype=float), axis=0, return_inverse=True)
    return inv.ravel()


def select(X, y, groups, *, quick: bool = False, n_splits: int = 4, random_state: int = 0, n_jobs: int = 1,
           grids: dict | None = None) -> Selection:
    """Grid-search every family with GroupKFold; the lowest mean-fold MAPE wins."""
    grids = grids or (QUICK_GRIDS if quick else GRIDS)
    n_groups = len(np.unique(groups))
    folds = min(n_splits, n_groups)
    if folds < 2:
        raise ValueError(f"grouped CV needs at least 2 distinct shapes, got {n_groups}")
    cv = GroupKFold(n_splits=folds)
    cands = []
    for name in sorted(grids):
        base = REGISTRY[name](random_state=random_state, n_jobs=n_jobs)
        if "intervals" in base.get_params():
            base.set_params(intervals=False)
        gs = GridSearchCV(base, grids[name], scoring=SCORING, refit=False, cv=cv, n_jobs=1, error_score="raise")
        gs.fit(X, y, groups=groups)
        r = gs.cv_results_
        for i, p in enumerate(r["params"]):
            cands.append({"estimator": name, "params": dict(sorted(p.items())),
                          "mape": float(-r["mean_test_mape"][i]), "median_ape": float(-r["mean_test_median_ape"][i]),
                          "p90_ape": float(-r["mean_test_p90_ape"][i])})
    best = min(cands, key=lambda c: (c["mape"], c["estimator"], sorted(c["params"].items())))
    return Selection(best["estimator"], best["params"],
                     {"mape": best["mape"], "median_ape": best["median_ape"], "p90_ape": best["p90_ape"],
                      "folds": folds, "groups": int(n_groups)}, cands)
