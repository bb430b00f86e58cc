"""Building datasets: an importer's rows per (kind, gpu) with their source records; merge and row roles."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import FEATURES
from costmodel.fitting.datasets.importers.table import Table, sha256
from costmodel.fitting.datasets.schema import Dataset
from costmodel.graph.kernel_basis import OTHER_BASIS_ROLE

ROLES = ("train", "spot_check", "composite_bwd", OTHER_BASIS_ROLE)
"""``train`` (fit on it), ``spot_check`` (an independent hold-out: LLMCompass), ``composite_bwd``
(estimate-train-time GEMM backward = dgrad + wgrad of the forward shape, for checks only), ``other_basis``
(a kernel other than the fused one planner's costs stand for, costmodel.graph.kernel_basis: kept, never trained on)."""


class Builder:
    """Collects the rows of one importer, per (kind, gpu), with their source records."""

    def __init__(self, importer: str):
        self.importer = importer
        self.parts: dict[tuple[str, str], list[dict]] = {}
        self.notes: dict[tuple[str, str], list[str]] = {}

    def note(self, keys, text: str) -> None:
        for key in keys:
            lst = self.notes.setdefault(key, [])
            if text not in lst:
                lst.append(text)

    def add(self, t: Table, kind: str, gpu: str, direction: str, dtype: str, feats: dict, time_s: np.ndarray, *,
            column: str, fingerprint: dict, role: str = "train", filters: Sequence[tuple] = (),
            select: tuple[str, np.ndarray] | None = None, spread_s=None, repeats=None) -> None:
        """Add the rows of ``t`` that ``select`` picks and ``filters`` keep as samples of ``kind`` on ``gpu``.

        ``filters``: (name, keep mask, dropped count) as returned by costmodel.fitting.datasets.filters; the sidecar
        records, per filter, the rows it drops among those still kept. ``select``: (description, mask) when
        one file holds several operators (a mapping, not a filter).
        """
        if set(feats) != set(FEATURES[kind]):
            raise AssertionError(f"importer bug: {kind} features {sorted(feats)} != {FEATURES[kind]}")
        if role not in ROLES:
            raise AssertionError(f"importer bug: role {role!r}")
        n = t.n
        keep = np.ones(n, dtype=bool) if select is None else np.asarray(select[1], dtype=bool).copy()
        selected = int(keep.sum())
        dropped = []
        for name, mask, _ in filters:
            dropped.append({"name": name, "dropped": int((keep & ~mask).sum())})
            keep &= mask
        idx = np.nonzero(keep)[0]
        cols = []
        for name in FEATURES[kind]:
            v = np.broadcast_to(np.asarray(feats[name], dtype=float), (n,))[idx]
            bad = ~(np.isfinite(v) & (v >= 0) & (v == np.round(v)))
            if bad.any():
                i = int(idx[np.argmax(bad)])
                raise PlannerError(f"source file {t.rel} line {i + 2}: the {kind} feature {name!r} derived from it is "
                                   f"{v[np.argmax(bad)]!r}, not a non-negative integer; its shapes do not fit the "
                                   "mapping in costmodel/fitting/datasets/README.md")
            cols.append(v)
        ts = np.asarray(time_s, dtype=float)[idx]
        bad = ~(np.isfinite(ts) & (ts > 0))
        if bad.any():
            i = int(idx[np.argmax(bad)])
            raise PlannerError(f"source file {t.rel} line {i + 2}, column {column!r}: time {ts[np.argmax(bad)]!r} is "
                               "not a positive number; restore the file or add a documented filter")
        nan = np.full(n, np.nan)
        source = {"importer": self.importer, "path": t.rel, "sha256": sha256(t.path), "column": column,
                  "direction": direction, "dtype": dtype, "role": role, "rows_in": n, "rows_kept": int(len(idx)),
                  "filters": dropped, "fingerprint": fingerprint}
        if select is not None:
            source.update(selection=select[0], rows_selected=selected)
        self.parts.setdefault((kind, gpu), []).append({
            "features": np.column_stack(cols) if cols else np.zeros((len(idx), 0)),
            "time_s": ts,
            "spread_s": (nan if spread_s is None else np.asarray(spread_s, dtype=float))[idx],
            "repeats": np.broadcast_to(np.asarray(nan if repeats is None else repeats, dtype=float), (n,))[idx],
            "source_row": idx, "direction": direction, "dtype": dtype, "source": source})

    def datasets(self) -> list[Dataset]:
        out: dict[tuple[str, str], Dataset] = {}
        empty: list[tuple[tuple[str, str], dict]] = []
        for key in sorted(self.parts, key=key_order):
            parts = self.parts[key]
            if sum(p["source"]["rows_kept"] for p in parts) == 0:
                empty += [(key, p["source"]) for p in parts]
                continue
            out[key] = _concat(key, parts, self.notes.get(key, []))
        # a (kind, gpu) whose rows were all filtered has no dataset: record its sources on the datasets read
        # from the same file, else on this importer's other datasets of that GPU, else on all of its datasets
        for (kind, gpu), src in empty:
            same_gpu = [k for k in out if k[1] == gpu]
            hosts = [k for k in same_gpu if any(s["path"] == src["path"] for s in out[k].meta["sources"])]
            for host in hosts or same_gpu or list(out):
                ds = out[host]
                ds.meta["sources"].append({**src, "kind": kind, "dataset_rows": [len(ds), len(ds)]})
                ds.meta["notes"].append(f"no {kind} dataset for {gpu}: all {src['rows_in']} rows of {src['path']} "
                                        f"column {src['column']!r} dropped by "
                                        f"{', '.join(f['name'] for f in src['filters'])}")
        return list(out.values())


def key_order(key: tuple[str, str]) -> tuple:
    return (list(FEATURES).index(key[0]), key[1])


def _concat(key: tuple[str, str], parts: list[dict], notes: list[str]) -> Dataset:
    kind, gpu = key
    nf = len(FEATURES[kind])
    sources, start = [], 0
    for p in parts:
        stop = start + len(p["time_s"])
        sources.append({**p["source"], "dataset_rows": [start, stop]})
        start = stop
    cat = np.concatenate
    ds = Dataset(kind, gpu, cat([p["features"].reshape(-1, nf) for p in parts]),
                 cat([np.full(len(p["time_s"]), p["direction"], dtype=object) for p in parts]),
                 cat([np.full(len(p["time_s"]), p["dtype"], dtype=object) for p in parts]),
                 cat([p["time_s"] for p in parts]), cat([p["spread_s"] for p in parts]),
                 cat([p["repeats"] for p in parts]), cat([p["source_row"] for p in parts]),
                 {"sources": sources, "notes": list(notes)})
    _finish_meta(ds)
    return ds


def _finish_meta(ds: Dataset) -> None:
    srcs = ds.meta["sources"]
    ds.meta["fingerprint"] = {
        "devices": sorted({str(s["fingerprint"].get("device")) for s in srcs}),
        "importers": sorted({s["importer"] for s in srcs}),
        "details": "per source: sources[i].fingerprint"}
    ds.meta["duplicate_shape_rows"] = duplicate_shape_rows(ds)


def duplicate_shape_rows(ds: Dataset) -> int:
    """Rows whose (direction, dtype, features) also occur in another row of ``ds``."""
    if len(ds) == 0:
        return 0
    dt = np.zeros(len(ds))
    for i, name in enumerate(sorted(set(ds.dtype.tolist()))):
        dt[ds.dtype == name] = i
    codes = np.column_stack([ds.direction == "bwd", dt, ds.features]).astype(float)
    srt = codes[np.lexsort(codes.T[::-1])]
    new = np.ones(len(srt), dtype=bool)
    new[1:] = np.any(srt[1:] != srt[:-1], axis=1)
    counts = np.bincount(np.cumsum(new))
    return int(counts[counts > 1].sum())


def merge(datasets: Sequence[Dataset]) -> Dataset:
    """Concatenate datasets of one (kind, gpu), keeping every source record (row ranges shifted)."""
    first = datasets[0]
    if len(datasets) == 1:
        return first
    sources, notes, off = [], [], 0
    for ds in datasets:
        if (ds.kind, ds.gpu) != (first.kind, first.gpu):
            raise AssertionError("merge of different (kind, gpu)")
        sources += [{**s, "dataset_rows": [s["dataset_rows"][0] + off, s["dataset_rows"][1] + off]}
                    for s in ds.meta["sources"]]
        notes += [n for n in ds.meta["notes"] if n not in notes]
        off += len(ds)
    cat = np.concatenate
    out = Dataset(first.kind, first.gpu, cat([d.features for d in datasets]), cat([d.direction for d in datasets]),
                  cat([d.dtype for d in datasets]), cat([d.time_s for d in datasets]),
                  cat([d.spread_s for d in datasets]), cat([d.repeats for d in datasets]),
                  cat([d.source_row for d in datasets]), {"sources": sources, "notes": notes})
    _finish_meta(out)
    return out


def source_index(ds: Dataset) -> np.ndarray:
    """Per row, the index into ``ds.meta['sources']`` of the source it came from (-1 if none)."""
    idx = np.full(len(ds), -1, dtype=int)
    for i, s in enumerate(ds.meta.get("sources", [])):
        a, b = s["dataset_rows"]
        idx[a:b] = i
    return idx


def role_mask(ds: Dataset, role: str = "train") -> np.ndarray:
    """Rows whose source has ``role`` (``train``, ``spot_check`` or ``composite_bwd``)."""
    if role not in ROLES:
        raise PlannerError(f"unknown dataset role {role!r}; use one of {', '.join(ROLES)}")
    roles = np.array([s["role"] for s in ds.meta.get("sources", [])] + [""], dtype=object)
    return roles[source_index(ds)] == role

