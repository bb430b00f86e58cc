"""Artifact file helpers with no heavy imports (no scikit-learn, no xgboost): used by the fit
pipeline and by the prediction-time loader alike."""

from __future__ import annotations

import json
from pathlib import Path


def sidecar_path(path: str | Path) -> Path:
    """``gemm.fwd.json`` -> ``gemm.fwd.meta.json``."""
    p = Path(path)
    return p.with_name(p.name[: -len(".json")] + ".meta.json" if p.name.endswith(".json") else p.name + ".meta.json")


from planner.fileio import atomic_write_bytes  # noqa: E402,F401 (the one implementation)


def dumps(obj) -> bytes:
    """Canonical JSON bytes (sorted keys) so equal content gives equal files."""
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


