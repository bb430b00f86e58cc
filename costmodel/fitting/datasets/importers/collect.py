"""Every registered importer on the data folder -> one dataset per (kind, gpu); writing them as CSV + sidecar."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from costmodel.core.paths import require_data_dir
from costmodel.fitting.datasets.importers.builder import key_order, merge
from costmodel.fitting.datasets.importers.registry import importers
from costmodel.fitting.datasets.schema import Dataset, save_dataset


def import_all(data_dir: Path | None = None, progress: bool = False) -> dict[tuple[str, str], Dataset]:
    """Run every registered importer on ``data_dir`` (default: costmodel.core.paths) -> {(kind, gpu): Dataset}.

    Datasets of the same (kind, gpu) from several importers are concatenated in registry order.
    """
    data = Path(data_dir) if data_dir is not None else require_data_dir()
    data = data.resolve()
    found: dict[tuple[str, str], list[Dataset]] = {}
    for name, fn in importers().items():
        t0 = time.perf_counter()
        out = fn(data)
        for ds in out:
            found.setdefault((ds.kind, ds.gpu), []).append(ds)
        if progress:
            print(f"imported {name}: {len(out)} datasets, {sum(len(d) for d in out)} rows "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return {key: merge(found[key]) for key in sorted(found, key=key_order)}


def save_all(datasets: dict[tuple[str, str], Dataset], out_dir: Path) -> list[Path]:
    """Write each dataset as ``out_dir/<gpu>/<kind>.csv`` (+ sidecar)."""
    return [save_dataset(ds, Path(out_dir) / gpu / f"{kind}.csv") for (kind, gpu), ds in datasets.items()]
