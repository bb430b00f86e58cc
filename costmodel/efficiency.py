"""Fit the roofline efficiency table from the public measurements in ``shared/data``.

Run: ``python -m costmodel.efficiency [--data-dir D] [--out costmodel/data/efficiency.json]``.

What is fitted, per GPU catalogue name with data (methods in detail in costmodel/data/PROVENANCE.md):

* ``gemm.<dtype>``: achieved/peak FLOP/s as a table over log2(FLOPs) buckets (median per bucket),
  plus the GEMM's own memory-bound efficiency and launch floor: see :func:`fit_gemm_table`.
* ``attention_fwd``: the same bucket table for fused attention forward (FLOPs per
  :func:`costmodel.cost.roofline.attention_fwd_flops`); ``attention_bwd_fwd_ratio``.
* ``memory.<kind>``: achieved fraction of HBM bandwidth for memory-bound operators.
* ``collectives.{intra,inter}.<op>.<n>``: alpha (µs) and bus-bandwidth efficiency.
* ``launch_latency_us``: the smallest measured bf16 GEMM latency (a measured kernel floor).

GPUs without data use the ``default`` entry: the median over the GPUs with data.
Every entry lists its source files (SHA-256, rows before/after filtering, filters applied).
The broken subsets named in the data's PROVENANCE.md files are removed by the ``filter_*`` functions
(defined in :mod:`costmodel.datasets.filters`, shared with the dataset importers).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from costmodel.cost.roofline import (attention_bytes, attention_fwd_flops, busbw_factor, gemm_bytes,
                                     gemm_flops)
from costmodel.datasets import filters as _filters
from costmodel.datasets.filters import AIC_DEFAULT_ATTENTION_KERNEL  # noqa: F401  (re-exported)

OUT_DEFAULT = Path(__file__).resolve().parent / "data" / "efficiency.json"

# catalogue name -> (gpus.yaml key, aiconfigurator system prefix, estimate-train-time system, vidur folder)
MEASURED_GPUS: dict[str, dict] = {
    "a100-80gb": {"yaml": "a100_80gb_sxm", "aic": "a100_sxm", "ett": "Perlmutter", "vidur": "a100"},
    "h100-sxm": {"yaml": "h100_sxm_80gb", "aic": "h100_sxm", "vidur": "h100"},
    "h200": {"yaml": "h200_sxm_141gb", "aic": "h200_sxm"},
    "gh200": {"yaml": "gh200_96gb_hbm3", "ett": "Vista"},
    "b200": {"yaml": "b200_sxm", "aic": "b200_sxm"},
    "gb200": {"yaml": "gb200_nvl72_gpu", "aic": "gb200"},
}
# Catalogue GPUs with no measurements in shared/data: they get the ``default`` entry.
UNMEASURED_GPUS = {"a100-40gb": "a100_40gb_sxm", "h100-pcie": "h100_pcie_80gb",
                   "gh200-144gb": "gh200_144gb_hbm3e", "mi300x": "mi300x"}
ETT_GPU_STRING = {"Perlmutter": "NVIDIAA100-SXM4-80GB", "Vista": "NVIDIAGH200120GB"}
AIC_NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
                "alltoall": "all_to_all"}
MONO_MARGIN = 2e-3
"""Margin that keeps the monotone-time constraint true after rounding to 4 significant digits."""
MIN_BUCKET_ROWS = 5
"""Fewest rows for a log2(FLOPs) bucket to enter a table."""
LARGE_MESSAGE_BYTES = 1 << 20
"""Collective alpha-beta fits use messages of at least 1 MiB (the bandwidth regime)."""
MEM_MIN_BYTES = 64 << 20
"""Memory-bound efficiencies use operators moving at least 64 MiB: bandwidth (not launch) regime and
above the L2 size of the measured GPUs (40-50 MB, gpus.yaml l2_mb; B200 126.5 MB has no such data)."""


# ----------------------------------------------------------------------------------------------
# Reading and provenance
# ----------------------------------------------------------------------------------------------

Table = dict  # column name -> np.ndarray (float where the column parses, else str)


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


_SHA: dict = {}


def sha256(path: Path) -> str:
    if path not in _SHA:
        _SHA[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _SHA[path]


def read_table(path: Path) -> Table:
    """A CSV as columns; numeric columns become float arrays. Fields are stripped (LLMCompass uses ', ')."""
    with path.open(newline="") as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh) if r]
    header, body = rows[0], rows[1:]
    out: Table = {}
    for j, name in enumerate(header):
        col = [r[j] for r in body]
        try:
            out[name] = np.array([float(v) for v in col])
        except ValueError:
            out[name] = np.array(col)
    return out


def nrows(t: Table) -> int:
    return len(next(iter(t.values()))) if t else 0


def take(t: Table, mask) -> Table:
    return {k: v[mask] for k, v in t.items()}


# ----------------------------------------------------------------------------------------------
# Filters: one per broken subset named in a PROVENANCE.md
# ----------------------------------------------------------------------------------------------

def _table_filter(fn):
    """A table-returning version of a costmodel.datasets.filters filter (which returns a mask and a count)."""
    def apply(t: Table, *args) -> Table:
        keep, _ = fn(t, *args)
        return take(t, keep)
    apply.__name__, apply.__doc__ = fn.__name__, fn.__doc__
    return apply


filter_ett_perlmutter_inter_node = _table_filter(_filters.filter_ett_perlmutter_inter_node)
filter_ett_vista_allgather_large_4_8_nodes = _table_filter(_filters.filter_ett_vista_allgather_large_4_8_nodes)
filter_ett_vista_flash_atten_backward = _table_filter(_filters.filter_ett_vista_flash_atten_backward)
filter_ett_res_add_backward = _table_filter(_filters.filter_ett_res_add_backward)
filter_aic_default_attention_kernel = _table_filter(_filters.filter_aic_default_attention_kernel)


# ----------------------------------------------------------------------------------------------
# Samples
# ----------------------------------------------------------------------------------------------

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


def _src(data: Path, path: Path, before: int, after: int, filters=()) -> Source:
    return Source(str(path.relative_to(data)), sha256(path), before, after, list(filters))


def _one(data: Path, pattern: str) -> Path | None:
    hits = sorted(data.glob(pattern))
    return hits[0] if hits else None


# --- GEMMs ---------------------------------------------------------------------------------------

ETT_LINEAR_SHAPES = {
    # estimate-train-time/PROVENANCE.md table: m = l·b always; (k, n) per file
    "linear1": lambda mp, dim: (dim, 3 * dim / mp),
    "linear2": lambda mp, dim: (dim / mp, dim),
    "linear3": lambda mp, dim: (dim, 4 * dim / mp),
    "linear4": lambda mp, dim: (4 * dim / mp, dim),
}


def gemm_samples(data: Path, gpu: str, dtype: str) -> Samples:
    """aiconfigurator GEMMs (bf16 / fp8 per-tensor) and estimate-train-time linear1-4 (fp16, bf16 table).

    estimate-train-time backward rows count 2× the forward FLOPs and bytes (dgrad + wgrad).
    linear_final is not used: its padded vocabulary size is not stated in the data.
    """
    s = Samples()
    info = MEASURED_GPUS[gpu]
    if "aic" in info:
        p = _one(data, f"aiconfigurator/gemm/{info['aic']}_{dtype}_gemm__*.csv")
        if p is not None:
            t = read_table(p)
            m, n, k = t["m"], t["n"], t["k"]
            s.add(gemm_flops(m, n, k), gemm_bytes(m, n, k, dtype), t["latency_ms"] * 1e-3,
                  _src(data, p, nrows(t), nrows(t)))
    if "ett" in info and dtype == "bf16":
        for name, shape in ETT_LINEAR_SHAPES.items():
            sysname = info["ett"]
            p = data / f"estimate-train-time/{sysname}/operator/{ETT_GPU_STRING[sysname]}_{name}_fp16.csv"
            t = read_table(p)
            m = t["l"] * t["b"]
            k, n = shape(t["mp"], t["dim"])
            f, b = gemm_flops(m, n, k), gemm_bytes(m, n, k, "fp16")
            s.add(f, b, t["F_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(t)))
            s.add(2 * f, 2 * b, t["B_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(t)))
    return s


def fit_gemm_table(flops, nbytes, time_s, peak: float, hbm_bw: float, launch_s: float) -> dict:
    """Efficiency table over log2(FLOPs) buckets, a memory efficiency and a launch floor.

    Per row the achieved compute efficiency is flops / (peak · (t − launch)). Bucket b holds rows
    with floor(log2 flops) = b; its efficiency is the median over the bucket's compute-bound rows
    (ideal compute time ≥ ideal memory time) when it has ≥ 20 of them, else over all its rows.
    Buckets with < MIN_BUCKET_ROWS rows are dropped. Efficiencies are capped at 1 and then raised,
    from the largest bucket down, so that eff[i] ≥ eff[i+1] / 2: with log-linear interpolation
    this keeps t = flops / (peak·eff) non-decreasing in flops. ``mem_eff`` is the median of
    bytes / (hbm_bw · (t − launch)) over memory-bound rows (ideal memory time > 2 × ideal compute).
    """
    dt = np.maximum(time_s - launch_s, 0.05 * time_s)
    eff_row = flops / (peak * dt)
    mem_row = nbytes / (hbm_bw * dt)
    tc, tm = flops / peak, nbytes / hbm_bw
    bucket = np.floor(np.log2(flops)).astype(int)
    centres, effs, counts = [], [], []
    for b in np.unique(bucket):
        sel = bucket == b
        if sel.sum() < MIN_BUCKET_ROWS:
            continue
        cb = sel & (tc >= tm)
        use = cb if cb.sum() >= 20 else sel
        centres.append(b + 0.5)
        effs.append(min(1.0, float(np.median(eff_row[use]))))
        counts.append(int(sel.sum()))
    _enforce_monotone_time(centres, effs)
    mb = tm > 2 * tc
    mem_eff = min(1.0, float(np.median(mem_row[mb]))) if mb.sum() >= MIN_BUCKET_ROWS else None
    return {"log2_flops": centres, "eff": effs, "rows_per_bucket": counts, "mem_eff": mem_eff,
            "launch_latency_us": launch_s * 1e6}


def _enforce_monotone_time(centres: list, effs: list) -> None:
    """Raise small-bucket efficiencies (largest bucket down) so that eff[i] ≥ eff[i+1]·(1+MONO_MARGIN)/2^Δ:
    with log-linear interpolation, t = flops/(peak·eff) then strictly increases with flops, also after
    the table's rounding to 4 significant digits."""
    for i in range(len(effs) - 2, -1, -1):
        effs[i] = min(1.0, max(effs[i], effs[i + 1] * (1 + MONO_MARGIN) / 2 ** (centres[i + 1] - centres[i])))


