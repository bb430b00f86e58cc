"""Random forest (xgboost ``XGBRFRegressor``): one boosting round of ``n_estimators`` parallel trees.

Prediction interval: the spread of the individual trees. In xgboost's random-forest mode the leaf
values of the parallel trees are scaled by 1/T so that ``prediction = base + sum_t w_t``; tree
``t`` on its own predicts ``base + T * w_t``. Leaves come from ``Booster.predict(pred_leaf=True)`` and
their values from the model JSON (``split_conditions`` of leaf nodes).
"""

from __future__ import annotations

import json

import numpy as np

from costmodel.cost.regressors.base import OperatorRegressor, register


@register
class ForestRegressor(OperatorRegressor):
    """Random forest of log-time (or log-ratio) trees."""

    name = "forest"

    def __init__(self, n_estimators=200, max_depth=12, subsample=0.8, colsample_bynode=0.8, min_child_weight=1.0,
                 target="ratio", ref_col=-1, random_state=0, n_jobs=1):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample_bynode = colsample_bynode
        self.min_child_weight = min_child_weight
        self.target = target
        self.ref_col = ref_col
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _fit_z(self, X, z):
        import xgboost as xgb  # deferred: slow to import; the package's lazy names keep it off the prediction path

        model = xgb.XGBRFRegressor(n_estimators=self.n_estimators, max_depth=self.max_depth,
                                   subsample=self.subsample, colsample_bynode=self.colsample_bynode,
                                   min_child_weight=self.min_child_weight, tree_method="hist",
                                   random_state=self.random_state, n_jobs=self.n_jobs)
        model.fit(X, z)
        self.booster_ = model.get_booster()
        self._after_load()

    def _after_load(self):
        trees = json.loads(bytes(self.booster_.save_raw("json")))["learner"]["gradient_booster"]["model"]["trees"]
        width = max(len(t["split_conditions"]) for t in trees)
        table = np.zeros((len(trees), width))
        for i, t in enumerate(trees):
            table[i, : len(t["split_conditions"])] = t["split_conditions"]
        self.leaf_values_ = table
        self.booster_.set_param({"nthread": 1})

    def _predict_z(self, X):
        return self.booster_.inplace_predict(X).astype(np.float64)

    def _members(self, X):
        """[n, T] log-space prediction of each tree on its own."""
        import xgboost as xgb  # deferred: slow to import; the package's lazy names keep it off the prediction path

        leaves = self.booster_.predict(xgb.DMatrix(X), pred_leaf=True).astype(np.intp).reshape(len(X), -1)
        w = self.leaf_values_[np.arange(leaves.shape[1]), leaves]
        base = self._predict_z(X) - w.sum(axis=1)
        return base[:, None] + w * leaves.shape[1]

    def _interval_z(self, X, q):
        lo, hi = np.quantile(self._members(X), q, axis=1)
        return lo, hi
