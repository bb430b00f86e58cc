"""The efficiency fit's samples, taken from the imported datasets (:mod:`costmodel.fitting.datasets.importers`).

The fit (:mod:`costmodel.fitting.efficiency`) reads no source CSV itself: every row comes from
``import_all()``'s datasets, so the importers' header checks, broken-subset filters
(:mod:`costmodel.fitting.datasets.filters`), GPU name maps and SHA-256 records are the fit's too. The one
exception is LLMCompass's throughput-only LayerNorm / GELU files, which no importer turns into a dataset
(no time per call); :func:`llmcompass_memory_rows` reads them with the importers' reader.

Each fitted entry lists its :class:`Source` records, taken from the datasets' sidecars: ``rows_before`` is
the source's ``rows_in`` and ``rows_after`` the rows the fit uses (after filters and selections).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import FEATURES
from costmodel.fitting.datasets.importers import ETT_SYSTEMS, read_table, sha256
from costmodel.fitting.datasets.importers.estimate_train_time import ETT_VOCAB, ett_partition_vocab
from costmodel.fitting.datasets.importers.llmcompass import LLMCOMPASS_GPU
from costmodel.fitting.datasets.schema import Dataset
from costmodel.graph.conventions import attention_bytes, attention_fwd_flops, gemm_bytes, gemm_flops
from costmodel.graph.kernel_basis import OTHER_BASIS_ROLE

Datasets = dict[tuple[str, str], Dataset]
AIC, ETT, VIDUR = "aiconfigurator", "estimate-train-time", "vidur"
"""Importer names (the registry's) as recorded in each source record."""
ETT_LINEAR_GEMMS = ("linear1", "linear2", "linear3", "linear4")
"""estimate-train-time GEMMs the fit uses; linear_final is left out: its padded vocabulary makes it an
output projection the table does not need, and it was never part of the fit (costmodel/data/PROVENANCE.md)."""
MEASURED_MEMORY_KINDS = ("norm", "activation", "rope", "residual_add", "embedding", "cross_entropy")
"""Memory-bound kinds with measured rows (the optimizer's efficiency is derived, see efficiency.default_entry)."""


@dataclass
class Source:
    """Where a fitted entry's rows came from."""

    file: str
    """Path relative to the data folder."""
    sha256: str
    """SHA-256 of the file's bytes."""
    rows_before: int
    """Rows read (of the columns used)."""
    rows_after: int
    """Rows left after the filters."""
    filters: list = field(default_factory=list)
    """Names of the filter functions applied."""

    def as_dict(self) -> dict:
        return {"file": self.file, "sha256": self.sha256, "rows_before": self.rows_before,
                "rows_after": self.rows_after, "filters": list(self.filters)}


@dataclass
class Samples:
    """Measured rows of one fit: FLOPs, bytes, seconds, and where they came from."""

    flops: list = field(default_factory=list)
    bytes: list = field(default_factory=list)
    time_s: list = field(default_factory=list)
    sources: list = field(default_factory=list)

    def add(self, flops, nbytes, time_s, source: Source):
        n = len(time_s)
        self.flops.append(np.broadcast_to(np.asarray(flops, dtype=float), (n,)))
        self.bytes.append(np.broadcast_to(np.asarray(nbytes, dtype=float), (n,)))
        self.time_s.append(np.asarray(time_s, dtype=float))
        self.sources.append(source)

    def arrays(self):
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)  # noqa: E731
        return cat(self.flops), cat(self.bytes), cat(self.time_s)


# ----------------------------------------------------------------------------------------------
# Rows of the datasets, per source record
# ----------------------------------------------------------------------------------------------

@dataclass
class SourceRows:
    """The rows of one (kind, gpu) dataset that came from one source record (file + column), in file order."""

    kind: str
    record: dict
    """The sidecar's source record (importer, path, column, direction, dtype, rows_in, rows_kept, filters, ...)."""
    features: dict[str, np.ndarray]
    """Feature columns by name (FEATURES[kind])."""
    time_s: np.ndarray
    source_row: np.ndarray

    @property
    def operator(self) -> str:
        """The source's own operator name: the column's for vidur (time_stats.<op>.median), the file's for
        estimate-train-time (<GPU string>_<op>_fp16.csv)."""
        if self.record["importer"] == VIDUR:
            return self.record["column"].split(".")[1]
        m = re.fullmatch(r"[A-Za-z0-9-]+?_(?P<op>[A-Za-z0-9_]+)_fp16\.csv", Path(self.record["path"]).name)
        return m["op"] if m else Path(self.record["path"]).stem

    def source(self, rows_after: int | None = None) -> Source:
        r = self.record
        return Source(r["path"], r["sha256"], int(r["rows_in"]), int(r["rows_kept"] if rows_after is None
                                                                      else rows_after),
                      [f["name"] for f in r["filters"]])


