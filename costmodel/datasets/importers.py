"""Importers: the public measurements in ``shared/data`` -> the :class:`Dataset` schema.

``import_all()`` returns one :class:`Dataset` per (operator kind, GPU) with forward and backward rows
together. Every mapping (source column -> operator kind, features, units) is documented in
``costmodel/datasets/README.md``; the broken subsets named in the PROVENANCE.md files are dropped by
the filters of :mod:`costmodel.datasets.filters` and counted in the sidecar.

Sidecar (``Dataset.meta``):

* ``sources``: one entry per (source file, source column): ``importer``, ``path`` (relative to the
  data folder), ``sha256``, ``column``, ``direction``, ``dtype``, ``role``, ``rows_in``, ``rows_kept``,
  ``filters`` ([{name, dropped}]), ``fingerprint`` and ``dataset_rows`` ([start, stop) of its rows in
  this dataset, in this order).
* ``fingerprint``: device strings and importers behind the dataset (details per source).
* ``notes``: caveats, skipped files and why.
* ``duplicate_shape_rows``: rows whose (direction, dtype, features) also occur in another row.

Roles: ``train`` (fit on it), ``spot_check`` (an independent hold-out: LLMCompass), ``composite_bwd``
(estimate-train-time GEMM backward = dgrad + wgrad of the forward shape, for checks only).

Run ``python -m costmodel.datasets.importers --out DIR`` to write every dataset as CSV + sidecar.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from costmodel.datasets import filters as F
from costmodel.datasets.schema import Dataset, save_dataset
from costmodel.core.kinds import FEATURES
from costmodel.core.errors import PlannerError

Importer = Callable[[Path], list[Dataset]]
ROLES = ("train", "spot_check", "composite_bwd")
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


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

_SHA: dict[Path, str] = {}


def sha256(path: Path) -> str:
    path = Path(path).resolve()
    if path not in _SHA:
        _SHA[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _SHA[path]


class Table:
    """A source CSV whose header was checked: columns by name, rows in file order."""

    def __init__(self, path: Path, rel: str, header: list[str], rows: list[list[str]]):
        self.path, self.rel, self.header = path, rel, header
        self.n = len(rows)
        self._cols = {name: list(col) for name, col in zip(header, zip(*rows))} if rows else \
            {name: [] for name in header}

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def text(self, name: str) -> np.ndarray:
        return np.array(self._cols[name], dtype=object)

    def num(self, name: str) -> np.ndarray:
        col = self._cols[name]
        try:
            return np.array(col, dtype=float)
        except ValueError:
            for i, v in enumerate(col):
                try:
                    float(v)
                except ValueError:
                    raise PlannerError(f"{self.rel} line {i + 2}, column {name!r}: {v!r} is not a number; "
                                       "restore the original file from its source") from None
            raise

    def __getitem__(self, name: str) -> np.ndarray:  # the filters' table interface
        col = self._cols[name]
        try:
            return np.array(col, dtype=float)
        except ValueError:
            return np.array(col, dtype=object)

    def keys(self):
        return self._cols.keys()

    def values(self):
        return (self[k] for k in self._cols)


def read_table(data: Path, path: Path, expected: Sequence[str] | Sequence[Sequence[str]],
               strip: bool = False) -> Table:
    """Read ``path`` and check its header against ``expected`` (one header, or a list of allowed headers).

    A header that differs raises a PlannerError naming the file and the first differing column.
    """
    rel = str(path.relative_to(data)) if path.is_relative_to(data) else str(path)
    allowed = [list(expected)] if isinstance(expected[0], str) else [list(e) for e in expected]
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = [r for r in csv.reader(fh, skipinitialspace=strip) if r]
    except FileNotFoundError:
        raise PlannerError(f"source file {rel} does not exist under {data}; restore it from its source") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlannerError(f"source file {rel} is not a readable CSV ({exc}); restore it from its source") from None
    if strip:
        rows = [[c.strip() for c in r] for r in rows]
    if not rows:
        raise PlannerError(f"source file {rel} is empty; restore it from its source")
    header, body = rows[0], rows[1:]
    if header not in allowed:
        exp = min(allowed, key=lambda e: -sum(a == b for a, b in zip(e, header)))
        i = next((i for i, (a, b) in enumerate(zip(header, exp)) if a != b), min(len(header), len(exp)))
        got = repr(header[i]) if i < len(header) else "(no column)"
        want = repr(exp[i]) if i < len(exp) else "(no column)"
        raise PlannerError(f"source file {rel}: column {i + 1} of the header is {got}, expected {want}; the file "
                           "does not have the layout its PROVENANCE.md describes (restore it or update the importer)")
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise PlannerError(f"source file {rel} line {i + 2} has {len(r)} fields, expected {len(header)} "
                               "(truncated or corrupted file; restore it from its source)")
    return Table(path, rel, header, body)


# ----------------------------------------------------------------------------------------------
# Building datasets
# ----------------------------------------------------------------------------------------------

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

        ``filters``: (name, keep mask, dropped count) as returned by costmodel.datasets.filters; the sidecar
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
                                   "mapping in costmodel/datasets/README.md")
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
        for key in sorted(self.parts, key=_key_order):
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


def _key_order(key: tuple[str, str]) -> tuple:
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


# ----------------------------------------------------------------------------------------------
# aiconfigurator (aiconfigurator/PROVENANCE.md)
# ----------------------------------------------------------------------------------------------

AIC_GPU = {"a100_sxm": "a100-80gb", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
"""aiconfigurator system -> catalogue GPU (device strings in PROVENANCE 'Measured on')."""
AIC_DEVICE = {"a100_sxm": "NVIDIA A100-SXM4-80GB", "h100_sxm": "NVIDIA H100 80GB HBM3", "h200_sxm": "NVIDIA H200",
              "b200_sxm": "NVIDIA B200", "gb200": "NVIDIA GB200"}
AIC_NOT_CATALOGUE = ("b300_sxm", "gb300")
AIC_NCCL_OPS = {"all_gather": "all_gather", "all_reduce": "all_reduce", "alltoall": "all_to_all",
                "reduce_scatter": "reduce_scatter"}
_AIC_FILE = re.compile(r"^(?P<system>[a-z0-9_]+?)_(?P<what>bf16_gemm|fp8_block_gemm|fp8_gemm|"
                       r"bf16_context_attention|nccl_fp16)__(?P<version>.+)\.csv$")
AIC_TIMING = {
    "gemm": "benchmark_with_power: CUDA-graph replay, 3 warm-ups + 6 runs, average ms per GEMM; small weights "
            "cycled so they do not sit in L2 (collector/trtllm/collect_gemm.py)",
    "context_attention": "SGLang RadixAttention layer call (KV-cache store + FMHA, no RoPE), 3 warm-ups + 20 runs",
    "nccl": "nccl-tests out-of-place time: <op>_perf -d half -w 40 -n 100|60, one process with num_gpus threads",
}


def _aic_fingerprint(data: Path, rel_in_aic: str, system: str, folder: str) -> dict:
    fp = {"device": AIC_DEVICE[system], "timing": AIC_TIMING[folder],
          "source": "github.com/ai-dynamo/aiconfigurator @ 095f58a5 (PROVENANCE.md)"}
    manifest = data / "aiconfigurator" / "manifest.json"
    if manifest.is_file():
        try:
            entries = {e["file"]: e for e in json.loads(manifest.read_text(encoding="utf-8"))}
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PlannerError(f"aiconfigurator/manifest.json is not the documented list of file entries ({exc}); "
                               "restore it from its source") from None
        cc = entries.get(rel_in_aic, {}).get("constant_columns", {})
        if cc.get("device", fp["device"]) != fp["device"]:
            raise PlannerError(f"aiconfigurator/manifest.json gives device {cc['device']!r} for {rel_in_aic}, but its "
                               f"PROVENANCE.md says {fp['device']!r}; check which GPU measured it")
        for k in ("framework", "version", "kernel_source"):
            if k in cc:
                fp[k] = cc[k]
    if folder == "nccl":
        fp["nccl_version"] = rel_in_aic.rsplit("nccl-", 1)[-1].removesuffix(".csv")
    return fp


def _source_root(data: Path, folder: str) -> Path:
    """``data/folder``, or a one-line error when the shared data has no such source."""
    root = data / folder
    if not root.is_dir():
        raise PlannerError(f"no {folder} folder under {data}; point PLANNER_DATA_DIR at shared/data")
    return root


@register("aiconfigurator")
def import_aiconfigurator(data: Path) -> list[Dataset]:
    """GEMM (bf16, per-tensor fp8), context attention (causal fwd) and single-node NCCL sweeps."""
    b = Builder("aiconfigurator")
    root = _source_root(data, "aiconfigurator")
    skipped: dict[str, list[str]] = {"gemm": [], "context_attention": [], "nccl": []}
    for folder in ("gemm", "context_attention", "nccl"):
        for path in sorted((root / folder).glob("*.csv")):
            m = _AIC_FILE.match(path.name)
            if m is None:
                skipped[folder].append(f"{path.name} (unrecognised name)")
                continue
            system, what = m["system"], m["what"]
            if system not in AIC_GPU:
                reason = "not a catalogue GPU" if system in AIC_NOT_CATALOGUE else "unknown system"
                skipped[folder].append(f"{path.name} ({reason})")
                continue
            if what == "fp8_block_gemm":
                skipped[folder].append(f"{path.name} (block-scaled FP8: not the per-tensor fp8 the planner models)")
                continue
            gpu = AIC_GPU[system]
            fp = _aic_fingerprint(data, f"{folder}/{path.name}", system, folder)
            if folder == "gemm":
                dtype = "bf16" if what == "bf16_gemm" else "fp8"
                t = read_table(data, path, ("m", "n", "k", "latency_ms"))
                b.add(t, "gemm", gpu, "fwd", dtype, {"m": t.num("m"), "n": t.num("n"), "k": t.num("k")},
                      t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp)
                b.note([("gemm", gpu)], "aiconfigurator GEMMs are y = x·Wᵀ (NT layout), no bias, forward only; "
                                        "training's dgrad/wgrad use other layouts (aiconfigurator PROVENANCE caveats)")
                if dtype == "fp8":
                    b.note([("gemm", gpu)], "aiconfigurator fp8 = per-tensor FP8; its latency includes the dynamic "
                                            "quantization of x inside the timed call (PROVENANCE 'Which FP8 is which')")
            elif folder == "context_attention":
                t = read_table(data, path, ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
                                            "head_dim", "latency_ms"))
                keep, dropped = F.filter_aic_default_attention_kernel(t, system)
                isl = t.num("isl")
                b.add(t, "attention_fwd", gpu, "fwd", "bf16",
                      {"batch": t.num("batch_size"), "seq_q": isl, "seq_kv": isl, "heads": t.num("num_heads"),
                       "kv_heads": t.num("num_key_value_heads"), "head_dim": t.num("head_dim"), "causal": 1},
                      t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp, repeats=20,
                      filters=[("filter_aic_default_attention_kernel", keep, dropped)])
                b.note([("attention_fwd", gpu)], "aiconfigurator attention is inference prefill: causal forward only, "
                                                 "no prefix; the timed op includes the KV-cache store (PROVENANCE)")
            else:
                t = read_table(data, path, ("op_name", "num_gpus", "message_size", "latency_ms"))
                ops = t.text("op_name")
                unknown = sorted(set(ops) - set(AIC_NCCL_OPS))
                if unknown:
                    raise PlannerError(f"source file {t.rel}, column 'op_name': unknown operation {unknown[0]!r}; "
                                       f"expected one of {', '.join(AIC_NCCL_OPS)}")
                ranks = t.num("num_gpus")
                for raw, kind in AIC_NCCL_OPS.items():
                    sel = ops == raw
                    b.add(t, kind, gpu, "fwd", "fp16",
                          {"bytes": 2 * t.num("message_size"), "ranks": ranks, "nodes": 1, "ranks_per_node": ranks},
                          t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp,
                          select=(f"op_name == {raw}", sel))
                    b.note([(kind, gpu)], "aiconfigurator NCCL: single node only (num_gpus 2/4/8; GB200: one 4-GPU "
                                          "tray); bytes = 2·message_size, the nccl-tests buffer (PROVENANCE nccl/)")
    for folder, names in skipped.items():
        if names:
            kinds = {"gemm": ["gemm"], "context_attention": ["attention_fwd"],
                     "nccl": list(AIC_NCCL_OPS.values())}[folder]
            b.note([(k, g) for k in kinds for g in AIC_GPU.values()],
                   f"aiconfigurator/{folder} files not imported: {'; '.join(names)}")
    b.note([(k, g) for k in AIC_NCCL_OPS.values() for g in AIC_GPU.values()],
           "aiconfigurator/multinode not imported: MoE dispatch/combine (DeepEP, TRT-LLM all-to-all) and a TRT-LLM "
           "custom all-reduce on GB300 are not NCCL collectives with our features")
    return b.datasets()


# ----------------------------------------------------------------------------------------------
# estimate-train-time (estimate-train-time/PROVENANCE.md)
# ----------------------------------------------------------------------------------------------

ETT_SYSTEMS = {"Perlmutter": ("NVIDIAA100-SXM4-80GB", "a100-80gb"), "Vista": ("NVIDIAGH200120GB", "gh200")}
"""system -> (GPU string in the file names, catalogue GPU)."""
ETT_VOCAB = 50257
"""GPT-2 vocabulary of every estimate-train-time vocab operator (PROVENANCE; target_functions.py)."""
ETT_VOCAB_DIVISIBLE_BY = 128
"""Megatron make-vocab-size-divisible-by used by the sampler: per-rank vocab = ceil(V / (128·mp))·128
(Kernel_sampling/target_functions.py: linear_final, embedding, parallel_cross_entropy_128)."""
ETT_TIMING = ("torch.profiler: GPU span from the first to the last CUDA kernel of the forward (backward) op, "
              "kernel time incl. gaps, excluding CPU overhead; wait 2, warmup 2, active 10; torch.rand fp16 inputs")
ETT_SOFTWARE = "not recorded (PROVENANCE: no driver, CUDA, PyTorch, NCCL, flash-attn or DeepSpeed versions)"
ETT_LINEAR = {  # (n, k) of the forward GEMM per PROVENANCE's operator table; m = l·b
    "linear1": (lambda mp, dim: 3 * dim / mp, lambda mp, dim: dim),
    "linear2": (lambda mp, dim: dim, lambda mp, dim: dim / mp),
    "linear3": (lambda mp, dim: 4 * dim / mp, lambda mp, dim: dim),
    "linear4": (lambda mp, dim: dim, lambda mp, dim: 4 * dim / mp),
    "linear_final": (lambda mp, dim: ett_partition_vocab(mp), lambda mp, dim: dim),
}
_ETT_UNFUSED = "unfused attention pieces (the planner models fused flash attention)"
_ETT_STAGE = ("whole pipeline-stage fwd+bwd+FusedAdam timings, not single operators (Vista's firstStage also has "
              "outliers up to ~54 s, PROVENANCE caveats)")
_ETT_NOT_MEASURED = "the authors' regressor hyper-parameters, not measurements"
ETT_SKIPPED_OPERATORS = {"baddbmm": _ETT_UNFUSED, "bmm": _ETT_UNFUSED, "fillmask": _ETT_UNFUSED,
                         "softmax": _ETT_UNFUSED, "ScaledUpperTriangMaskedSoftmax": _ETT_UNFUSED, "firstStage_optimizer": _ETT_STAGE,
                         "middleStage_optimizer": _ETT_STAGE, "lastStage_optimizer": _ETT_STAGE}
_ETT_NCCL = re.compile(r"^(?P<dev>[A-Za-z0-9-]+)_(?P<op>allreduce|allreduce_large|allgather_large|p2p)_fp16_"
                       r"(?P<nodes>\d+)_(?P<gpn>\d+)\.csv$")
ETT_NCCL_KINDS = {"allreduce": "all_reduce", "allreduce_large": "all_reduce", "allgather_large": "all_gather",
                  "p2p": "send_recv"}


def ett_partition_vocab(mp):
    """Per-rank padded vocabulary of the estimate-train-time sampler: ceil(50257 / (128·mp))·128."""
    mp = np.asarray(mp, dtype=float)
    return np.ceil(ETT_VOCAB / (ETT_VOCAB_DIVISIBLE_BY * mp)) * ETT_VOCAB_DIVISIBLE_BY


def _ett_operator(b: Builder, data: Path, path: Path, op: str, system: str, gpu: str, fp: dict) -> None:
    fb = ("F_dur(us)", "B_dur(us)")
    us = 1e-6

    def both(t, kind, feats, bwd_filter=None, bwd_role="train"):
        b.add(t, kind, gpu, "fwd", "fp16", feats, t.num(fb[0]) * us, column=fb[0], fingerprint=fp)
        filters = [] if bwd_filter is None else [(bwd_filter.__name__, *bwd_filter(t))]
        b.add(t, kind, gpu, "bwd", "fp16", feats, t.num(fb[1]) * us, column=fb[1], fingerprint=fp, role=bwd_role,
              filters=filters)

    if op in ETT_LINEAR:
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        mp, dim = t.num("mp"), t.num("dim")
        n_of, k_of = ETT_LINEAR[op]
        both(t, "gemm", {"m": t.num("l") * t.num("b"), "n": n_of(mp, dim), "k": k_of(mp, dim)},
             bwd_role="composite_bwd")
    elif op == "flash_atten":
        t = read_table(data, path, ("mp", "b", "h", "l", "dim", *fb))
        heads, seq = t.num("h") / t.num("mp"), t.num("l")
        feats = {"batch": t.num("b"), "seq_q": seq, "seq_kv": seq, "heads": heads, "kv_heads": heads,
                 "head_dim": t.num("dim") / t.num("h"), "causal": 0}
        b.add(t, "attention_fwd", gpu, "fwd", "fp16", feats, t.num(fb[0]) * us, column=fb[0], fingerprint=fp)
        filters = ([("filter_ett_vista_flash_atten_backward", *F.filter_ett_vista_flash_atten_backward(t))]
                   if system == "Vista" else [])
        b.add(t, "attention_bwd", gpu, "bwd", "fp16", feats, t.num(fb[1]) * us, column=fb[1], fingerprint=fp,
              filters=filters)
        b.note([("attention_fwd", gpu), ("attention_bwd", gpu)],
               "estimate-train-time flash_atten: flash_attn_func(Q, K, V) non-causal, heads h/mp, head_dim dim/h")
    elif op in ("layernorm", "RMSlayernorm"):
        t = read_table(data, path, ("b", "l", "dim", *fb))
        both(t, "norm", {"tokens": t.num("b") * t.num("l"), "hidden": t.num("dim"),
                         "rms": 1 if op == "RMSlayernorm" else 0})
        b.note([("norm", gpu)], "estimate-train-time norm rows come from two kernels told apart by the rms feature: "
                                "torch LayerNorm (layernorm, rms = 0) and Megatron RMSNorm (RMSlayernorm, rms = 1)")
    elif op == "gelu":
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        both(t, "activation", {"tokens": t.num("b") * t.num("l"), "width": 4 * t.num("dim") / t.num("mp"),
                               "gated": 0})
    elif op == "res_add":
        t = read_table(data, path, ("b", "l", "dim", *fb))
        both(t, "residual_add", {"elements": t.num("b") * t.num("l") * t.num("dim")},
             bwd_filter=F.filter_ett_res_add_backward)
    elif op == "RoPE":
        t = read_table(data, path, ("mp", "b", "h", "l", "dim", *fb))
        both(t, "rope", {"tokens": t.num("b") * t.num("l"), "heads": 2 * t.num("h") / t.num("mp"),
                         "head_dim": t.num("dim") / t.num("h")})
        b.note([("rope", gpu)], "estimate-train-time RoPE rotates q and k, each h/mp heads: heads feature = 2·h/mp "
                                "(the graph's heads + kv_heads); the span includes the cos/sin table")
    elif op == "embedding":
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        both(t, "embedding", {"tokens": t.num("b") * t.num("l"), "hidden": t.num("dim"),
                              "vocab": ett_partition_vocab(t.num("mp"))})
    elif op == "parallel_cross_entropy_128":
        t = read_table(data, path, ("mp", "b", "l", *fb))
        both(t, "cross_entropy", {"tokens": t.num("b") * t.num("l"), "vocab": ett_partition_vocab(t.num("mp"))})
        b.note([("cross_entropy", gpu)], "estimate-train-time parallel_cross_entropy_128: Megatron vocab-parallel CE "
                                         "on fp16 logits [b, l, ceil(50257/(128·mp))·128]; '128' = the vocabulary "
                                         "padding multiple (target_functions.py)")
    elif op == "optimizer":
        t = read_table(data, path, ("num_layers", "hidden_size", "param_tensors", "params", "dur"))
        b.add(t, "optimizer", gpu, "fwd", "fp16", {"params": t.num("params")}, t.num("dur") * us, column="dur",
              fingerprint=fp)
        b.note([("optimizer", gpu)], "estimate-train-time optimizer: column 'dur' taken as µs, as PROVENANCE "
                                     "assumes; DeepSpeed FusedAdam step over 'params' parameters. Time is not "
                                     "monotone in params (it also varies with num_layers/param_tensors, not features "
                                     "here); the efficiency fit did not use this file (costmodel/data/PROVENANCE.md)")
    else:
        raise AssertionError(op)
    if op in ETT_LINEAR:
        b.note([("gemm", gpu)], "estimate-train-time GEMM rows: nn.Linear fp16 (linear1 with bias); a 'bwd' row is "
                                "dgrad + wgrad of the forward (m, n, k) together (role composite_bwd): use it to check "
                                "backward-as-GEMMs, not as one GEMM")
        if op == "linear_final":
            b.note([("gemm", gpu)], "estimate-train-time linear_final: n = per-rank padded vocab "
                                    "ceil(50257/(128·mp))·128 (target_functions.py)")


@register("estimate-train-time")
def import_estimate_train_time(data: Path) -> list[Dataset]:
    """The seed paper's Perlmutter (A100) and Vista (GH200) operator and NCCL samples."""
    b = Builder("estimate-train-time")
    root = _source_root(data, "estimate-train-time")
    ops = {"linear1", "linear2", "linear3", "linear4", "linear_final", "flash_atten", "layernorm", "RMSlayernorm",
           "gelu", "res_add", "RoPE", "embedding", "parallel_cross_entropy_128", "optimizer"}
    for system, (dev, gpu) in ETT_SYSTEMS.items():
        base = {"device": dev, "system": system, "software": ETT_SOFTWARE,
                "source": "github.com/DebarghaG/estimate-train-time @ 1ac4d5e4 (PROVENANCE.md)"}
        skipped: dict[str, list[str]] = {}
        for path in sorted((root / system / "operator").glob("*.csv")):
            m = re.match(rf"^{re.escape(dev)}_(?P<op>[A-Za-z0-9_]+)_fp16\.csv$", path.name)
            if path.name == f"{dev}__best_model_config.csv":
                skipped.setdefault(_ETT_NOT_MEASURED, []).append(f"operator/{path.name}")
            elif m and m["op"] in ops:
                _ett_operator(b, data, path, m["op"], system, gpu, {**base, "timing": ETT_TIMING})
            elif m and m["op"] in ETT_SKIPPED_OPERATORS:
                skipped.setdefault(ETT_SKIPPED_OPERATORS[m["op"]], []).append(m["op"])
            else:
                skipped.setdefault("unrecognised", []).append(f"operator/{path.name}")
        for path in sorted((root / system / "nccl").glob("*.csv")):
            m = _ETT_NCCL.match(path.name)
            if path.name == f"{dev}__best_model_config.csv":
                skipped.setdefault(_ETT_NOT_MEASURED, []).append(f"nccl/{path.name}")
                continue
            if m is None or m["dev"] != dev:
                skipped.setdefault("unrecognised", []).append(f"nccl/{path.name}")
                continue
            t = read_table(data, path, ("shape", "nodes", "GPUsPerNode", "dur(us)"))
            nodes, gpn = t.num("nodes"), t.num("GPUsPerNode")
            if t.n and not (np.all(nodes == int(m["nodes"])) and np.all(gpn == int(m["gpn"]))):
                col = "nodes" if not np.all(nodes == int(m["nodes"])) else "GPUsPerNode"
                raise PlannerError(f"source file {t.rel}, column {col!r}: values differ from the file name's "
                                   f"_<nodes>_<GPUsPerNode> suffix; restore the file from its source")
            kind = ETT_NCCL_KINDS[m["op"]]
            ranks = nodes * gpn
            filters = []
            if system == "Perlmutter":
                filters.append(("filter_ett_perlmutter_inter_node", *F.filter_ett_perlmutter_inter_node(t)))
            if system == "Vista" and kind == "all_gather":
                filters.append(("filter_ett_vista_allgather_large_4_8_nodes",
                                *F.filter_ett_vista_allgather_large_4_8_nodes(t)))
            # shape = fp16 elements of the tensor passed to torch.distributed; all_gather's is the per-rank input,
            # so its nccl-tests buffer (the full output) is 2·shape·ranks bytes (PROVENANCE nccl/).
            nbytes = 2 * t.num("shape") * (ranks if kind == "all_gather" else 1)
            fp = {**base, "timing": "GPU kernel span of the c10d::<op>_ call (torch.profiler)"}
            b.add(t, kind, gpu, "fwd", "fp16", {"bytes": nbytes, "ranks": ranks, "nodes": nodes,
                                                "ranks_per_node": gpn},
                  t.num("dur(us)") * 1e-6, column="dur(us)", fingerprint=fp, filters=filters)
            b.note([(kind, gpu)], "estimate-train-time NCCL sizes start at 2M-20M elements: no small-message regime")
        for reason, names in skipped.items():
            b.note([k for k in b.parts if k[1] == gpu],
                   f"estimate-train-time/{system} not imported, {reason}: {', '.join(names)}")
    b.note(list(b.parts), "estimate-train-time/reference_predictions not imported: the authors' predictions, "
                          "not measurements")
    b.note([("all_reduce", "gh200"), ("all_gather", "gh200"), ("send_recv", "gh200")],
           "Vista (GH200): 1 GPU per node, every collective crosses InfiniBand")
    return b.datasets()


