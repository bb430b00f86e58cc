"""The importer registry: each source folder of ``shared/data`` has one importer, registered by name.

An importer takes the data folder and returns its :class:`~costmodel.fitting.datasets.schema.Dataset` list (one per
(operator kind, GPU)). :func:`costmodel.fitting.datasets.importers.collect.import_all` runs them in registration order,
which is the order :mod:`costmodel.fitting.datasets.importers` imports the per-source modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.schema import Dataset

Importer = Callable[[Path], list[Dataset]]
_REGISTRY: dict[str, Importer] = {}


def register(name: str) -> Callable[[Importer], Importer]:
    """Decorator adding an importer to the registry under ``name`` (a folder of the data dir)."""
    def deco(fn: Importer) -> Importer:
        if name in _REGISTRY:
            raise PlannerError(f"dataset importer {name!r} is registered twice; give the new one another name")
        _REGISTRY[name] = fn
        return fn
    return deco


def importers() -> dict[str, Importer]:
    """Registry of importers by source name, in import order."""
    return dict(_REGISTRY)


def source_root(data: Path, folder: str) -> Path:
    """``data/folder``, or a one-line error when the shared data has no such source."""
    root = data / folder
    if not root.is_dir():
        raise PlannerError(f"no {folder} folder under {data}; point PLANNER_DATA_DIR at shared/data")
    return root
