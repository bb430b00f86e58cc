"""The one dataset schema: a CSV of samples plus a sidecar JSON of metadata.

``NAME.csv`` columns (in this order):

* ``kind``       operator kind (a key of :data:`costmodel.core.kinds.FEATURES`)
* ``direction``  ``fwd`` or ``bwd``
* ``dtype``      ``bf16``, ``fp16``, ``fp8`` or ``fp32``
* one column per feature of the kind, named as in ``FEATURES[kind]`` (a file holds one kind)
* ``time_s``     median time of one call, seconds
* ``spread_s``   spread of the repeats (p90 - p10, or the source's std), seconds; empty when unknown
* ``repeats``    measured repeats behind the median; empty when unknown
* ``source_row`` row index in the source file (importers) or sample index (harness)

``NAME.json`` sidecar: ``schema_version``, ``kind``, ``gpu`` (catalogue key or ``cpu``),
``units`` (time: s, bytes: B), ``fingerprint`` (device name, driver, CUDA / torch / NCCL versions, CPU
model, threads; whatever is known), ``sources`` (list of {path, sha256, rows_in, rows_kept,
filters}), ``notes``.

Writes are atomic (temporary file + rename), so a crash never leaves a half-written dataset.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from costmodel.core.kinds import FEATURES

SCHEMA_VERSION = 1
BASE_COLUMNS = ("kind", "direction", "dtype")
TAIL_COLUMNS = ("time_s", "spread_s", "repeats", "source_row")
DIRECTIONS = ("fwd", "bwd")
DTYPES = ("bf16", "fp16", "fp8", "fp32")


@dataclass
class Dataset:
    """Samples of one operator kind on one device."""

    kind: str
    """Operator kind (key of FEATURES)."""
    gpu: str
    """Catalogue GPU key, or 'cpu'."""
    features: np.ndarray
    """[n, len(FEATURES[kind])] float feature matrix."""
    direction: np.ndarray
    """[n] array of 'fwd' / 'bwd'."""
    dtype: np.ndarray
    """[n] array of dtype strings."""
    time_s: np.ndarray
    """[n] median time per call, seconds."""
    spread_s: np.ndarray = None  # type: ignore[assignment]  # None = unknown; __post_init__ fills it
    """[n] spread of repeats in seconds (NaN when unknown)."""
    repeats: np.ndarray = None  # type: ignore[assignment]  # None = unknown; __post_init__ fills it
    """[n] number of repeats (NaN when unknown)."""
    source_row: np.ndarray = None  # type: ignore[assignment]  # None = unknown; __post_init__ fills it
    """[n] row index in the source."""
    meta: dict = field(default_factory=dict)
    """Sidecar metadata (fingerprint, sources, notes)."""

    def __post_init__(self) -> None:
        n = len(self.time_s)
        if self.kind not in FEATURES:
            raise PlannerError(f"unknown operator kind {self.kind!r}; allowed: {', '.join(FEATURES)}")
        self.features = np.asarray(self.features, dtype=float).reshape(n, len(FEATURES[self.kind]))
        self.direction = np.asarray(self.direction, dtype=object)
        self.dtype = np.asarray(self.dtype, dtype=object)
        self.time_s = np.asarray(self.time_s, dtype=float)
        nan = np.full(n, np.nan)
        self.spread_s = nan.copy() if self.spread_s is None else np.asarray(self.spread_s, dtype=float)
        self.repeats = nan.copy() if self.repeats is None else np.asarray(self.repeats, dtype=float)
        self.source_row = np.arange(n) if self.source_row is None else np.asarray(self.source_row, dtype=int)

    def __len__(self) -> int:
        return len(self.time_s)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURES[self.kind]

    def select(self, mask: np.ndarray) -> "Dataset":
        return Dataset(self.kind, self.gpu, self.features[mask], self.direction[mask], self.dtype[mask],
                       self.time_s[mask], self.spread_s[mask], self.repeats[mask], self.source_row[mask],
                       dict(self.meta))


def _atomic_write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def save_dataset(ds: Dataset, path: str | Path) -> Path:
    """Write ``path`` (.csv) and its sidecar (.json) atomically; returns the CSV path."""
    path = Path(path).with_suffix(".csv")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*BASE_COLUMNS, *ds.feature_names, *TAIL_COLUMNS])
    for i in range(len(ds)):
        w.writerow([ds.kind, ds.direction[i], ds.dtype[i], *(_fmt(v) for v in ds.features[i]),
                    repr(float(ds.time_s[i])), _fmt(ds.spread_s[i]), _fmt(ds.repeats[i]), int(ds.source_row[i])])
    text = buf.getvalue()
    # the sidecar names the CSV's hash: a crash between the two atomic writes leaves a pair that
    # load_dataset refuses instead of mixing a new table with old metadata
    meta = {"units": {"time": "s", "bytes": "B"}, **ds.meta, "schema_version": SCHEMA_VERSION, "kind": ds.kind,
            "gpu": ds.gpu, "rows": len(ds), "csv_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    _atomic_write(path, text)
    _atomic_write(path.with_suffix(".json"), json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return path


def load_dataset(path: str | Path) -> Dataset:
    """Read a dataset; every problem is a PlannerError naming the file, row and column."""
    path = Path(path).with_suffix(".csv")
    side = path.with_suffix(".json")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlannerError(f"dataset {path} has no sidecar {side.name}; write datasets with save_dataset") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PlannerError(f"dataset sidecar {side} is not valid JSON ({exc}); regenerate it") from None
    if not isinstance(meta, dict):
        raise PlannerError(f"dataset sidecar {side} must be a JSON object")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise PlannerError(f"dataset {path} has schema_version {meta.get('schema_version')!r}; this planner reads "
                           f"version {SCHEMA_VERSION}: regenerate it with this version")
    kind = meta.get("kind")
    if not isinstance(kind, str) or kind not in FEATURES:
        raise PlannerError(f"dataset sidecar {side}: kind {kind!r} is not one of {', '.join(FEATURES)}")
    gpu = meta.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise PlannerError(f"dataset sidecar {side}: field 'gpu' must be a non-empty string")
    expected = [*BASE_COLUMNS, *FEATURES[kind], *TAIL_COLUMNS]
    want = meta.get("csv_sha256")
    if want is not None:
        try:
            got = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except FileNotFoundError:
            raise PlannerError(f"dataset {path} does not exist") from None
        if got != want:
            raise PlannerError(f"dataset {path} does not match its sidecar {side} (csv_sha256 differs: an "
                               "interrupted or partial write, or an edit); re-run the command that wrote it")
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        raise PlannerError(f"dataset {path} does not exist") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlannerError(f"dataset {path} is not a readable CSV ({exc})") from None
    if not rows or rows[0] != expected:
        raise PlannerError(f"dataset {path}: header {rows[0] if rows else '(empty file)'} != expected {expected}")
    nf = len(FEATURES[kind])
    feats, dirs, dts, times, spreads, reps, srows = [], [], [], [], [], [], []
    for lineno, row in enumerate(rows[1:], 2):
        if len(row) != len(expected):
            raise PlannerError(f"dataset {path} line {lineno}: {len(row)} fields, expected {len(expected)} "
                               "(truncated or corrupted file; regenerate it)")
        if row[0] != kind:
            raise PlannerError(f"dataset {path} line {lineno}: kind {row[0]!r} != {kind!r}")
        if row[1] not in DIRECTIONS:
            raise PlannerError(f"dataset {path} line {lineno}: direction {row[1]!r} not in {DIRECTIONS}")
        if row[2] not in DTYPES:
            raise PlannerError(f"dataset {path} line {lineno}: dtype {row[2]!r} not in {DTYPES}")
        try:
            f = [float(x) for x in row[3:3 + nf]]
            t = float(row[3 + nf])
            sp = float(row[4 + nf]) if row[4 + nf] else math.nan
            rp = float(row[5 + nf]) if row[5 + nf] else math.nan
            sr = int(row[6 + nf])
        except ValueError as exc:
            raise PlannerError(f"dataset {path} line {lineno}: non-numeric value ({exc})") from None
        if not all(math.isfinite(x) and x >= 0 for x in f):
            raise PlannerError(f"dataset {path} line {lineno}: features must be finite and >= 0, got {f}")
        if not (math.isfinite(t) and t > 0):
            raise PlannerError(f"dataset {path} line {lineno}: time_s must be finite and > 0, got {t}")
        feats.append(f)
        dirs.append(row[1])
        dts.append(row[2])
        times.append(t)
        spreads.append(sp)
        reps.append(rp)
        srows.append(sr)
    if len(times) != meta.get("rows", len(times)):
        raise PlannerError(f"dataset {path} has {len(times)} rows but its sidecar says {meta.get('rows')} "
                           "(truncated file; regenerate it)")
    return Dataset(kind, gpu, np.array(feats, dtype=float).reshape(-1, nf), np.array(dirs, dtype=object),
                   np.array(dts, dtype=object), np.array(times), np.array(spreads), np.array(reps),
                   np.array(srows, dtype=int), meta)