# ----------------------------------------------------------------------------------------------
# vidur (vidur/PROVENANCE.md)
# ----------------------------------------------------------------------------------------------

VIDUR_COMPUTE_GPU = {"a100": "a100-80gb", "h100": "h100-sxm"}
VIDUR_NETWORK_GPU = {"a100_dgx": "a100-80gb", "h100_dgx": "h100-sxm"}
VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
VIDUR_STATS = ("min", "max", "mean", "median", "std")
VIDUR_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers")


def _vidur_header(ops: Sequence[str]) -> list[str]:
    return [f"time_stats.{op}.{s}" for op in ops for s in VIDUR_STATS] + list(VIDUR_SHAPE)


VIDUR_MLP_HEADERS = (_vidur_header(VIDUR_OPS),
                     _vidur_header([o for o in VIDUR_OPS if o != "post_attention_layernorm"]))
"""Sequential blocks (Llama-style) and parallel attention+MLP blocks (phi-2: no post-attention norm)."""


def _vidur_compute(b: Builder, data: Path, path: Path, gpu: str, fp: dict) -> None:
    t = read_table(data, path, VIDUR_MLP_HEADERS)
    gated_txt = t.text("use_gated_mlp")
    bad = ~np.isin(gated_txt, ("True", "False"))
    if bad.any():
        raise PlannerError(f"source file {t.rel} line {int(np.argmax(bad)) + 2}, column 'use_gated_mlp': "
                           f"{gated_txt[np.argmax(bad)]!r} is not True/False")
    gated = (gated_txt == "True").astype(float)
    tok, tp, emb = t.num("num_tokens"), t.num("num_tensor_parallel_workers"), t.num("n_embd")
    nh, nkv, ff = t.num("n_head"), t.num("n_kv_head"), t.num("n_expanded_embd")
    hd = emb / nh
    up = (1 + gated) * ff / tp
    # vidur's GPTBlock (profiling/mlp/mlp_impl.py) builds a post-attention norm only for norm = "rms_norm"
    # (RMSNorm: the Llama-family configs of vidur/config/model_config.py); blocks without one are phi-2's
    # parallel blocks with norm = "layer_norm" (torch.nn.LayerNorm).
    rms = 1 if "time_stats.post_attention_layernorm.median" in t else 0
    # per-GPU (TP-sharded) shapes as built by vidur/profiling/mlp/mlp_impl.py (ColumnParallel / RowParallel)
    mapping = {
        "emb": ("embedding", {"tokens": tok, "hidden": emb, "vocab": t.num("vocab_size") / tp}),
        "input_layernorm": ("norm", {"tokens": tok, "hidden": emb, "rms": rms}),
        "attn_pre_proj": ("gemm", {"m": tok, "n": (nh + 2 * nkv) * hd / tp, "k": emb}),
        "attn_rope": ("rope", {"tokens": tok, "heads": (nh + nkv) / tp, "head_dim": hd}),
        "attn_post_proj": ("gemm", {"m": tok, "n": emb, "k": nh * hd / tp}),
        "post_attention_layernorm": ("norm", {"tokens": tok, "hidden": emb, "rms": rms}),
        "mlp_up_proj": ("gemm", {"m": tok, "n": up, "k": emb}),
        "mlp_act": ("activation", {"tokens": tok, "width": up, "gated": gated}),
        "mlp_down_proj": ("gemm", {"m": tok, "n": emb, "k": ff / tp}),
        "add": ("residual_add", {"elements": tok * emb}),
    }
    sequential = "time_stats.post_attention_layernorm.median" in t
    for op, (kind, feats) in mapping.items():
        if f"time_stats.{op}.median" not in t:
            continue
        if op == "add" and not sequential:
            b.note([("residual_add", gpu)], f"{t.rel} 'add' not imported: parallel attention+MLP block, the "
                                            "timed add sums three tensors (mlp_impl.py)")
            continue
        b.add(t, kind, gpu, "fwd", "fp16", feats, t.num(f"time_stats.{op}.median") * 1e-3,
              spread_s=t.num(f"time_stats.{op}.std") * 1e-3, column=f"time_stats.{op}.median", fingerprint=fp)


