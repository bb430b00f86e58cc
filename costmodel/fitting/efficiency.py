"""Fit the roofline efficiency table from the public measurements in ``shared/data``.

Run: ``python -m costmodel.fitting.efficiency [--data-dir D] [--out costmodel/data/efficiency.json]``.

What is fitted, per GPU catalogue name with data (methods in detail in costmodel/data/PROVENANCE.md):

* ``gemm.<dtype>``: achieved/peak FLOP/s as a table over log2(FLOPs) buckets (median per bucket),
  plus the GEMM's own memory-bound efficiency and launch floor: see :func:`fit_gemm_table`.
* ``attention_fwd``: the same bucket table for fused attention forward (FLOPs per
  :func:`costmodel.graph.conventions.attention_fwd_flops`); ``attention_bwd_fwd_ratio``.
* ``memory.<kind>``: achieved fraction of HBM bandwidth for memory-bound operators.
* ``collectives.{intra,inter}.<op>.<n>``: alpha (µs) and bus-bandwidth efficiency.
* ``launch_latency_us``: the smallest measured bf16 GEMM latency (a measured kernel floor).

GPUs without data use the ``default`` entry: the median over the GPUs with data.
Every entry lists its source files (SHA-256, rows before/after filtering, filters applied).
The rows come from the imported datasets (:func:`costmodel.fitting.datasets.importers.import_all`, gathered per
fit by :mod:`costmodel.fitting.efficiency_samples`): the importers' header checks, GPU name maps and the
``filter_*`` functions of :mod:`costmodel.fitting.datasets.filters` (the broken subsets named in the data's
PROVENANCE.md files) apply to the fit as they do to the datasets.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import yaml

from costmodel.core.fileio import atomic_write_text
from costmodel.core.paths import require_data_dir
from costmodel.fitting.datasets.importers import AIC_NCCL_OPS, VIDUR_NETWORK_GPU, import_all
from costmodel.fitting.efficiency_samples import (
    AIC,
    ETT,
    LLMCOMPASS_GPU,
    VIDUR,
    Datasets,
    Samples,
    attention_samples,
    ett_gpu,
    gemm_samples,
    llmcompass_memory_rows,
    memory_samples,
    source_rows,
)
from costmodel.graph.conventions import busbw_factor

OUT_DEFAULT = Path(__file__).resolve().parents[1] / "data" / "efficiency.json"

MEASURED_GPUS = {"a100-80gb": "a100_80gb_sxm", "h100-sxm": "h100_sxm_80gb", "h200": "h200_sxm_141gb",
                 "gh200": "gh200_96gb_hbm3", "b200": "b200_sxm", "gb200": "gb200_nvl72_gpu"}
"""Catalogue GPUs with measurements in shared/data -> their key in hardware/gpus.yaml (the denominators).
Which source measured which GPU is the importers' business (their name maps)."""
# Catalogue GPUs with no measurements in shared/data: they get the ``default`` entry.
UNMEASURED_GPUS = {"a100-40gb": "a100_40gb_sxm", "h100-pcie": "h100_pcie_80gb",
                   "gh200-144gb": "gh200_144gb_hbm3e", "mi300x": "mi300x"}
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
# GEMM and attention tables
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Memory-bound operators
# ----------------------------------------------------------------------------------------------

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
    per_elem = 2 * 2
    for name, (elems, elem_per_s, src) in llmcompass_memory_rows(data).items():
        bw = elem_per_s * per_elem
        sel = elems * per_elem >= MEM_MIN_BYTES
        out[name] = {"eff": float(np.median(bw[sel]) / hbm_bw), "rows_used": int(sel.sum()),
                     "sources": [src.as_dict()]}
    return out


# ----------------------------------------------------------------------------------------------
# Collectives
# ----------------------------------------------------------------------------------------------

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

