"""Where planner finds the shared public data (never copied into the project).

Order: ``$PLANNER_DATA_DIR`` (the ``data`` folder itself, or a ``shared`` folder that holds
``data/``), then ``../shared`` beside the repository checkout, then ``../shared`` beside the current
directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from costmodel.core.errors import PlannerError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def _normalize(p: Path) -> Path | None:
    if (p / "data").is_dir() and not (p / "hardware").is_dir():
        p = p / "data"
    return p if p.is_dir() else None


def data_dir() -> Path | None:
    """The ``shared/data`` folder, or None when it cannot be found."""
    env = os.environ.get("PLANNER_DATA_DIR")
    if env:
        return _normalize(Path(env).expanduser())
    for base in (REPO_ROOT.parent / "shared", Path.cwd().parent / "shared", Path.cwd() / "shared"):
        found = _normalize(base)
        if found is not None:
            return found
    return None


def validation_dir() -> Path | None:
    """The ``shared/validation`` folder (published end-to-end runs), or None."""
    d = data_dir()
    if d is None:
        return None
    v = d.parent / "validation"
    return v if v.is_dir() else None


def require_data_dir() -> Path:
    d = data_dir()
    if d is None:
        raise PlannerError("shared data folder not found: set PLANNER_DATA_DIR to the folder that holds "
                           "hardware/, aiconfigurator/, estimate-train-time/ (usually ../shared/data).")
    return d