def _vidur_network(b: Builder, data: Path, path: Path, gpu: str, fp: dict) -> None:
    op = path.stem
    t = read_table(data, path, ("", *(f"time_stats.{op}.{s}" for s in VIDUR_STATS), "rank", "num_workers", "size",
                                "collective", "devices_per_node", "max_devices_per_node"))
    coll = t.text("collective")
    if t.n and not np.all(coll == op):
        raise PlannerError(f"source file {t.rel}, column 'collective': {coll[np.argmax(coll != op)]!r} in a file "
                           f"named {op}.csv")
    ranks, rpn = t.num("num_workers"), t.num("devices_per_node")
    b.add(t, op, gpu, "fwd", "fp16", {"bytes": t.num("size"), "ranks": ranks, "nodes": ranks / rpn,
                                      "ranks_per_node": rpn},
          t.num(f"time_stats.{op}.median") * 1e-3, spread_s=t.num(f"time_stats.{op}.std") * 1e-3, repeats=3,
          column=f"time_stats.{op}.median", fingerprint=fp)
    if (t.num("num_workers") > t.num("devices_per_node")).any():
        b.note([(op, gpu)], f"{t.rel}: rows with nodes > 1 are kept, but PROVENANCE finds the inter-node "
                            "bandwidth low (~6 GB/s busbw, 2-node all-reduce) and the NIC setup unknown")