def aic_collectives(datasets: Datasets, gpu: str, link_bw: float) -> dict:
    """aiconfigurator single-node NCCL sweeps: one alpha-beta fit per (op, number of GPUs)."""
    out: dict = {}
    for op in AIC_NCCL_OPS.values():
        for r in source_rows(datasets, op, gpu, AIC):
            ranks = r.features["ranks"]
            for n in sorted(set(ranks.astype(int))):
                sel = ranks == n
                fit = fit_alpha_beta(r.features["bytes"][sel], r.time_s[sel], float(busbw_factor(op, n)), link_bw)
                fit["sources"] = [r.source(int(sel.sum())).as_dict()]
                fit["link_bw_gbs"] = link_bw / 1e9
                out.setdefault(op, {})[str(n)] = fit
    return out


def vidur_send_recv(datasets: Datasets, gpu: str, link_bw: float) -> dict:
    """vidur DGX send_recv between two GPUs of one node (devices_per_node 2).
    (vidur PROVENANCE: h100_pairwise_nvlink/send_recv is a copy of the A100 file — not imported.)"""
    for r in source_rows(datasets, "send_recv", gpu, VIDUR):
        sel = (r.features["ranks"] == 2) & (r.features["ranks_per_node"] == 2)
        fit = fit_alpha_beta(r.features["bytes"][sel], r.time_s[sel], 1.0, link_bw)
        fit["sources"] = [r.source(int(sel.sum())).as_dict()]
        fit["link_bw_gbs"] = link_bw / 1e9
        return {"send_recv": {"2": fit}}
    return {}


def vidur_inter_node_alpha(datasets: Datasets) -> dict:
    """Inter-node small-message latency: median time of messages ≤ 64 KiB between two A100 DGX nodes
    (vidur a100_dgx, num_workers 2, devices_per_node 1). Only the latency is used: vidur's PROVENANCE
    says the inter-node bandwidth is low and the NIC setup unknown. all_reduce's value serves every
    inter-node collective except send_recv."""
    out = {}
    for op in ("all_reduce", "send_recv"):
        (r,) = source_rows(datasets, op, VIDUR_NETWORK_GPU["a100_dgx"], VIDUR)
        f = r.features
        sel = (f["ranks"] == 2) & (f["ranks_per_node"] == 1) & (f["bytes"] <= 65536)
        out[op] = {"alpha_us": float(np.median(r.time_s[sel])) * 1e6,
                   "method": "median latency of messages <= 64 KiB, 2 nodes x 1 GPU",
                   "sources": [r.source(int(sel.sum())).as_dict()]}
    return out


def ett_collectives(datasets: Datasets, system: str, link_bw: float) -> dict:
    """estimate-train-time NCCL rows (shape = fp16 elements; all-gather shape is the per-rank input,
    so the nccl-tests-convention buffer is 2·shape·ranks bytes). Intra-node for Perlmutter (after
    filter_ett_perlmutter_inter_node), inter-node for Vista (1 GPU per node)."""
    out: dict = {}
    for op in ("all_reduce", "all_gather", "send_recv"):
        groups: dict = {}
        for r in source_rows(datasets, op, ett_gpu(system), ETT):
            if not len(r.time_s):
                continue
            ranks = int(r.features["ranks"][0])
            g = groups.setdefault(ranks, ([], [], []))
            g[0].append(r.features["bytes"])
            g[1].append(r.time_s)
            g[2].append(r.source().as_dict())
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
    for name, info in {**MEASURED_GPUS, **UNMEASURED_GPUS}.items():
        g = gpus[info]
        out[name] = {"yaml_key": info, "bf16_tflops": g["bf16_dense_tflops"], "fp8_tflops": g.get("fp8_dense_tflops"),
                     "hbm_bw_gbs": g["hbm_bw_gbytes_s"],
                     "intra_node_bw_gbs": g.get("nvlink_bw_gbytes_s_per_gpu_unidirectional")}
    out["gh200"]["inter_node_bw_gbs"] = clusters["tacc_vista_gh"]["inter_node"]["nic_gbytes_s_per_gpu"]
    out["gh200"]["inter_node_bw_source"] = "clusters.yaml tacc_vista_gh.inter_node.nic_gbytes_s_per_gpu"
    out["a100-80gb"]["perlmutter_intra_node_bw_gbs"] = \
        clusters["nersc_perlmutter_gpu"]["intra_node"]["nvlink_bw_gbytes_s_per_gpu_unidirectional"]
    for _k, v in out.items():
        v["yaml_file"] = "hardware/gpus.yaml"
    return out


