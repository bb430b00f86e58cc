"""The operator-regressor contract: one scikit-learn estimator per (operator kind, GPU, direction).

``X`` is the engineered feature matrix of :mod:`costmodel.cost.regressors.features` (its column
``ref_col`` holds the unit-efficiency roofline time of each row), ``y`` is the measured time in
seconds. ``predict`` returns seconds. Internally the trees learn

* ``target="ratio"``: ``z = log(time / roofline_time)``, a log inverse efficiency (the paper's
  "ratio to an analytical baseline" option, Zhang et al. arXiv 2509.22832 §III-B), or
* ``target="time"``: ``z = log(time)``.

Which one ships is decided per (kind, GPU) by grouped cross-validation (:mod:`.selection`).
Persistence is xgboost's JSON model format plus a JSON sidecar (``<stem>.meta.json``) with the
estimator name, its parameters and feature metadata; nothing is pickled. Read back with
:func:`costmodel.cost.regressors.loading.load_regressor`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from costmodel.cost.regressors.io import atomic_write_bytes, dumps, sha256_hex, sidecar_path  # noqa: F401

ARTIFACT_FORMAT = 1
"""Version of the sidecar layout written by :meth:`OperatorRegressor.save`."""

REGISTRY: dict[str, type["OperatorRegressor"]] = {}


def register(cls: type["OperatorRegressor"]) -> type["OperatorRegressor"]:
    """Class decorator: add an implementation to :data:`REGISTRY` under ``cls.name`` (unique)."""
    if cls.name in REGISTRY:
        raise ValueError(f"regressor name {cls.name!r} is already registered by {REGISTRY[cls.name].__name__}")
    REGISTRY[cls.name] = cls
    return cls


class OperatorRegressor(RegressorMixin, BaseEstimator, ABC):
    """Abstract tree-ensemble regressor of operator time (seconds).

    Subclasses define ``name``, ``__init__`` (storing parameters only), :meth:`_fit_z`,
    :meth:`_predict_z` and :meth:`_interval_z` (abstract: a subclass missing one cannot be instantiated).
    """

    name = "abstract"

    # -- contract --------------------------------------------------------------------------------
    def fit(self, X, y):
        """Learn from features ``X`` [n, F] and measured times ``y`` [n] (seconds, > 0); returns self."""
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        if np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise ValueError("times y must be finite and > 0 seconds")
        z = np.log(y) - np.log(self._ref(X))
        self.feature_ranges_ = np.stack([X.min(axis=0), X.max(axis=0)], axis=1)
        self._fit_z(X.astype(np.float32), z)
        return self

    def predict(self, X):
        """Predicted times in seconds, one per row of ``X``."""
        X = self._check(X)
        return np.exp(self._predict_z(X.astype(np.float32))) * self._ref(X)

    def predict_interval(self, X, q=(0.1, 0.9)):
        """(low, high) seconds: the ``q`` quantiles of the ensemble, widened to bracket :meth:`predict`."""
        X = self._check(X)
        X32 = X.astype(np.float32)
        mid = self._predict_z(X32)
        lo, hi = self._interval_z(X32, tuple(q))
        ref = self._ref(X)
        return np.exp(np.minimum(lo, mid)) * ref, np.exp(np.maximum(hi, mid)) * ref

    def predict_with_interval(self, X, q=(0.1, 0.9)):
        """(point, low, high) in one pass (the cost model's hot path)."""
        X = self._check(X)
        X32 = X.astype(np.float32)
        mid = self._predict_z(X32)
        lo, hi = self._interval_z(X32, tuple(q))
        ref = self._ref(X)
        return np.exp(mid) * ref, np.exp(np.minimum(lo, mid)) * ref, np.exp(np.maximum(hi, mid)) * ref

    # -- helpers ---------------------------------------------------------------------------------
    def _check(self, X) -> np.ndarray:
        check_is_fitted(self, "booster_")
        return validate_data(self, X, dtype=np.float64, reset=False)

    def _ref(self, X: np.ndarray) -> np.ndarray:
        """Reference time per row: the roofline column (target 'ratio') or 1 (target 'time')."""
        if self.target == "time":
            return np.ones(X.shape[0])
        if self.target != "ratio":
            raise ValueError(f"target must be 'ratio' or 'time', got {self.target!r}")
        ref = X[:, self.ref_col]
        if np.any(~np.isfinite(ref)) or np.any(ref <= 0):
            raise ValueError(f"column {self.ref_col} (roofline time) must be finite and > 0 for target='ratio'")
        return ref

    @abstractmethod
    def _fit_z(self, X: np.ndarray, z: np.ndarray) -> None:
        """Fit the ensemble to the log-space target ``z``; set ``booster_`` (and any extra state)."""

    @abstractmethod
    def _predict_z(self, X: np.ndarray) -> np.ndarray:
        """Point prediction in log space."""

    @abstractmethod
    def _interval_z(self, X: np.ndarray, q: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Quantiles ``q`` of the prediction in log space."""

    def _extra_boosters(self) -> dict:
        """Further xgboost boosters to persist, by file-name infix (e.g. {'interval': booster})."""
        return {}

    def _set_extra_boosters(self, boosters: dict) -> None:
        """Restore what :meth:`_extra_boosters` returned."""

    def _after_load(self) -> None:
        """Rebuild derived (non-persisted) state after :func:`costmodel.cost.regressors.loading.load_regressor`."""

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | Path, meta: dict | None = None) -> Path:
        """Write ``path`` (xgboost JSON), extra boosters and the ``.meta.json`` sidecar, atomically."""
        check_is_fitted(self, "booster_")
        path = Path(path)
        if path.suffix != ".json":
            raise ValueError(f"artifact path must end in .json, got {path}")
        raw = bytes(self.booster_.save_raw("json"))
        atomic_write_bytes(path, raw)
        hashes = {path.name: sha256_hex(raw)}
        extra_files = {}
        for infix, booster in self._extra_boosters().items():
            p = path.with_name(path.name[: -len(".json")] + f".{infix}.json")
            raw = bytes(booster.save_raw("json"))
            atomic_write_bytes(p, raw)
            extra_files[infix] = p.name
            hashes[p.name] = sha256_hex(raw)
        side = {
            "format": ARTIFACT_FORMAT,
            "estimator": self.name,
            "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(self.get_params().items())},
            "n_features_in": int(self.n_features_in_),
            "feature_ranges": self.feature_ranges_.tolist(),
            "model_file": path.name,
            "extra_files": extra_files,
            # written last: a crash before it leaves model files that the old sidecar's hashes refuse
            "file_sha256": hashes,
            **(meta or {}),
        }
        atomic_write_bytes(sidecar_path(path), dumps(side))
        return path