def source_rows(datasets: Datasets, kind: str, gpu: str, importer: str | None = None) -> Iterator[SourceRows]:
    """Per source record of (kind, gpu), in sidecar order, its rows; ``importer`` keeps one importer's.

    A (kind, gpu) whose rows were all filtered has no dataset: its source records sit, with a ``kind``
    field, on other datasets of the GPU; they are yielded with no rows (their filters and counts still
    matter to the fit's provenance)."""
    ds = datasets.get((kind, gpu))
    records: list[tuple[Dataset | None, dict]] = []
    if ds is not None:
        records = [(ds, r) for r in ds.meta["sources"] if r.get("kind", kind) == kind]
    else:
        seen = set()
        for (_, g), other in datasets.items():
            for r in other.meta["sources"] if g == gpu else ():
                key = (r["path"], r["column"], r["direction"])
                if r.get("kind") == kind and key not in seen:
                    seen.add(key)
                    records.append((None, r))
    names = FEATURES[kind]
    for host, r in records:
        if importer is not None and r["importer"] != importer:
            continue
        if host is None:
            empty = np.zeros(0)
            yield SourceRows(kind, r, {n: empty for n in names}, empty, np.zeros(0, dtype=int))
            continue
        a, b = r["dataset_rows"]
        yield SourceRows(kind, r, {n: host.features[a:b, j] for j, n in enumerate(names)}, host.time_s[a:b],
                         host.source_row[a:b])


def fused_basis(rows: Iterator[SourceRows]) -> Iterator[SourceRows]:
    """The source records measured on the fused kernel basis planner's costs stand for (costmodel.graph.kernel_basis):
    records the importer marked ``other_basis`` (eager PyTorch chains, FlashAttention-2 on Hopper) are left out."""
    return (r for r in rows if r.record.get("role") != OTHER_BASIS_ROLE)


# ----------------------------------------------------------------------------------------------
# Samples per fit
# ----------------------------------------------------------------------------------------------

def gemm_samples(datasets: Datasets, gpu: str, dtype: str) -> tuple[Samples, float | None]:
    """(samples, launch floor): aiconfigurator GEMMs of ``dtype`` (bf16 / per-tensor fp8) and, for bf16,
    estimate-train-time linear1-4 (fp16 rows, in the bf16 table). The floor is the smallest aiconfigurator
    latency (None without aiconfigurator rows).

    estimate-train-time backward rows (dgrad + wgrad, role composite_bwd) count 2× the forward FLOPs and bytes.
    """
    s, floor = Samples(), None
    for r in source_rows(datasets, "gemm", gpu, AIC):
        if r.record["dtype"] != dtype:
            continue
        m, n, k = r.features["m"], r.features["n"], r.features["k"]
        s.add(gemm_flops(m, n, k), gemm_bytes(m, n, k, dtype), r.time_s, r.source())
        floor = float(r.time_s.min()) if floor is None else min(floor, float(r.time_s.min()))
    if dtype == "bf16":
        for r in fused_basis(source_rows(datasets, "gemm", gpu, ETT)):
            if r.operator not in ETT_LINEAR_GEMMS:
                continue
            m, n, k = r.features["m"], r.features["n"], r.features["k"]
            f, b = gemm_flops(m, n, k), gemm_bytes(m, n, k, "fp16")
            if r.record["direction"] == "bwd":
                f, b = 2 * f, 2 * b
            s.add(f, b, r.time_s, r.source())
    return s, floor


def _attention_flops(f: dict):
    return attention_fwd_flops(f["batch"], f["seq_q"], f["seq_kv"], f["heads"], f["head_dim"], f["causal"])


def attention_samples(datasets: Datasets, gpu: str) -> tuple[Samples, Samples]:
    """(forward samples, backward samples): aiconfigurator context attention (causal fwd, default kernel)
    and estimate-train-time flash_atten (non-causal, heads h/mp, head_dim dim/h).

    Backward samples carry the forward time of the same source row in the ``bytes`` slot, for the
    bwd/fwd time ratio."""
    fwd, bwd = Samples(), Samples()
    fwd_time: dict[str, np.ndarray] = {}
    for r in fused_basis(source_rows(datasets, "attention_fwd", gpu)):
        f = r.features
        fwd.add(_attention_flops(f), attention_bytes(f["batch"], f["seq_q"], f["seq_kv"], f["heads"], f["kv_heads"],
                                                     f["head_dim"]), r.time_s, r.source())
        by_row = np.full(int(r.record["rows_in"]), np.nan)
        by_row[r.source_row] = r.time_s
        fwd_time[r.record["path"]] = by_row
    for r in fused_basis(source_rows(datasets, "attention_bwd", gpu)):
        tf = fwd_time[r.record["path"]][r.source_row]
        if np.isnan(tf).any():
            raise PlannerError(f"{r.record['path']}: backward rows without a forward time; the attention "
                               "datasets do not pair up")
        bwd.add(_attention_flops(r.features), tf, r.time_s, r.source())
    return fwd, bwd


