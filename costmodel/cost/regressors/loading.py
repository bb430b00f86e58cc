"""Reading a fitted regressor back: :func:`load_regressor`, the counterpart of :meth:`OperatorRegressor.save`.

It sits above the implementations: it imports them, so that each has registered itself in
:data:`~costmodel.cost.regressors.base.REGISTRY` before a sidecar's estimator name is looked up there
(:mod:`.base`, which the implementations import, cannot import them back).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.cost.regressors.base import ARTIFACT_FORMAT, REGISTRY, OperatorRegressor
from costmodel.cost.regressors.boosted import BoostedRegressor
from costmodel.cost.regressors.forest import ForestRegressor
from costmodel.cost.regressors.io import check_model_file, sidecar_path

IMPLEMENTATIONS = (ForestRegressor, BoostedRegressor)
"""Every implementation (importing them registers them)."""


def load_regressor(path: str | Path) -> OperatorRegressor:
    """Read an artifact written by :meth:`OperatorRegressor.save`; any problem is a one-line PlannerError."""
    import xgboost as xgb  # deferred: slow to import; importing this module stays as cheap as the implementations

    path = Path(path)
    side_p = sidecar_path(path)
    try:
        side = json.loads(side_p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlannerError(f"model artifact {side_p} is missing; re-run `planner fit`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlannerError(f"model sidecar {side_p} is corrupted ({exc.__class__.__name__}); "
                           "re-run `planner fit`") from None
    if not isinstance(side, dict) or side.get("format") != ARTIFACT_FORMAT:
        fmt = side.get("format") if isinstance(side, dict) else None
        raise PlannerError(f"model sidecar {side_p} has format {fmt!r}, "
                           f"expected {ARTIFACT_FORMAT}; re-run `planner fit`")
    cls = REGISTRY.get(str(side.get("estimator")))
    if cls is None:
        raise PlannerError(f"model sidecar {side_p} names unknown estimator {side.get('estimator')!r}; "
                           f"known: {', '.join(sorted(REGISTRY))}")

    hashes = side.get("file_sha256") if isinstance(side.get("file_sha256"), dict) else {}

    def booster(p: Path):
        try:
            raw = p.read_bytes()
            check_model_file(p, raw, hashes)
            b = xgb.Booster()
            b.load_model(bytearray(raw))
            return b
        except FileNotFoundError:
            raise PlannerError(f"model file {p} is missing; re-run `planner fit`") from None
        except (xgb.core.XGBoostError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
            raise PlannerError(f"model file {p} is corrupted or truncated ({first[:120]}); "
                               "re-run `planner fit`") from None

    try:
        params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in side["params"].items()}
        est = cls(**params)
        est.booster_ = booster(path)
        est.n_features_in_ = int(side["n_features_in"])
        est.feature_ranges_ = np.asarray(side["feature_ranges"], dtype=float).reshape(est.n_features_in_, 2)
        est._set_extra_boosters({k: booster(path.with_name(v)) for k, v in side.get("extra_files", {}).items()})
        if est.booster_.num_features() != est.n_features_in_:
            raise PlannerError(f"model file {path} has {est.booster_.num_features()} features but its sidecar "
                               f"says {est.n_features_in_}; re-run `planner fit`")
        est._after_load()
    except PlannerError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise PlannerError(f"model sidecar {side_p} is incomplete ({exc.__class__.__name__}: {exc}); "
                           "re-run `planner fit`") from None
    est.meta_ = side
    return est