@register("vidur")
def import_vidur(data: Path) -> list[Dataset]:
    """vidur's inference-layer compute profiles (TP-sharded GEMMs, norms, ...) and DGX collectives."""
    b = Builder("vidur")
    root = _source_root(data, "vidur")
    src = "github.com/microsoft/vidur @ 7d475133 (PROVENANCE.md)"
    for folder in sorted(p for p in (root / "compute").iterdir() if p.is_dir()):
        gpu = VIDUR_COMPUTE_GPU.get(folder.name)
        if gpu is None:
            continue
        fp = {"device": f"not stated (vidur folder '{folder.name}'; docs/profiling.md names "
                        + ("80GB A100 DGX and Azure NC96ads_A100_v4 PCIe" if folder.name == "a100"
                           else "H100 DGX and 80GB H100 NVL") + ")",
              "framework": "sarathi-serve layers, model.eval(), fp16, forward only",
              "timing": "CudaTimer (record_function), 2 warm-up + 20 active steps; median and std of the steps",
              "source": src}
        for path in sorted(folder.glob("*/*/mlp.csv")):
            _vidur_compute(b, data, path, gpu, fp)
        b.note([k for k in b.parts if k[1] == gpu],
               f"vidur compute/{folder.name} -> {gpu}: the exact SKU is not stated (PROVENANCE); shapes are per GPU "
               "(TP-sharded); every row is kept: the same per-GPU shape recurs across models and num_tokens values "
               "repeat within a file (duplicate_shape_rows), so fits must group by shape")
    skipped = []
    for folder in sorted(p for p in (root / "network").iterdir() if p.is_dir()):
        gpu = VIDUR_NETWORK_GPU.get(folder.name)
        if gpu is None:
            reason = ("4-GPU box with pairwise NVLink (PCIe A100 / H100 NVL), not a catalogue node"
                      if "pairwise_nvlink" in folder.name else "unknown topology")
            if folder.name == "h100_pairwise_nvlink":
                reason += "; its send_recv.csv is a byte-identical copy of the A100 file (PROVENANCE)"
            skipped.append(f"network/{folder.name} ({reason})")
            continue
        fp = {"device": ("A100 DGX, 8x A100 80GB" if folder.name == "a100_dgx" else "H100 DGX, 8x H100")
              + " (docs/profiling.md)",
              "timing": "torch Kineto profiler on kernels named nccl*: median over 11 launches, then min/max/mean/"
                        "median/std over 3 repeats; rank 0 only",
              "nccl_version": "not stated", "inter_node": "not described (PROVENANCE)", "source": src}
        for op in ("all_reduce", "send_recv"):
            path = folder / f"{op}.csv"
            if path.is_file():
                _vidur_network(b, data, path, gpu, fp)
    if skipped:
        b.note([k for k in b.parts if k[0] in ("all_reduce", "send_recv")],
               "vidur files not imported: " + "; ".join(skipped))
    return b.datasets()


