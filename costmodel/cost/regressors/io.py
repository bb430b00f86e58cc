"""Artifact file helpers with no heavy imports (no scikit-learn, no xgboost): used by the fit
pipeline and by the prediction-time loader alike."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_bytes  # noqa: F401 (re-exported: the one implementation)


def sidecar_path(path: str | Path) -> Path:
    """``gemm.fwd.json`` -> ``gemm.fwd.meta.json``."""
    p = Path(path)
    return p.with_name(p.name[: -len(".json")] + ".meta.json" if p.name.endswith(".json") else p.name + ".meta.json")


def dumps(obj) -> bytes:
    """Canonical JSON bytes (sorted keys) so equal content gives equal files."""
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()




def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_model_file(path: Path, raw: bytes, expected: dict | None) -> str:
    """SHA-256 of a model file's bytes; a PlannerError when the sidecar's ``file_sha256`` names another
    (a crash between writing the model file and its sidecar, or an edit). Returns the digest."""
    digest = sha256_hex(raw)
    want = (expected or {}).get(Path(path).name)
    if want is not None and digest != want:
        raise PlannerError(f"model file {path} does not match its sidecar's file_sha256 (an interrupted or "
                           "partial write, or an edit); re-run `planner fit`")
    return digest