def table_error(entry: dict, flops, nbytes, time_s, peak, hbm_bw) -> dict:
    """Median and 90th-percentile |predicted/measured − 1| of the roofline on the fitted rows."""
    x = np.log2(flops)
    eff = np.exp(np.interp(x, entry["log2_flops"], np.log(entry["eff"])))
    pred = np.maximum(flops / (peak * eff), nbytes / (hbm_bw * entry["mem_eff"])) + entry["launch_latency_us"] * 1e-6
    r = np.abs(pred / time_s - 1)
    return {"median_abs_rel_err": float(np.median(r)), "p90_abs_rel_err": float(np.percentile(r, 90))}


# --- attention -----------------------------------------------------------------------------------

def attention_samples(data: Path, gpu: str) -> tuple[Samples, Samples]:
    """(forward samples, backward samples): aiconfigurator context attention (causal fwd) and
    estimate-train-time flash_atten (non-causal, heads h/mp, head_dim dim/h)."""
    fwd, bwd = Samples(), Samples()
    info = MEASURED_GPUS[gpu]
    if "aic" in info:
        p = _one(data, f"aiconfigurator/context_attention/{info['aic']}_bf16_context_attention__*.csv")
        t0 = read_table(p)
        t = filter_aic_default_attention_kernel(t0, info["aic"])
        b, s, h, hkv, d = t["batch_size"], t["isl"], t["num_heads"], t["num_key_value_heads"], t["head_dim"]
        fwd.add(attention_fwd_flops(b, s, s, h, d, 1), attention_bytes(b, s, s, h, hkv, d), t["latency_ms"] * 1e-3,
                _src(data, p, nrows(t0), nrows(t), ["filter_aic_default_attention_kernel"]))
    if "ett" in info:
        sysname = info["ett"]
        p = data / f"estimate-train-time/{sysname}/operator/{ETT_GPU_STRING[sysname]}_flash_atten_fp16.csv"
        t = read_table(p)
        b, heads, s, d = t["b"], t["h"] / t["mp"], t["l"], t["dim"] / t["h"]
        f, by = attention_fwd_flops(b, s, s, heads, d, 0), attention_bytes(b, s, s, heads, heads, d)
        fwd.add(f, by, t["F_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(t)))
        tb, filters = t, []
        if sysname == "Vista":
            tb, filters = filter_ett_vista_flash_atten_backward(t), ["filter_ett_vista_flash_atten_backward"]
        # backward samples carry the forward time in the 'bytes' slot, for the bwd/fwd time ratio
        fb = attention_fwd_flops(tb["b"], tb["l"], tb["l"], tb["h"] / tb["mp"], tb["dim"] / tb["h"], 0)
        bwd.add(fb, tb["F_dur(us)"] * 1e-6, tb["B_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(tb), filters))
    return fwd, bwd


# --- memory-bound operators ----------------------------------------------------------------------

def memory_samples(data: Path, gpu: str) -> dict[str, dict[str, Samples]]:
    """Bytes moved and times of memory-bound operators: kind -> variant (dataset:operator) -> samples.

    Byte counts follow :func:`costmodel.cost.roofline.mem_bytes`; vidur's gated activation reads 2F
    and writes F; estimate-train-time's embedding backward is not used (its dense weight-gradient
    traffic depends on the padded vocabulary, not stated in the data).
    """
    out: dict[str, dict[str, Samples]] = {}
    info = MEASURED_GPUS[gpu]
    if "ett" in info:
        sysname = info["ett"]
        base = data / f"estimate-train-time/{sysname}/operator/{ETT_GPU_STRING[sysname]}_"
        for fname, kind in (("layernorm", "norm"), ("RMSlayernorm", "norm"), ("gelu", "activation"),
                            ("RoPE", "rope"), ("res_add", "residual_add"), ("embedding", "embedding"),
                            ("parallel_cross_entropy_128", "cross_entropy")):
            p = Path(f"{base}{fname}_fp16.csv")
            t = read_table(p)
            v = out.setdefault(kind, {}).setdefault(f"estimate-train-time:{fname}", Samples())
            mp = t["mp"] if "mp" in t else 1.0
            tokens = t["b"] * t["l"]
            if kind == "norm":
                e = tokens * t["dim"]
                fb, bb = 2 * e * 2, 3 * e * 2
            elif kind == "activation":
                e = tokens * 4 * t["dim"] / mp
                fb, bb = 2 * e * 2, 3 * e * 2
            elif kind == "rope":
                e = tokens * t["dim"] / mp
                fb = bb = 2 * e * 2
            elif kind == "residual_add":
                fb = bb = 3 * tokens * t["dim"] * 2
            elif kind == "embedding":
                fb, bb = 2 * tokens * t["dim"] * 2, None
            else:  # cross entropy: vocab 50257 (estimate-train-time PROVENANCE) sharded by mp
                fb = bb = 2 * tokens * (50257 / mp) * 2
            v.add(0.0, fb, t["F_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(t)))
            if kind == "residual_add":
                tb = filter_ett_res_add_backward(t)
                v.add(0.0, bb[:0], tb["B_dur(us)"] * 1e-6,
                              _src(data, p, nrows(t), nrows(tb), ["filter_ett_res_add_backward"]))
            elif bb is not None:
                v.add(0.0, bb, t["B_dur(us)"] * 1e-6, _src(data, p, nrows(t), nrows(t)))
    if "vidur" in info:
        for p in sorted((data / "vidur" / "compute" / info["vidur"]).glob("*/*/mlp.csv")):
            t = read_table(p)
            tp, tok, emb = t["num_tensor_parallel_workers"], t["num_tokens"], t["n_embd"]
            gated = np.array([str(v).lower() == "true" for v in t["use_gated_mlp"]])
            hd = emb / t["n_head"]
            ops = {
                "input_layernorm": ("norm", 2 * tok * emb * 2),
                "post_attention_layernorm": ("norm", 2 * tok * emb * 2),
                "mlp_act": ("activation", np.where(gated, 3, 2) * tok * t["n_expanded_embd"] / tp * 2),
                "attn_rope": ("rope", 2 * tok * (t["n_head"] + t["n_kv_head"]) / tp * hd * 2),
                "add": ("residual_add", 3 * tok * emb * 2),
                "emb": ("embedding", 2 * tok * emb * 2),
            }
            for col, (kind, nb) in ops.items():
                if f"time_stats.{col}.median" not in t:  # e.g. phi-2 has no separate post-attention norm
                    continue
                out.setdefault(kind, {}).setdefault(f"vidur:{col}", Samples()).add(0.0, nb, t[f"time_stats.{col}.median"] * 1e-3, _src(data, p, nrows(t), nrows(t)))
    return out


def fit_memory(s: Samples, hbm_bw: float, launch_s: float) -> dict | None:
    """Median of bytes / (hbm_bw · (t − launch)) over rows moving ≥ MEM_MIN_BYTES, capped at 1."""
    _, nb, t = s.arrays()
    sel = (nb >= MEM_MIN_BYTES) & (t > launch_s)
    if sel.sum() < MIN_BUCKET_ROWS:
        return None
    eff = nb[sel] / (hbm_bw * (t[sel] - launch_s))
    pred = nb[sel] / (hbm_bw * min(1.0, float(np.median(eff)))) + launch_s
    return {"eff": min(1.0, float(np.median(eff))), "rows_used": int(sel.sum()),
            "median_abs_rel_err": float(np.median(np.abs(pred / t[sel] - 1))),
            "method": f"median of bytes/(hbm_bw*(t-launch)) over rows with bytes >= {MEM_MIN_BYTES} and t > launch",
            "sources": [x.as_dict() for x in s.sources]}


def llmcompass_spot_check(data: Path, hbm_bw: float) -> dict:
    """A100 LayerNorm / GELU achieved HBM fraction from LLMCompass (throughput in G elements/s)."""
    out = {}
    for name, per_elem in (("layernorm", 2 * 2), ("gelu", 2 * 2)):
        p = data / f"llmcompass-a100/{name}_A100.csv"
        t = read_table(p)
        elems = t["M"] * t["N"] if "N" in t else t["M"]
        bw = t["throughput_Gelem_per_s"] * 1e9 * per_elem
        sel = elems * per_elem >= MEM_MIN_BYTES
        out[name] = {"eff": float(np.median(bw[sel]) / hbm_bw), "rows_used": int(sel.sum()),
                     "sources": [_src(data, p, nrows(t), nrows(t)).as_dict()]}
    return out


# --- collectives ---------------------------------------------------------------------------------

def fit_alpha_beta(nbytes, time_s, factor: float, link_bw: float) -> dict:
    """Least squares of t = alpha + factor·bytes/(link_bw·eff), each row weighted by 1/t (relative error),
    on messages ≥ LARGE_MESSAGE_BYTES; alpha < 0 is set to 0 and the slope refitted. eff capped at 1."""
    sel = nbytes >= LARGE_MESSAGE_BYTES
    x, t = factor * nbytes[sel] / link_bw, time_s[sel]
    w = 1.0 / t
    (alpha, slope), *_ = np.linalg.lstsq(np.vstack([w, x * w]).T, t * w, rcond=None)
    if alpha < 0:
        alpha, slope = 0.0, float(np.sum(x * w * t * w) / np.sum((x * w) ** 2))
    eff = min(1.0, 1.0 / slope)
    pred = alpha + x / eff
    return {"alpha_us": float(alpha) * 1e6, "eff": eff, "rows_used": int(sel.sum()),
            "min_latency_us": float(time_s.min()) * 1e6, "method": "1/t-weighted least squares, bytes >= 1 MiB",
            "median_abs_rel_err": float(np.median(np.abs(pred / t - 1)))}


def fit_bandwidth_only(nbytes, time_s, factor: float, link_bw: float) -> dict:
    """eff = median over rows of busbw / link_bw, alpha = 0.

    For estimate-train-time, whose messages start at 40 MiB ("no small-message / latency regime",
    its PROVENANCE.md): alpha is not identifiable there, and the median resists the slow outlier
    rows (contention) seen in some files. The roofline floors alpha at the cluster's latency figure.
    """
    eff_row = factor * nbytes / link_bw / time_s
    eff = min(1.0, float(np.median(eff_row)))
    pred = factor * nbytes / (link_bw * eff)
    return {"alpha_us": 0.0, "eff": eff, "rows_used": int(len(time_s)), "min_latency_us": float(time_s.min()) * 1e6,
            "method": "median busbw/link_bw, alpha = 0 (no latency regime in the data)",
            "median_abs_rel_err": float(np.median(np.abs(pred / time_s - 1)))}


def aic_collectives(data: Path, gpu: str, link_bw: float) -> dict:
    info = MEASURED_GPUS[gpu]
    out: dict = {}
    if "aic" not in info:
        return out
    p = _one(data, f"aiconfigurator/nccl/{info['aic']}_nccl_fp16__*.csv")
    t = read_table(p)
    for raw, op in AIC_NCCL_OPS.items():
        for n in sorted(set(t["num_gpus"].astype(int))):
            sel = (t["op_name"] == raw) & (t["num_gpus"] == n)
            if not sel.any():
                continue
            fit = fit_alpha_beta(2 * t["message_size"][sel], t["latency_ms"][sel] * 1e-3, float(busbw_factor(op, n)), link_bw)
            fit["sources"] = [_src(data, p, nrows(t), int(sel.sum())).as_dict()]
            fit["link_bw_gbs"] = link_bw / 1e9
            out.setdefault(op, {})[str(n)] = fit
    return out


def vidur_send_recv(data: Path, gpu: str, link_bw: float) -> dict:
    """vidur DGX send_recv between two GPUs of one node (devices_per_node 2); size in bytes, time ms.
    (vidur PROVENANCE: h100_pairwise_nvlink/send_recv is a copy of the A100 file — not read.)"""
    folder = {"a100-80gb": "a100_dgx", "h100-sxm": "h100_dgx"}.get(gpu)
    if folder is None:
        return {}
    p = data / f"vidur/network/{folder}/send_recv.csv"
    t = read_table(p)
    sel = (t["num_workers"] == 2) & (t["devices_per_node"] == 2)
    fit = fit_alpha_beta(t["size"][sel], t["time_stats.send_recv.median"][sel] * 1e-3, 1.0, link_bw)
    fit["sources"] = [_src(data, p, nrows(t), int(sel.sum())).as_dict()]
    fit["link_bw_gbs"] = link_bw / 1e9
    return {"send_recv": {"2": fit}}


def vidur_inter_node_alpha(data: Path) -> dict:
    """Inter-node small-message latency: median time of messages ≤ 64 KiB between two A100 DGX nodes
    (vidur a100_dgx, num_workers 2, devices_per_node 1). Only the latency is used: vidur's PROVENANCE
    says the inter-node bandwidth is low and the NIC setup unknown. all_reduce's value serves every
    inter-node collective except send_recv."""
    out = {}
    for op in ("all_reduce", "send_recv"):
        p = data / f"vidur/network/a100_dgx/{op}.csv"
        t = read_table(p)
        sel = (t["num_workers"] == 2) & (t["devices_per_node"] == 1) & (t["size"] <= 65536)
        out[op] = {"alpha_us": float(np.median(t[f"time_stats.{op}.median"][sel])) * 1e3,
                   "method": "median latency of messages <= 64 KiB, 2 nodes x 1 GPU",
                   "sources": [_src(data, p, nrows(t), int(sel.sum())).as_dict()]}
    return out


def ett_collectives(data: Path, sysname: str, link_bw: float) -> dict:
    """estimate-train-time NCCL rows (shape = fp16 elements; all-gather shape is the per-rank input,
    so the nccl-tests-convention buffer is 2·shape·ranks bytes). Intra-node for Perlmutter (after
    :func:`filter_ett_perlmutter_inter_node`), inter-node for Vista (1 GPU per node)."""
    out: dict = {}
    folder = data / f"estimate-train-time/{sysname}/nccl"
    for prefix, op in (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("p2p", "send_recv")):
        groups: dict = {}
        for p in sorted(folder.glob(f"{ETT_GPU_STRING[sysname]}_{prefix}_*fp16_*_*.csv")):
            if prefix == "allreduce" and "_allreduce_fp16_" not in p.name and "_allreduce_large_fp16_" not in p.name:
                continue
            t0 = read_table(p)
            t, filters = t0, []
            if sysname == "Perlmutter":
                t, filters = filter_ett_perlmutter_inter_node(t), ["filter_ett_perlmutter_inter_node"]
            if sysname == "Vista" and op == "all_gather":
                t, filters = filter_ett_vista_allgather_large_4_8_nodes(t), ["filter_ett_vista_allgather_large_4_8_nodes"]
            if not nrows(t):
                continue
            ranks = int(t["nodes"][0] * t["GPUsPerNode"][0])
            nb = 2 * t["shape"] * (ranks if op == "all_gather" else 1)
            g = groups.setdefault(ranks, ([], [], []))
            g[0].append(nb)
            g[1].append(t["dur(us)"] * 1e-6)
            g[2].append(_src(data, p, nrows(t0), nrows(t), filters).as_dict())
        for ranks, (nbs, ts, srcs) in sorted(groups.items()):
            n = 2 if op == "send_recv" else ranks
            fit = fit_bandwidth_only(np.concatenate(nbs), np.concatenate(ts), float(busbw_factor(op, n)), link_bw)
            fit["sources"] = srcs
            fit["link_bw_gbs"] = link_bw / 1e9
            out.setdefault(op, {})[str(n)] = fit
    return out


# ----------------------------------------------------------------------------------------------
# Hardware denominators (shared/data/hardware/*.yaml)
# ----------------------------------------------------------------------------------------------

def denominators(data: Path) -> dict:
    """Peak FLOP/s, HBM and link bandwidths used as denominators, read from the catalogue YAML."""
    gpus = yaml.safe_load((data / "hardware/gpus.yaml").read_text())["gpus"]
    clusters = yaml.safe_load((data / "hardware/clusters.yaml").read_text())["systems"]
    out = {}
    for name, info in {**{k: v["yaml"] for k, v in MEASURED_GPUS.items()}, **UNMEASURED_GPUS}.items():
        g = gpus[info]
        out[name] = {"yaml_key": info, "bf16_tflops": g["bf16_dense_tflops"], "fp8_tflops": g.get("fp8_dense_tflops"),
                     "hbm_bw_gbs": g["hbm_bw_gbytes_s"],
                     "intra_node_bw_gbs": g.get("nvlink_bw_gbytes_s_per_gpu_unidirectional")}
    out["gh200"]["inter_node_bw_gbs"] = clusters["tacc_vista_gh"]["inter_node"]["nic_gbytes_s_per_gpu"]
    out["gh200"]["inter_node_bw_source"] = "clusters.yaml tacc_vista_gh.inter_node.nic_gbytes_s_per_gpu"
    out["a100-80gb"]["perlmutter_intra_node_bw_gbs"] = \
        clusters["nersc_perlmutter_gpu"]["intra_node"]["nvlink_bw_gbytes_s_per_gpu_unidirectional"]
    for k, v in out.items():
        v["yaml_file"] = "hardware/gpus.yaml"
    return out


# ----------------------------------------------------------------------------------------------
# Assembly
# ----------------------------------------------------------------------------------------------

def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def fit_gpu(data: Path, gpu: str, den: dict, default_launch_s: float) -> dict:
    d = den[gpu]
    hbm = d["hbm_bw_gbs"] * 1e9
    entry: dict = {"source": "measured", "denominators": d}
    own_floor = None
    gemm = {}
    for dtype in ("bf16", "fp8"):
        s = gemm_samples(data, gpu, dtype)
        f, b, t = s.arrays()
        if not len(t):
            continue
        peak = d[f"{dtype}_tflops"] * 1e12
        aic_rows = len(s.time_s[0]) if "aic" in MEASURED_GPUS[gpu] else 0
        floor = float(s.time_s[0].min()) if aic_rows else None
        if dtype == "bf16":
            own_floor = floor
        launch = floor if floor is not None else default_launch_s
        fit = fit_gemm_table(f, b, t, peak, hbm, launch)
        fit.update(table_error(fit, f, b, t, peak, hbm))
        fit["launch_source"] = ("smallest measured latency in this table" if floor is not None
                                else "default: median of measured GPUs' bf16 GEMM floors")
        fit["method"] = "log2(FLOPs) bucket medians, costmodel.efficiency.fit_gemm_table"
        fit["rows"] = int(len(t))
        fit["sources"] = [x.as_dict() for x in s.sources]
        gemm[dtype] = fit
    entry["gemm"] = gemm
    launch_s = own_floor if own_floor is not None else default_launch_s
    entry["launch_latency_us"] = {"value": launch_s * 1e6,
                                  "source": ("smallest bf16 GEMM latency in aiconfigurator (CUDA-graph replay)"
                                             if own_floor is not None else "default: median of measured GPUs")}
    # attention
    fwd, bwd = attention_samples(data, gpu)
    f, b, t = fwd.arrays()
    peak = d["bf16_tflops"] * 1e12
    att = fit_gemm_table(f, b, t, peak, hbm, launch_s)
    att.update(table_error({**att, "mem_eff": gemm["bf16"]["mem_eff"]}, f, b, t, peak, hbm))
    att.pop("mem_eff")
    att.pop("launch_latency_us")
    att.update(method="log2(FLOPs) bucket medians of fused-attention forward; causal FLOPs halved",
               rows=int(len(t)), sources=[x.as_dict() for x in fwd.sources])
    entry["attention_fwd"] = att
    _, tf, tb = bwd.arrays()
    if len(tb):
        r = tb / tf
        entry["attention_bwd_fwd_ratio"] = {
            "value": float(np.median(r)), "p10": float(np.percentile(r, 10)), "p90": float(np.percentile(r, 90)),
            "rows": int(len(r)), "method": "median of B_dur/F_dur, flash_attn_func non-causal fp16",
            "sources": [x.as_dict() for x in bwd.sources]}
    else:
        entry["attention_bwd_fwd_ratio_unavailable"] = {"sources": [x.as_dict() for x in bwd.sources]}
    # memory-bound
    mem = {}
    for kind, variants in sorted(memory_samples(data, gpu).items()):
        fits = {name: fit_memory(s, hbm, launch_s) for name, s in sorted(variants.items())}
        fits = {k: v for k, v in fits.items() if v is not None}
        if fits:
            mem[kind] = {"eff": _median([f["eff"] for f in fits.values()]), "variants": fits,
                         "method": "median over variants (dataset:operator) of each variant's efficiency"}
    if gpu == "a100-80gb":
        entry["memory_spot_check_llmcompass"] = llmcompass_spot_check(data, hbm)
    entry["memory"] = mem
    # collectives
    intra = aic_collectives(data, gpu, (d["intra_node_bw_gbs"] or 0) * 1e9)
    intra.update(vidur_send_recv(data, gpu, (d["intra_node_bw_gbs"] or 0) * 1e9))
    coll = {"intra": intra} if intra else {}
    if gpu == "a100-80gb":
        entry["collectives_crosscheck_perlmutter_intra"] = ett_collectives(
            data, "Perlmutter", d["perlmutter_intra_node_bw_gbs"] * 1e9)
    if gpu == "gh200":
        inter = ett_collectives(data, "Vista", d["inter_node_bw_gbs"] * 1e9)
        alphas = vidur_inter_node_alpha(data)
        for op, ns in inter.items():
            for v in ns.values():
                v["alpha_us"] = alphas["send_recv" if op == "send_recv" else "all_reduce"]["alpha_us"]
                v["alpha_source"] = alphas["send_recv" if op == "send_recv" else "all_reduce"]
        for missing in ("reduce_scatter", "all_to_all"):
            inter[missing] = {n: {**v, "substituted_from": "all_gather (no inter-node data for this op)"}
                              for n, v in inter["all_gather"].items()}
        coll["inter"] = inter
    entry["collectives"] = coll
    return entry


def default_entry(gpus: dict) -> dict:
    """Median over the measured GPUs of every efficiency (per bucket, per (op, n))."""
    vals = list(gpus.values())
    out: dict = {"source": "default: median of the GPUs with measured data", "median_of": sorted(gpus)}
    measured_floor = [g["launch_latency_us"]["value"] for g in vals
                      if g["launch_latency_us"]["source"].startswith("smallest")]
    out["launch_latency_us"] = {"value": _median(measured_floor), "median_of": len(measured_floor)}

    def merge_table(entries):
        cen = sorted({c for e in entries for c in e["log2_flops"]})
        effs = [_median([e["eff"][e["log2_flops"].index(c)] for e in entries if c in e["log2_flops"]]) for c in cen]
        _enforce_monotone_time(cen, effs)
        return {"log2_flops": cen, "eff": effs}

    gemm = {}
    for dtype in ("bf16", "fp8"):
        es = [g["gemm"][dtype] for g in vals if dtype in g["gemm"]]
        t = merge_table(es)
        t.update(mem_eff=_median([e["mem_eff"] for e in es]),
                 launch_latency_us=_median([e["launch_latency_us"] for e in es if e["launch_source"].startswith("smallest")]),
                 median_of=len(es))
        gemm[dtype] = t
    out["gemm"] = gemm
    out["attention_fwd"] = merge_table([g["attention_fwd"] for g in vals])
    rs = [g["attention_bwd_fwd_ratio"]["value"] for g in vals if "attention_bwd_fwd_ratio" in g]
    out["attention_bwd_fwd_ratio"] = {"value": _median(rs), "median_of": len(rs)}
    kinds = sorted({k for g in vals for k in g["memory"]})
    out["memory"] = {k: {"eff": _median([g["memory"][k]["eff"] for g in vals if k in g["memory"]]),
                         "median_of": sum(k in g["memory"] for g in vals)} for k in kinds}
    # optimizer: no usable measurement of the Adam step alone; median of the elementwise kinds
    elementwise = [out["memory"][k]["eff"] for k in ("norm", "activation", "residual_add", "rope") if k in out["memory"]]
    out["memory"]["optimizer"] = {"eff": _median(elementwise),
                                  "median_of": "default norm/activation/residual_add/rope efficiencies"}
    coll: dict = {}
    for tier in ("intra", "inter"):
        ops = sorted({op for g in vals for op in g["collectives"].get(tier, {})})
        for op in ops:
            ns = sorted({n for g in vals for n in g["collectives"].get(tier, {}).get(op, {})}, key=int)
            for n in ns:
                es = [g["collectives"][tier][op][n] for g in vals if n in g["collectives"].get(tier, {}).get(op, {})]
                coll.setdefault(tier, {}).setdefault(op, {})[n] = {
                    "alpha_us": _median([e["alpha_us"] for e in es]), "eff": _median([e["eff"] for e in es]),
                    "median_of": len(es)}
    out["collectives"] = coll
    return out


def _round(x):
    if isinstance(x, float):
        if x == 0 or not math.isfinite(x):
            return x
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    if isinstance(x, (np.floating,)):
        return _round(float(x))
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def build(data: Path) -> dict:
    den = denominators(data)
    # default launch floor first: the median of the measured bf16 GEMM floors
    floors = []
    for gpu, info in MEASURED_GPUS.items():
        if "aic" in info:
            p = _one(data, f"aiconfigurator/gemm/{info['aic']}_bf16_gemm__*.csv")
            floors.append(float(read_table(p)["latency_ms"].min()) * 1e-3)
    default_launch = float(np.median(floors))
    gpus = {gpu: fit_gpu(data, gpu, den, default_launch) for gpu in MEASURED_GPUS}
    gpus["default"] = default_entry(gpus)
    table = {
        "schema": 1,
        "generated_by": "python -m costmodel.efficiency (costmodel/efficiency.py)",
        "conventions": {
            "gemm": "FLOPs 2mnk; bytes = operands + bf16 output; eff = achieved/peak dense FLOP/s",
            "attention": "forward FLOPs 4*b*sq*skv*h*d, halved when causal; bwd time = ratio * fwd time",
            "memory": "bytes read + written of 2-byte tensors (costmodel.cost.roofline.mem_bytes)",
            "collectives": "nccl-tests buffer bytes; eff = busbw / link_bw, busbw factors 2(n-1)/n, (n-1)/n, 1; "
                           "alpha and eff by 1/t-weighted least squares on messages >= 1 MiB",
            "keys": "collectives.<tier>.<op>.<n>: n = GPUs (intra) or nodes (inter)",
        },
        "unmeasured_gpus": {k: {"yaml_key": v, "uses": "default"} for k, v in sorted(UNMEASURED_GPUS.items())},
        "denominators": den,
        "gpus": gpus,
    }
    return _round(table)


def dumps(table: dict) -> str:
    return json.dumps(table, sort_keys=True, indent=1) + "\n"


def main(argv=None) -> int:
    from costmodel.core.paths import require_data_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=None, help="shared/data folder (default: costmodel.core.paths)")
    ap.add_argument("--out", type=Path, default=OUT_DEFAULT)
    args = ap.parse_args(argv)
    data = args.data_dir or require_data_dir()
    text = dumps(build(data))
    from costmodel.core.fileio import atomic_write_text

    atomic_write_text(args.out, text)
    print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