# ----------------------------------------------------------------------------------------------
# LLMCompass A100 (llmcompass-a100/PROVENANCE.md): an independent spot check
# ----------------------------------------------------------------------------------------------

@register("llmcompass-a100")
def import_llmcompass(data: Path) -> list[Dataset]:
    """LLMCompass 'real hardware' A100 GEMMs as spot-check rows (role spot_check) of gemm on a100-80gb."""
    b = Builder("llmcompass-a100")
    root = _source_root(data, "llmcompass-a100")
    t = read_table(data, root / "matmul_A100.csv", ("M", "N", "K", "latency", "throughput"), strip=True)
    lat = []
    for i, v in enumerate(t.text("latency")):
        m = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*ms", v)
        if m is None:
            raise PlannerError(f"source file {t.rel} line {i + 2}, column 'latency': {v!r} is not '<number>ms'")
        lat.append(float(m[1]) * 1e-3)
    fp = {"device": "Real NVIDIA A100 (plot legend); SKU, software and timing method not stated (simulator "
                    "config A100_80GB_fp16)", "source": "github.com/PrincetonUniversity/LLMCompass @ 2e015fd2"}
    b.add(t, "gemm", "a100-80gb", "fwd", "fp16", {"m": t.num("M"), "n": t.num("N"), "k": t.num("K")},
          np.array(lat), column="latency", fingerprint=fp, role="spot_check")
    b.note([("gemm", "a100-80gb")], "llmcompass-a100 matmul rows (role spot_check): an independent A100 check, "
                                    "fp16 and 80 GB assumed from the simulator config; hold them out of fits. "
                                    "softmax/layernorm/gelu files not imported (throughput only, no time per call)")
    return b.datasets()


# ----------------------------------------------------------------------------------------------
# Everything
# ----------------------------------------------------------------------------------------------

def import_all(data_dir: Path | None = None, progress: bool = False) -> dict[tuple[str, str], Dataset]:
    """Run every registered importer on ``data_dir`` (default: costmodel.core.paths) -> {(kind, gpu): Dataset}.

    Datasets of the same (kind, gpu) from several importers are concatenated in registry order.
    """
    from costmodel.core.paths import require_data_dir

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
    return {key: merge(found[key]) for key in sorted(found, key=_key_order)}


def save_all(datasets: dict[tuple[str, str], Dataset], out_dir: Path) -> list[Path]:
    """Write each dataset as ``out_dir/<gpu>/<kind>.csv`` (+ sidecar)."""
    return [save_dataset(ds, Path(out_dir) / gpu / f"{kind}.csv") for (kind, gpu), ds in datasets.items()]


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


if __name__ == "__main__":
    raise SystemExit(main())
