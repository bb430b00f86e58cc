"""Artifact layout of fitted regressors (no pickle anywhere).

``<models>/<gpu>/<kind>.<direction>.json``  xgboost JSON model (``Booster.save_raw('json')``)
``<models>/<gpu>/<kind>.<direction>.interval.json``  quantile booster (boosted family only)
``<models>/<gpu>/<kind>.<direction>.meta.json``  sidecar: estimator + params, feature names and
    ranges, device constants, CV metrics, data sources with SHA-256, library versions, seed
``<models>/index.json``  what exists, what was skipped and why, derivations, checks

No dates are written, so the same data and library versions give identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.cost.regressors.io import atomic_write_bytes, dumps

SHIPPED_MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
INDEX = "index.json"


def artifact_path(models_dir: Path, gpu: str, kind: str, direction: str) -> Path:
    return Path(models_dir) / gpu / f"{kind}.{direction}.json"


def library_versions() -> dict:
    import sklearn  # deferred: slow to import; this module is on the prediction path (read_index)
    import xgboost  # deferred: slow to import; this module is on the prediction path (read_index)

    return {"numpy": np.__version__, "scikit-learn": sklearn.__version__, "xgboost": xgboost.__version__}


def read_index(models_dir: Path) -> dict:
    """The index of a models folder ({} when absent); a corrupted index is a PlannerError."""
    p = Path(models_dir) / INDEX
    if not p.exists():
        return {}
    try:
        idx = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlannerError(f"model index {p} is corrupted ({exc.__class__.__name__}); re-run `planner fit`") from None
    if not isinstance(idx, dict):
        raise PlannerError(f"model index {p} is not a JSON object; re-run `planner fit`")
    return idx


def write_index(models_dir: Path, index: dict) -> Path:
    p = Path(models_dir) / INDEX
    atomic_write_bytes(p, dumps(index))
    return p
