"""Attention kernels of the framework that runs a plan: FlashAttention-2 where the stack calls it.

The per-GPU attention models measure one kernel each: on Hopper the forward comes from aiconfigurator's
context FMHA (TensorRT-LLM, close to the cuDNN fused attention Transformer Engine calls in Megatron), on
Ampere from estimate-train-time's ``flash_attn_func`` (FlashAttention-2). PyTorch-native stacks (FSDP,
torchtitan) and DeepSpeed call FlashAttention-2 (``F.scaled_dot_product_attention``'s flash backend,
or ``flash_attn``), which on Hopper reaches about 60 % of the fused kernels' rate (Shah et al.,
FlashAttention-3, arXiv:2407.08608, sec. 4.1: FA2 uses none of Hopper's TMA/WGMMA).

This module costs FlashAttention-2 from its own measurements on each GPU die:

* forward: ``t = flops / rate(head_dim, seq)``, the median achieved rate of estimate-train-time's
  ``flash_atten`` rows (non-causal ``flash_attn_func``, fp16) at that head dim and sequence length;
  causal attention is costed at the non-causal rate on its (halved) FLOPs;
* backward: the forward time of the same shape times the measured FlashAttention-2 backward/forward
  ratio on A100 (the GH200 backward column is broken, see shared/data/estimate-train-time/PROVENANCE.md).

The rates are fitted by ``python -m costmodel.cost.framework_kernels`` from ``shared/data`` into
``costmodel/data/framework_kernels.json`` (with provenance); a GPU die with no FlashAttention-2 sample
keeps the cost model's attention and the prediction says so.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from functools import lru_cache
from pathlib import Path

from costmodel.core.fileio import fitted_table_main
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.framework import attention_kernel, get_framework
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.opbuild import HBM_PASS
from costmodel.graph.ops import Op

TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "framework_kernels.json"
ATTENTION_KINDS = ("attention_fwd", "attention_bwd")
SAME_PEAK_TOLERANCE = 0.01
"""Peaks within 1 % are the same chip at the same clocks (datasheet rounding: GH200 989.0 vs H100 SXM 989.4)."""
BWD_FLOPS_RATIO = 2.5
"""Backward / forward matmul FLOPs of FlashAttention (5 matmuls vs 2, Dao 2023 sec. 3.1), as costmodel.graph.build."""
CAUSAL_FWD_EFFICIENCY = ((512, 191 / 309), (1024, 260 / 350), (2048, 298 / 362), (4096, 319 / 368),
                         (8192, 333 / 370), (16384, 335 / 370))
"""FlashAttention-2 forward with a causal mask, its rate (on the causal, halved FLOPs) over the rate without one,
by sequence length: Shah et al., FlashAttention-3, arXiv:2407.08608, Fig. 5 (H100 80GB SXM5, head dim 128,
BF16: FlashAttention-2 191/260/298/319/333/335 TFLOP/s with the mask vs 309/350/362/368/370/370 without). The
measured rate table is non-causal (flash_attn_func); the diagonal blocks' masking and the uneven row lengths
cost the rest. Held at the ends. The paper's backward figure has no causal panel: backward keeps the ratio of
the non-causal kernels."""


def causal_fwd_efficiency(seq: float) -> float:
    """CAUSAL_FWD_EFFICIENCY at ``seq`` (linear in log2(seq) between the sampled lengths, held at the ends)."""
    pts = CAUSAL_FWD_EFFICIENCY
    if seq <= pts[0][0]:
        return pts[0][1]
    for (s0, r0), (s1, r1) in zip(pts, pts[1:]):
        if seq <= s1:
            return r0 + (r1 - r0) * math.log2(seq / s0) / math.log2(s1 / s0)
    return pts[-1][1]

# Which GPUs share the die each measured system ran on (same SM count and tensor cores; NVIDIA H100 / H200
# / GH200 and A100 datasheets): the FlashAttention-2 rate of the die applies to all of them.
DIES = {
    "Vista": {"die": "GH100", "measured_on": "gh200",
              "gpus": ["gh200", "h100-sxm", "h200", "h100-sxm-500w", "gh200-144gb", "h800"]},
    "Perlmutter": {"die": "GA100", "measured_on": "a100-80gb", "gpus": ["a100-80gb", "a100-40gb"]},
}
FILES = {"Vista": "NVIDIAGH200120GB_flash_atten_fp16.csv", "Perlmutter": "NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv"}


# ------------------------------------------------------------------------------------------- fitting
def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def fit(data_dir: Path) -> dict:
    """The table: per die, median forward TFLOP/s by (head_dim, seq_len), and the backward/forward ratio."""
    root = data_dir / "estimate-train-time"
    out: dict = {"provenance": {
        "source": "shared/data/estimate-train-time/{Vista,Perlmutter}/operator/*_flash_atten_fp16.csv "
                  "(flash_attn_func, non-causal, fp16; see its PROVENANCE.md)",
        "command": "python -m costmodel.cost.framework_kernels",
        "method": "forward rate = median over rows of 4*b*heads*l^2*head_dim / F_dur at each (head_dim, l); "
                  "backward/forward = median B_dur/F_dur of the A100 rows (GH200 B_dur is broken)"},
        "dies": {}}
    ratios = [float(r["B_dur(us)"]) / float(r["F_dur(us)"])
              for r in _rows(root / "Perlmutter" / "operator" / FILES["Perlmutter"]) if float(r["F_dur(us)"]) > 0]
    bwd_ratio = statistics.median(ratios)
    for system, meta in DIES.items():
        by: dict[tuple[int, int], list[float]] = {}
        for r in _rows(root / system / "operator" / FILES[system]):
            mp, b, h, seq, dim = (int(float(r[k])) for k in ("mp", "b", "h", "l", "dim"))
            heads, hd = h // mp, dim // h
            f_us = float(r["F_dur(us)"])
            if f_us > 0:
                by.setdefault((hd, seq), []).append(4.0 * b * heads * seq * seq * hd / (f_us * 1e-6) / 1e12)
        rates: dict[str, dict] = {f"{hd}": {} for hd in sorted({k[0] for k in by})}
        for (hd, seq), v in sorted(by.items()):
            rates[f"{hd}"][f"{seq}"] = {"tflops": round(statistics.median(v), 2), "n": len(v)}
        out["dies"][meta["die"]] = {**meta, "system": system, "fwd_tflops": rates,
                                    "bwd_over_fwd": round(bwd_ratio, 4), "bwd_over_fwd_n": len(ratios)}
    return out


@lru_cache(maxsize=2)
def load_table(path: str | None = None) -> dict:
    return json.loads(Path(path or TABLE_PATH).read_text(encoding="utf-8"))


def _die_of(gpu: str, table: dict) -> dict | None:
    return next((d for d in table["dies"].values() if gpu in d["gpus"]), None)


def _nearest(keys: list[int], x: float) -> int:
    return min(keys, key=lambda k: (abs(k - x), k))


def _rate(die: dict, head_dim: int, seq: int) -> tuple[float, list[str]]:
    """FlashAttention-2 forward TFLOP/s at (head_dim, seq): nearest measured head dim, linear in seq
    between measured lengths, held at the ends (with a warning)."""
    table = die["fwd_tflops"]
    hd = _nearest([int(k) for k in table], head_dim)
    pts = sorted((int(s), v["tflops"]) for s, v in table[str(hd)].items())
    notes = []
    if hd != head_dim:
        notes.append(f"head_dim={head_dim} not sampled: used {hd}")
    if seq <= pts[0][0] or seq >= pts[-1][0]:
        end = pts[0] if seq <= pts[0][0] else pts[-1]
        if seq != end[0]:
            notes.append(f"seq={seq} outside sampled range [{pts[0][0]}, {pts[-1][0]}]: rate held at seq={end[0]}")
        return end[1], notes
    for (s0, r0), (s1, r1) in zip(pts, pts[1:]):
        if s0 <= seq <= s1:
            return r0 + (r1 - r0) * (seq - s0) / (s1 - s0), notes
    return pts[-1][1], notes  # unreachable: seq lies between the ends


FLASH2_SPEEDUP = 2.0
"""FlashAttention-2's speed over the FlashAttention kernels before it, as ``scaled_dot_product_attention`` runs them:
PyTorch v2.2.0 release notes ("SDPA now supports FlashAttention-2, yielding around 2x speedups compared to previous
versions"); Dao, arXiv:2307.08691, abstract ("around 2x speedup compared to FlashAttention"). A plan with attention
``flash1`` (PyTorch 2.0 / 2.1) is costed as FlashAttention-2 times this."""


def flash2_times(plan: ParallelPlan, hardware: Hardware, ops: list[Op],
                 table: dict | None = None) -> tuple[dict[tuple, float], list[str]]:
    """({Op.key(): seconds} of the attention operators of ``ops`` as FlashAttention-2 runs them (``flash1``: times
    :data:`FLASH2_SPEEDUP`), warnings); empty when the plan's framework calls the fused kernel the cost model already
    measures."""
    fw = get_framework(plan.framework)
    kernel = attention_kernel(plan)
    if kernel not in ("flash2", "flash1"):
        return {}, []
    table = table or load_table()
    die = _die_of(hardware.gpu.measured_as, table)
    if die is None:
        return {}, [f"framework {fw.name} runs FlashAttention-2, which has no measurement on the "
                    f"{hardware.gpu.name} die: its attention is costed as the cost model's fused kernel"]
    # a GPU of the die run at another power limit (catalogue peaks scaled to it) runs the kernel at the
    # ratio of its peak to the measured GPU's: attention at these shapes is compute-bound
    measured_peak = load_catalogue().gpu(die["measured_on"]).peak_tflops.get("bf16", 0.0)
    own_peak = hardware.gpu.peak_tflops.get("bf16", 0.0)
    clock = own_peak / measured_peak if measured_peak > 0 and own_peak > 0 else 1.0
    if abs(clock - 1.0) < SAME_PEAK_TOLERANCE:
        clock = 1.0
    out: dict[tuple, float] = {}
    notes: set[str] = set()
    launch = _launch_s(hardware.gpu.name)
    if clock != 1.0:
        notes.add(f"rate scaled by the bf16 peak ratio {own_peak:g}/{measured_peak:g} of {hardware.gpu.name} to "
                  f"{die['measured_on']}")
    for op in ops:
        if op.kind not in ATTENTION_KINDS or op.key() in out:
            continue
        _, s, s_full, _, _, d, causal = op.features
        rate, why = _rate(die, int(d), int(s_full))
        rate *= clock
        notes.update(why)
        fwd_flops = op.flops if op.kind == "attention_fwd" else op.flops / BWD_FLOPS_RATIO
        t = fwd_flops / (rate * 1e12)
        if causal and op.kind == "attention_fwd":
            # only the diagonal block of a context-parallel ring is masked: 1 of the cp steps' equal shares
            # (round-robin load balancing), a kernel of the local length; the rest run unmasked
            diagonal = s / s_full
            t *= 1 - diagonal + diagonal / causal_fwd_efficiency(s)
        t = t if op.kind == "attention_fwd" else t * die["bwd_over_fwd"]
        out[op.key()] = (t * FLASH2_SPEEDUP if kernel == "flash1" else t) + launch
    if kernel == "flash1":
        notes.add(f"FlashAttention (v1) at 1/{FLASH2_SPEEDUP:g} of FlashAttention-2's rate (PyTorch 2.2 release notes)")
    warnings = [f"{fw.name} attention costed as FlashAttention-2 measured on {die['measured_on']} ({die['die']}): "
                + "; ".join(sorted(notes))] if notes else []
    return out, warnings


def _launch_s(gpu: str) -> float:
    """The GPU's kernel launch floor (costmodel/data/efficiency.json launch_latency_us, the default's for GPUs
    without one): a FlashAttention-2 kernel takes at least that at the smallest shapes."""
    gpus = RooflineCostModel().table["gpus"]
    return float((gpus.get(gpu) or gpus["default"])["launch_latency_us"]["value"]) * 1e-6


# ------------------------------------------------------------------------ HBM passes
def hbm_times(hardware: Hardware, ops: list[Op]) -> dict[tuple, float]:
    """{Op.key(): seconds} of the pure HBM passes of ``ops`` (names starting costmodel.graph.opbuild.HBM_PASS: PyTorch
    eager element-wise chains, FSDP2's collective copies): their bytes at the GPU's achieved HBM bandwidth (the roofline
    model's streaming efficiency). The measured element-wise regressors are held at the edge of their sampled
    sizes and would cost these passes above the HBM bandwidth."""
    passes = {o.key(): o for o in ops if o.name.startswith(HBM_PASS)}
    if not passes:
        return {}
    gpu = (hardware.gpu.name, hardware.gpu.hbm_bw_gbs)  # what the roofline's memory-bound time depends on
    todo = [k for k in passes if (gpu, k) not in _HBM_TIMES]
    if todo:
        if len(_HBM_TIMES) > _HBM_TIMES_MAX:
            _HBM_TIMES.clear()
        result = RooflineCostModel().predict([passes[k] for k in todo], hardware)
        _HBM_TIMES.update({(gpu, k): float(t) for k, t in zip(todo, result.time_s)})
    return {k: _HBM_TIMES[(gpu, k)] for k in passes}


_HBM_TIMES: dict[tuple, float] = {}
"""hbm_times cache: (GPU name, HBM bandwidth, Op.key()) -> seconds (a search costs the same passes many times)."""
_HBM_TIMES_MAX = 100_000


def main(argv: list[str] | None = None) -> int:
    return fitted_table_main(argv, "Fit the FlashAttention-2 rate table from shared/data.", TABLE_PATH, fit)


if __name__ == "__main__":
    raise SystemExit(main())