# ----------------------------------------------------------------------------------------------
# Assembly
# ----------------------------------------------------------------------------------------------

def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def _attention_entry(fwd, peak: float, hbm: float, launch_s: float, mem_eff: float) -> dict | None:
    """The fused-attention forward table of one GPU's samples (None without any)."""
    f, b, t = fwd.arrays()
    if not len(t):
        return None
    att = fit_gemm_table(f, b, t, peak, hbm, launch_s)
    att.update(table_error({**att, "mem_eff": mem_eff}, f, b, t, peak, hbm))
    att.pop("mem_eff")
    att.pop("launch_latency_us")
    att.update(method="log2(FLOPs) bucket medians of fused-attention forward; causal FLOPs halved",
               rows=int(len(t)), sources=[x.as_dict() for x in fwd.sources])
    return att


def fit_gpu(datasets: Datasets, data: Path, gpu: str, den: dict, default_launch_s: float) -> dict:
    """One GPU's entry from its imported datasets (``data``: the folder, for the LLMCompass spot check)."""
    d = den[gpu]
    hbm = d["hbm_bw_gbs"] * 1e9
    entry: dict = {"source": "measured", "denominators": d}
    own_floor = None
    gemm = {}
    for dtype in ("bf16", "fp8"):
        s, floor = gemm_samples(datasets, gpu, dtype)
        f, b, t = s.arrays()
        if not len(t):
            continue
        peak = d[f"{dtype}_tflops"] * 1e12
        if dtype == "bf16":
            own_floor = floor
        launch = floor if floor is not None else default_launch_s
        fit = fit_gemm_table(f, b, t, peak, hbm, launch)
        fit.update(table_error(fit, f, b, t, peak, hbm))
        fit["launch_source"] = ("smallest measured latency in this table" if floor is not None
                                else "default: median of measured GPUs' bf16 GEMM floors")
        fit["method"] = "log2(FLOPs) bucket medians, costmodel.fitting.efficiency.fit_gemm_table"
        fit["rows"] = int(len(t))
        fit["sources"] = [x.as_dict() for x in s.sources]
        gemm[dtype] = fit
    entry["gemm"] = gemm
    launch_s = own_floor if own_floor is not None else default_launch_s
    entry["launch_latency_us"] = {"value": launch_s * 1e6,
                                  "source": ("smallest bf16 GEMM latency in aiconfigurator (CUDA-graph replay)"
                                             if own_floor is not None else "default: median of measured GPUs")}
    # attention
    fwd, bwd = attention_samples(datasets, gpu)
    att = _attention_entry(fwd, d["bf16_tflops"] * 1e12, hbm, launch_s, gemm["bf16"]["mem_eff"]) \
        if "bf16" in gemm else None
    if att is not None:  # no fused-basis attention rows (GH200: FlashAttention-2 only): the default entry applies
        entry["attention_fwd"] = att
    _, tf, tb = bwd.arrays()
    if len(tb):
        r = tb / tf
        entry["attention_bwd_fwd_ratio"] = {
            "value": float(np.median(r)), "p10": float(np.percentile(r, 10)), "p90": float(np.percentile(r, 90)),
            "rows": int(len(r)), "method": "median of B_dur/F_dur, flash_attn_func non-causal fp16",
            "sources": [x.as_dict() for x in bwd.sources]}
    elif bwd.sources:
        entry["attention_bwd_fwd_ratio_unavailable"] = {"sources": [x.as_dict() for x in bwd.sources]}
    # memory-bound
    mem = {}
    for kind, variants in sorted(memory_samples(datasets, gpu).items()):
        fits = {name: mem_fit for name, s in sorted(variants.items())
                if (mem_fit := fit_memory(s, hbm, launch_s)) is not None}
        if fits:
            mem[kind] = {"eff": _median([f["eff"] for f in fits.values()]), "variants": fits,
                         "method": "median over variants (dataset:operator) of each variant's efficiency"}
    if gpu == LLMCOMPASS_GPU:
        entry["memory_spot_check_llmcompass"] = llmcompass_spot_check(data, hbm)
    entry["memory"] = mem
    # collectives
    intra = aic_collectives(datasets, gpu, (d["intra_node_bw_gbs"] or 0) * 1e9)
    intra.update(vidur_send_recv(datasets, gpu, (d["intra_node_bw_gbs"] or 0) * 1e9))
    coll = {"intra": intra} if intra else {}
    if gpu == ett_gpu("Perlmutter"):
        entry["collectives_crosscheck_perlmutter_intra"] = ett_collectives(
            datasets, "Perlmutter", d["perlmutter_intra_node_bw_gbs"] * 1e9)
    if gpu == ett_gpu("Vista"):
        inter = ett_collectives(datasets, "Vista", d["inter_node_bw_gbs"] * 1e9)
        alphas = vidur_inter_node_alpha(datasets)
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
                 launch_latency_us=_median([e["launch_latency_us"] for e in es
                                            if e["launch_source"].startswith("smallest")]),
                 median_of=len(es))
        gemm[dtype] = t
    out["gemm"] = gemm
    out["attention_fwd"] = merge_table([g["attention_fwd"] for g in vals if "attention_fwd" in g])
    rs = [g["attention_bwd_fwd_ratio"]["value"] for g in vals if "attention_bwd_fwd_ratio" in g]
    out["attention_bwd_fwd_ratio"] = {"value": _median(rs), "median_of": len(rs)}
    kinds = sorted({k for g in vals for k in g["memory"]})
    out["memory"] = {k: {"eff": _median([g["memory"][k]["eff"] for g in vals if k in g["memory"]]),
                         "median_of": sum(k in g["memory"] for g in vals)} for k in kinds}
    # optimizer: no usable measurement of the Adam step alone; cross entropy: no fused-kernel measurement
    # (estimate-train-time's is an eager chain, costmodel.graph.kernel_basis); median of the elementwise kinds
    elementwise = [out["memory"][k]["eff"] for k in ("norm", "activation", "residual_add", "rope")
                   if k in out["memory"]]
    for kind in ("optimizer", "cross_entropy") if elementwise else ():
        out["memory"].setdefault(kind, {"eff": _median(elementwise),
                                        "median_of": "default norm/activation/residual_add/rope efficiencies"})
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


