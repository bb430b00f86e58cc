"""``python -m costmodel.fitting.datasets.importers [--data-dir D] [--out DIR]``: import shared/data, print rows and
filter drops per dataset, optionally write every dataset as ``DIR/<gpu>/<kind>.csv`` + sidecar."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.importers.collect import import_all, save_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Import shared/data into the operator dataset schema.")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="folder to write <gpu>/<kind>.csv + .json into")
    args = ap.parse_args(argv)
    try:
        datasets = import_all(args.data_dir, progress=True)
        if args.out is not None:
            save_all(datasets, args.out)
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for (kind, gpu), ds in datasets.items():
        drops = [f"{f['name']}: {f['dropped']}" for s in ds.meta["sources"] for f in s["filters"] if f["dropped"]]
        print(f"{kind:15s} {gpu:10s} {len(ds):7d} rows" + (f"   dropped {', '.join(drops)}" if drops else ""))
    return 0
