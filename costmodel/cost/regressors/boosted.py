"""Gradient-boosted trees (xgboost ``XGBRegressor``).

Prediction interval: a second booster with xgboost's quantile objective (``reg:quantileerror``,
pinball loss) fitted to the same log-space target at the quantiles ``interval_q``; saved next to
the main model as ``<stem>.interval.json``. Quantile crossings are resolved by widening the
interval to bracket the point prediction (base class). ``intervals=False`` skips that booster (used
inside cross-validation, where only the point prediction is scored).
"""

from __future__ import annotations

import numpy as np

from costmodel.cost.regressors.base import OperatorRegressor, register

INTERVAL_TREES = 60
INTERVAL_DEPTH = 4
"""Size of the quantile booster: intervals need far less detail than the point model, and this keeps
the shipped artifacts small (chosen by us for size, not fitted)."""


@register
class BoostedRegressor(OperatorRegressor):
    """Boosted log-time (or log-ratio) trees with a quantile booster for intervals."""

    name = "boosted"

    def __init__(self, n_estimators=400, max_depth=8, learning_rate=0.1, subsample=0.8, colsample_bytree=1.0,
                 min_child_weight=1.0, target="ratio", ref_col=-1, interval_q=(0.1, 0.9), intervals=True,
                 random_state=0, n_jobs=1):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.target = target
        self.ref_col = ref_col
        self.interval_q = interval_q
        self.intervals = intervals
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _model(self, **kw):
        import xgboost as xgb  # deferred: slow to import; the package's lazy names keep it off the prediction path

        args = dict(n_estimators=self.n_estimators, max_depth=self.max_depth, learning_rate=self.learning_rate,
                    subsample=self.subsample, colsample_bytree=self.colsample_bytree,
                    min_child_weight=self.min_child_weight, tree_method="hist", random_state=self.random_state,
                    n_jobs=self.n_jobs)
        args.update(kw)
        return xgb.XGBRegressor(**args)

    def _fit_z(self, X, z):
        self.booster_ = self._model().fit(X, z).get_booster()
        self.interval_booster_ = None
        if self.intervals:
            qb = self._model(objective="reg:quantileerror", quantile_alpha=np.asarray(self.interval_q, dtype=float),
                             n_estimators=INTERVAL_TREES, max_depth=INTERVAL_DEPTH)
            self.interval_booster_ = qb.fit(X, z).get_booster()
        self._after_load()

    def _after_load(self):
        for b in (self.booster_, getattr(self, "interval_booster_", None)):
            if b is not None:
                b.set_param({"nthread": 1})

    def _extra_boosters(self):
        return {"interval": self.interval_booster_} if getattr(self, "interval_booster_", None) is not None else {}

    def _set_extra_boosters(self, boosters):
        self.interval_booster_ = boosters.get("interval")

    def _predict_z(self, X):
        return self.booster_.inplace_predict(X).astype(np.float64)

    def _interval_z(self, X, q):
        if getattr(self, "interval_booster_", None) is None:
            raise ValueError("this boosted regressor was fitted with intervals=False; refit with intervals=True")
        if tuple(float(x) for x in q) != tuple(float(x) for x in self.interval_q):
            raise ValueError(f"boosted intervals were fitted for q={tuple(self.interval_q)}, asked for {tuple(q)}")
        out = np.asarray(self.interval_booster_.inplace_predict(X), dtype=np.float64).reshape(len(X), -1)
        return out[:, 0], out[:, -1]