def _ett_cross_entropy_vocab(padded: np.ndarray) -> np.ndarray:
    """The fit's cross-entropy byte count uses the unpadded per-rank vocabulary 50257 / mp (the table's
    convention since it was first fitted); the dataset's ``vocab`` feature is the padded one,
    ett_partition_vocab(mp), which determines mp (one padded value per tensor-parallel degree)."""
    mps = 2.0 ** np.arange(9)
    by_padded = dict(zip(ett_partition_vocab(mps).tolist(), mps.tolist()))
    if len(by_padded) != len(mps) or not set(padded.tolist()) <= set(by_padded):
        raise PlannerError("estimate-train-time cross-entropy vocab feature is not ett_partition_vocab(mp) of a "
                           "power-of-two mp; update costmodel/fitting/efficiency_samples.py")
    mp = np.array([by_padded[v] for v in padded.tolist()])
    return ETT_VOCAB / mp


def _memory_bytes(r: SourceRows):
    """Bytes read + written by the source's rows (costmodel.graph.conventions.mem_bytes conventions, with the
    variants' own counts kept from the first fit: vidur's gated activation reads 2F and writes F;
    estimate-train-time's RoPE counts the h/mp query heads only and its cross entropy the unpadded vocab).
    None: rows the fit does not use (estimate-train-time embedding backward, whose dense weight-gradient
    traffic depends on the padded vocabulary)."""
    f, kind, bwd = r.features, r.kind, r.record["direction"] == "bwd"
    if kind == "residual_add":
        return 3 * f["elements"] * 2
    if r.record["importer"] == VIDUR:
        tok = f["tokens"]
        if kind == "norm":
            return 2 * tok * f["hidden"] * 2
        if kind == "activation":
            gated = f["gated"] > 0
            return np.where(gated, 3, 2) * tok * (f["width"] / np.where(gated, 2, 1)) * 2
        if kind == "rope":
            return 2 * tok * f["heads"] * f["head_dim"] * 2
        if kind == "embedding":
            return 2 * tok * f["hidden"] * 2
        raise AssertionError(kind)
    tokens = f["tokens"]
    if kind == "norm":
        e = tokens * f["hidden"]
        return 3 * e * 2 if bwd else 2 * e * 2
    if kind == "activation":
        e = tokens * f["width"]
        return 3 * e * 2 if bwd else 2 * e * 2
    if kind == "rope":
        return 2 * (tokens * f["heads"] * f["head_dim"] / 2) * 2
    if kind == "embedding":
        return None if bwd else 2 * tokens * f["hidden"] * 2
    if kind == "cross_entropy":
        return 2 * tokens * _ett_cross_entropy_vocab(f["vocab"]) * 2
    raise AssertionError(kind)


def memory_samples(datasets: Datasets, gpu: str) -> dict[str, dict[str, Samples]]:
    """Bytes moved and times of memory-bound operators: kind -> variant (importer:operator) -> samples,
    from the estimate-train-time and vidur rows (see :func:`_memory_bytes`)."""
    out: dict[str, dict[str, Samples]] = {}
    for kind in MEASURED_MEMORY_KINDS:
        for importer in (ETT, VIDUR):
            for r in fused_basis(source_rows(datasets, kind, gpu, importer)):
                nb = _memory_bytes(r)
                if nb is not None:
                    out.setdefault(kind, {}).setdefault(f"{importer}:{r.operator}", Samples()).add(
                        0.0, nb, r.time_s, r.source())
    return out


def llmcompass_memory_rows(data: Path) -> dict[str, tuple[np.ndarray, np.ndarray, Source]]:
    """LLMCompass A100 LayerNorm / GELU: name -> (elements, throughput in elements/s, source). These files
    are throughput only (no time per call), so no importer makes a dataset of them."""
    out = {}
    for name, header in (("layernorm", ("M", "N", "throughput_Gelem_per_s")),
                         ("gelu", ("M", "throughput_Gelem_per_s"))):
        p = data / f"llmcompass-a100/{name}_A100.csv"
        t = read_table(data, p, header, strip=True)
        elems = t.num("M") * t.num("N") if "N" in t else t.num("M")
        out[name] = (elems, t.num("throughput_Gelem_per_s") * 1e9, Source(t.rel, sha256(p), t.n, t.n, []))
    return out


def ett_gpu(system: str) -> str:
    """Catalogue GPU of an estimate-train-time system (Perlmutter, Vista)."""
    return ETT_SYSTEMS[system][1]


__all__ = ["AIC", "ETT", "VIDUR", "LLMCOMPASS_GPU", "Datasets", "Samples", "Source", "SourceRows", "attention_samples",
           "ett_gpu", "gemm_samples", "llmcompass_memory_rows", "memory_samples", "source_rows"]
