"""Artifact file helpers with no heavy imports (no scikit-learn, no xgboost): used by the fit
pipeline and by the prediction-time loader alike."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def sidecar_path(path: str | Path) -> Path:
    """``gemm.fwd.json`` -> ``gemm.fwd.meta.json``."""
    p = Path(path)
    return p.with_name(p.name[: -len(".json")] + ".meta.json" if p.name.endswith(".json") else p.name + ".meta.json")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file + rename (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dumps(obj) -> bytes:
    """Canonical JSON bytes (sorted keys) so equal content gives equal files."""
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