def build(data: Path, datasets: Datasets | None = None) -> dict:
    """The efficiency table from the data folder's imported datasets (``datasets``: import_all(data), when
    the caller has them already)."""
    data = Path(data)
    if datasets is None:
        datasets = import_all(data)
    den = denominators(data)
    # default launch floor first: the median of the measured bf16 GEMM floors (aiconfigurator)
    floors = [floor for gpu in MEASURED_GPUS if (floor := gemm_samples(datasets, gpu, "bf16")[1]) is not None]
    default_launch = float(np.median(floors))
    gpus = {gpu: fit_gpu(datasets, data, gpu, den, default_launch) for gpu in MEASURED_GPUS}
    gpus["default"] = default_entry(gpus)
    table = {
        "schema": 1,
        "generated_by": "python -m costmodel.fitting.efficiency (costmodel/fitting/efficiency.py)",
        "conventions": {
            "gemm": "FLOPs 2mnk; bytes = operands + bf16 output; eff = achieved/peak dense FLOP/s",
            "attention": "forward FLOPs 4*b*sq*skv*h*d, halved when causal; bwd time = ratio * fwd time",
            "memory": "bytes read + written of 2-byte tensors (costmodel.graph.conventions.mem_bytes)",
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=None, help="shared/data folder (default: costmodel.core.paths)")
    ap.add_argument("--out", type=Path, default=OUT_DEFAULT)
    args = ap.parse_args(argv)
    data = args.data_dir or require_data_dir()
    text = dumps(build(data))
    atomic_write_text(args.out, text)
    print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
