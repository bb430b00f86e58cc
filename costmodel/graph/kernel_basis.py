"""One kernel basis: what each operator cost stands for, and which measurements may train it.

An operator's time in planner is the time of the kernel the plan's framework runs on that GPU. The regressors
and the efficiency table (``costmodel/data``) describe the **fused basis**: one kernel per operator as
Megatron-Core / NeMo with Transformer Engine (and llm.c, Apex, ``torch.compile``) run it -- a fused RMSNorm /
LayerNorm, a fused RoPE, a fused SwiGLU or bias-GELU, the GPU's fused attention (cuDNN / FlashAttention-3 on
Hopper and Blackwell, FlashAttention-2 on Ampere), a fused cross entropy, cuBLAS GEMMs. Other stacks are costed
on top of it: PyTorch eager adds the time of its separate kernels (:func:`eager_extra_bytes`, measured on H100),
stacks calling FlashAttention-2 on Hopper get its measured rate (``costmodel.cost.framework_kernels``).

The public data measure on different bases (shared/data PROVENANCE files), so a measurement trains the fused-basis
models only where it measures that kernel:

* estimate-train-time (Perlmutter A100, Vista GH200): PyTorch programs timed from the first to the last kernel
  of each op (gaps included). Its GEMMs are cuBLAS but on ``torch.rand`` inputs, which run 4-13 % above the rate
  of realistic (normal) inputs (:data:`ETT_GEMM_INPUTS`); torch ``LayerNorm``, ``gelu``, the residual add and the
  embedding gather are one kernel each. Its ``RMSlayernorm`` (Megatron's RMSNorm in
  PyTorch ops), ``RoPE`` (Megatron's ``apply_rotary_pos_emb`` in PyTorch ops) and ``parallel_cross_entropy_128``
  (Megatron's unfused vocab-parallel cross entropy) are chains of eager kernels: 5-25x their fused HBM time
  (costmodel/data/PROVENANCE.md: RMSNorm at 5 % and RoPE at 4-6 % of HBM bandwidth). Its ``flash_attn_func``
  is FlashAttention-2: the fused attention of Ampere, not of Hopper (FlashAttention-3, arXiv:2407.08608,
  sec. 4.1: FA2 reaches about 60 % of the Hopper kernels' rate).
* vidur (A100, H100): sarathi-serve's fused inference kernels, forward only.
* aiconfigurator (A100 ... GB300): TensorRT-LLM / SGLang inference kernels replayed in CUDA graphs (launch
  overhead excluded); GEMMs and attention are the kernels training runs, its fp8_block GEMMs a DeepGEMM /
  TRT-LLM inference kernel whose latency includes activation quantisation.

Rows on another basis are imported with the role ``other_basis`` (kept for checks, never trained on); a GPU
left without a model of some kind borrows its die sibling's (:mod:`costmodel.cost.basis`), else the roofline
on fused-kernel efficiencies. Each prediction's ``cost_sources`` and warnings say which.
"""

from __future__ import annotations

import argparse
import csv
import json
from functools import lru_cache
from pathlib import Path

from costmodel.core.fileio import atomic_write_text
from costmodel.core.kinds import COLLECTIVE_KINDS, Phase

FUSED = "fused"
"""The basis of planner's operator costs (module docstring)."""

OTHER_BASIS_ROLE = "other_basis"
"""Importer role of rows measured on another kernel basis than the fused one (not trained on)."""

ETT_EAGER_OPERATORS = {
    "RMSlayernorm": "Megatron RMSNorm in PyTorch ops (x.float(), pow, mean, rsqrt, mul, type_as, mul weight): an "
                    "eager chain, not the fused RMSNorm kernel of Transformer Engine / Apex",
    "RoPE": "Megatron apply_rotary_pos_emb in PyTorch ops (cat, mul, add over two halves): an eager chain, not a "
            "fused RoPE kernel",
    "parallel_cross_entropy_128": "Megatron's unfused vocab-parallel cross entropy (max, subtract, exp, sum, log, "
                                  "gather as separate kernels with fp32 intermediates)",
}
"""estimate-train-time operators that are eager PyTorch chains (estimate-train-time/PROVENANCE.md operator table;
Kernel_sampling/target_functions.py): measurements of another basis than the fused kernels."""

ETT_ELEMENTWISE = {"layernorm": "norm", "gelu": "activation", "res_add": "residual_add", "optimizer": "optimizer"}
"""estimate-train-time's single-kernel element-wise operators (torch LayerNorm, gelu, the residual add) and its
optimizer step (DeepSpeed FusedAdam with a fixed overhead, costmodel/data/PROVENANCE.md), with their kinds: costed,
like every element-wise kind, from the fused kernels measured on H100."""

ETT_GEMM_INPUTS = ("nn.Linear on torch.rand (uniform [0, 1)) fp16 inputs: up to 890-940 TFLOP/s on GH200 and 283 on "
                   "A100, 4-13 % above the maximum achievable matmul rate of normal inputs (stas00 MAMF 829 on a 900 W "
                   "GH200, 271 on A100; estimate-train-time/PROVENANCE.md): a data-dependent clock, not the training "
                   "GEMM; aiconfigurator's GEMMs are (reports/gpu-runs/h100-2026-11-27/ANALYSIS.md sec. 3: training "
                   "GEMM kernel times within about 1 % on H100)")
"""Why estimate-train-time's GEMM rows are another basis than the training GEMMs planner costs."""

FLASH2_IS_FUSED = {"a100-80gb", "a100-40gb"}
"""GPUs whose fused attention is FlashAttention-2 (Ampere: FlashAttention-3 needs Hopper's TMA / WGMMA, Shah et
al., arXiv:2407.08608, sec. 3): there estimate-train-time's flash_attn_func is on the fused basis."""


def elementwise_role(kind: str, source: str) -> tuple[str, str]:
    """(importer role, why) of a public sample of ``kind`` from ``source``: :data:`OTHER_BASIS_ROLE` for the
    element-wise kinds costed from the fused kernels measured on H100 (:data:`FUSED_ELEMENTWISE`), else ``train``."""
    if kind in FUSED_ELEMENTWISE:
        return OTHER_BASIS_ROLE, (f"{kind} is costed from fused training kernels measured on H100 "
                                  f"(costmodel/data/fused_kernels.json); {source}'s samples are another basis "
                                  f"({SOURCE_BASIS.get(source, 'not a fused training kernel')})")
    return "train", ""


SOURCE_BASIS = {"vidur": "sarathi-serve inference kernels, forward only",
                "estimate-train-time": "single PyTorch kernels or eager chains timed with their launch gaps"}
"""What each public source's element-wise samples measure (module docstring)."""


def ett_operator_role(operator: str, gpu: str) -> tuple[str, str]:
    """(importer role, why) of an estimate-train-time operator file measured on ``gpu``: ``train`` when it
    measures the fused-basis kernel, :data:`OTHER_BASIS_ROLE` otherwise."""
    if operator in ETT_EAGER_OPERATORS:
        return OTHER_BASIS_ROLE, ETT_EAGER_OPERATORS[operator]
    if operator in ETT_ELEMENTWISE:
        return elementwise_role(ETT_ELEMENTWISE[operator], "estimate-train-time")
    if operator.startswith("linear"):
        return OTHER_BASIS_ROLE, ETT_GEMM_INPUTS
    if operator == "flash_atten" and gpu not in FLASH2_IS_FUSED:
        return OTHER_BASIS_ROLE, ("flash_attn_func is FlashAttention-2, not the fused attention Transformer Engine "
                                  f"calls on {gpu} (cuDNN / FlashAttention-3); "
                                  "costmodel/cost/framework_kernels.py uses it for stacks that call FlashAttention-2")
    return "train", ""


# ------------------------------------------------------------------------------ fused element-wise kernels (H100)
FUSED_ELEMENTWISE = ("norm", "rope", "activation", "residual_add", "cross_entropy", "optimizer")
"""Memory-bound kinds costed on the fused basis by the HBM roofline with the efficiencies of fused kernels measured
on one H100 (:data:`MEASUREMENT`; costmodel/data/fused_kernels.json): every public sample of these kinds is another
basis (estimate-train-time's eager chains; vidur's sarathi-serve inference kernels, which reach 34 % of HBM on a
norm where the fused training kernel reaches 85 %, costmodel/data/PROVENANCE.md). A fused element-wise kernel streams
its bytes once at the HBM rate, so the same efficiency applies to every GPU's HBM bandwidth."""

MEASUREMENT = Path("reports/gpu-runs/h100-2026-11-27/raw/run1")
"""Measured on one NVIDIA H100 80GB HBM3 SXM by benchmarks/gpu/measure_h100.py (PyTorch 2.11, CUDA 13.0;
reports/gpu-runs/h100-2026-11-27/PROVENANCE.md): ``elementwise.csv`` (GPU time with launch gaps hidden) and
``optimizer.csv`` (fused AdamW step)."""
MEASURED_HBM_GBS = 3350.0
"""The H100 SXM's datasheet HBM bandwidth (catalogue h100-sxm, nv_h100_product_page): the denominator of the
efficiencies, as efficiency.json's (the card's measured copy ceiling is 2,920 GB/s, read + write)."""
FUSED_ROWS = {("rmsnorm", "compiled"): "norm", ("swiglu", "compiled"): "activation",
              ("rope", "compiled_rotate_half"): "rope", ("residual_add", "eager"): "residual_add",
              ("cross_entropy", "compiled"): "cross_entropy"}
"""(op, impl) of elementwise.csv -> kind: torch.compile'd (Inductor) RMSNorm, SwiGLU, rotate-half RoPE and cross
entropy, and the residual add (one kernel in every stack): the fused basis."""
EAGER_ROWS = {("rmsnorm", "eager_torchtitan"): "norm", ("swiglu", "eager"): "activation",
              ("rope", "eager_complex_torchtitan"): "rope",
              ("cross_entropy", "eager_float_torchtitan"): "cross_entropy"}
"""(op, impl) of elementwise.csv -> kind: the PyTorch-eager implementations torchtitan runs (models/norms.py RMSNorm,
F.silu(a) * b, the complex-number RoPE, F.cross_entropy(pred.float())), timed at the compiled rows' shapes."""
ADAM_FUSED_BYTES = 28.0
"""Bytes per parameter the fused AdamW step moves (costmodel.graph.conventions.ADAM_BYTES_PER_PARAM; optimizer.csv's own
GBps column uses the same 28)."""


def graph_bytes(kind: str, tokens: float, width: float, backward: bool) -> float:
    """Bytes costmodel.graph.build charges one operator of ``kind`` over ``tokens`` rows of ``width`` (hidden size; the
    activation's output width; the vocabulary for cross entropy; q and k of [T, width] for RoPE), 2-byte elements:
    the byte counts the efficiencies are fitted against, so a measured kernel's time is reproduced exactly."""
    e = tokens * width
    if kind == "norm":
        return (4.0 if backward else 2.0) * e * 2
    if kind == "activation":  # gated: input 2F, output F (costmodel.graph.build act_in / act_out)
        return 2.0 * (2 * (2 * e) + e) if backward else 2.0 * (2 * e + e)
    if kind == "rope":  # q and k: 2 x T x width elements, read + write
        return 2.0 * (2 * e) * 2
    if kind == "residual_add":
        return 3.0 * e * 2
    if kind == "cross_entropy":  # bf16 logits: forward reads them, backward reads them and writes the gradient
        return (4.0 if backward else 2.0) * e
    raise KeyError(kind)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def fit_fused(folder: Path) -> dict:
    """The fused-kernel efficiency table from the measurement folder (``elementwise.csv``, ``optimizer.csv``): per
    kind and direction the median over shapes of graph_bytes / (time x MEASURED_HBM_GBS)."""
    effs: dict[str, dict[str, list[float]]] = {}
    with (folder / "elementwise.csv").open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            kind = FUSED_ROWS.get((r["op"], r["impl"]))
            if kind is None:
                continue
            bwd = r["pass"] == "bwd"
            t = float(r["gpu_ms"]) * 1e-3
            eff = graph_bytes(kind, float(r["T"]), float(r["h"]), bwd) / (t * MEASURED_HBM_GBS * 1e9)
            effs.setdefault(kind, {}).setdefault(r["pass"], []).append(eff)
    eager = _eager_ratios(folder)
    with (folder / "optimizer.csv").open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["impl"] == "fused":
                seconds = float(r["step_ms_median"]) * 1e-3
                eff = ADAM_FUSED_BYTES * float(r["params"]) / (seconds * MEASURED_HBM_GBS * 1e9)
                effs.setdefault("optimizer", {}).setdefault("fwd", []).append(eff)
    kinds = {k: {d: {"eff": round(_median(v), 4), "n": len(v), "min": round(min(v), 4), "max": round(max(v), 4)}
                 for d, v in sorted(dirs.items())} for k, dirs in sorted(effs.items())}
    return {"kinds": kinds, "eager_over_fused": eager, "hbm_gbs": MEASURED_HBM_GBS,
            "host_layer_s": _host_layer_s(folder), "provenance": {
        "measured": "one NVIDIA H100 80GB HBM3 SXM (reports/gpu-runs/h100-2026-11-27/PROVENANCE.md), "
                    "benchmarks/gpu/measure_h100.py: elementwise.csv gpu_ms (launch gaps hidden), optimizer.csv, "
                    "train_steps.csv",
        "rows": {f"{op}/{impl}": kind for (op, impl), kind in FUSED_ROWS.items()} | {"AdamW/fused": "optimizer"},
        "method": "per kind and direction: median over shapes of costmodel.graph.kernel_basis.graph_bytes / (time x "
                  "3350 GB/s); optimizer: 28 bytes per parameter / (fused AdamW step time x 3350 GB/s); "
                  "eager_over_fused: median over the compiled rows' shapes of the eager implementation's time / the "
                  "compiled one's (EAGER_ROWS); host_layer_s: median over the models of the smallest CPU time of an "
                  "eager training step (train_steps.csv step_cpu_ms_median) per transformer layer",
        "command": "python -m costmodel.graph.kernel_basis --measurements reports/gpu-runs/h100-2026-11-27/raw/run1"}}


def _host_layer_s(folder: Path) -> dict:
    """The CPU seconds a PyTorch eager training step spends per transformer layer (forward + backward), fitted from the
    measured steps (``train_steps.csv``): per model the smallest step_cpu_ms_median / n_layers over its eager rows
    (the CPU-bound configurations; the optimizer step, loss and zero_grad are inside it), then the median over the
    models."""
    per_model: dict[str, list[float]] = {}
    with (folder / "train_steps.csv").open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["mode"] == "eager" and r["status"] == "ok":
                per_model.setdefault(r["model"], []).append(float(r["step_cpu_ms_median"]) * 1e-3 / int(r["n_layers"]))
    return {"value": round(_median([min(v) for v in per_model.values()]), 6),
            "per_model": {m: round(min(v), 6) for m, v in sorted(per_model.items())}}


def _eager_ratios(folder: Path) -> dict:
    """kind -> direction -> median eager / fused time at the shapes both were timed at (elementwise.csv)."""
    times: dict[tuple, float] = {}
    with (folder / "elementwise.csv").open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            times[(r["op"], r["impl"], r["T"], r["h"], r["pass"])] = float(r["gpu_ms"])
    out: dict[str, dict[str, list[float]]] = {}
    for (op, impl), kind in EAGER_ROWS.items():
        fused_impl = next(i for (o, i), k in FUSED_ROWS.items() if k == kind)
        for (o, i, t, h, d), ms in times.items():
            if (o, i) == (op, impl) and (op, fused_impl, t, h, d) in times:
                out.setdefault(kind, {}).setdefault(d, []).append(ms / times[(op, fused_impl, t, h, d)])
    return {k: {d: {"ratio": round(_median(v), 3), "n": len(v)} for d, v in sorted(dirs.items())}
            for k, dirs in sorted(out.items())}


EAGER_EXTRA_BYTES = {"norm": (32.0, 76.0), "rope": (16.0, 16.0), "activation": (4.0, 8.0),
                     "cross_entropy": (12.0, 18.0)}
"""HBM bytes per element that PyTorch eager moves beyond the fused kernel, (forward, backward), for 2-byte activations,
counted from the eager code torchtitan runs and the autograd derivatives of each aten op (pytorch
tools/autograd/derivatives.yaml), one HBM read of every input and one write of every output per kernel: a lower
bound, kept as a check of the measured ratios costmodel.graph.build.eager_elementwise uses (eager kernels do not all
stream at the HBM rate: the counted bytes give 9x, 5x, 1.67x and 7x the fused traffic for RMSNorm, RoPE, SwiGLU and the
loss, the H100 measurement 13.2x, 5.8x, 1.67x and 6.0x the time, costmodel/data/fused_kernels.json
``eager_over_fused``).

* RMSNorm (torchtitan models/norms.py): forward x.float() (read 2, write 4), pow(2) (4+4), mean (read 4), x * rsqrt
  (4+4), type_as (4+2), * weight (2+2) = 36 bytes vs the fused kernel's 4: +32; backward 84 vs 8: +76.
* RoPE (models/llama/model.py apply_rotary_emb): float() (6), complex64 multiply (4+4), type_as (6) = 20 vs 4: +16;
  backward the mirror image: +16.
* SwiGLU (FeedForward: silu(w1 x) * w3 x), per element of the hidden width: silu (2+2) and mul (4+2) = 10 vs 6: +4;
  backward two products (6+6) and silu_backward (6) = 18 vs 10: +8.
* cross entropy (F.cross_entropy(pred.float())), per logit: the cast (2 + 4) and log_softmax (4 + 4) = 14 vs 2: +12;
  backward nll_loss's gradient (4), log_softmax_backward (4 + 4 + 4) and the cast back (4 + 2) = 22 vs 4: +18.
"""


MEGATRON_LOSS_BYTES = (38.0, 14.0)
"""HBM bytes per logit (forward, backward) of Megatron-Core's vocab-parallel cross entropy on bf16 logits, counted
from megatron/core/tensor_parallel/cross_entropy.py (VocabParallelCrossEntropy, NVIDIA/Megatron-LM @00611e6e), one
HBM read of every input and one write of every output per pass over the [tokens, vocab / TP] logits:

* forward: ``logits.float()`` (read 2, write 4), ``torch.max`` over the vocabulary (read 4), the in-place
  subtraction of the max (4 + 4), ``torch.exp(out=)`` in place (4 + 4), ``sum`` (read 4), the in-place division
  into the saved fp32 softmax (4 + 4): 38 bytes;
* backward: the in-place ``grad_input.mul_(grad_output)`` over the saved softmax (4 + 4), and autograd's cast of
  the fp32 gradient back to the bf16 logits (read 4, write 2): 14 bytes (the target scatter touches one logit per
  token).

``--cross-entropy-loss-fusion`` with the default ``--cross-entropy-fusion-impl native``
(megatron/core/fusions/fused_cross_entropy.py) runs the same steps under ``jit_fuser`` (torch.compile): it saves
the all-reduces and kernel launches, not the fp32 passes (the file notes that Inductor materialises its in-place
exp and scatter into fresh logits-sized buffers and copies them back), so it is costed alike. Only a single-kernel
loss (``ParallelPlan.cross_entropy_fusion``: ``--cross-entropy-fusion-impl te``, Transformer Engine's Triton
cross entropy) reads the logits once: costmodel.graph.build.cross_entropy_ops."""


def megatron_loss_extra_bytes(backward: bool, fused_bytes: float, logits: float) -> float:
    """Residual-add-equivalent bytes (costmodel.graph.opbuild.hbm_pass) that bring a fused cross entropy of
    ``fused_bytes`` over ``logits`` logits to Megatron-Core's vocab-parallel chain (:data:`MEGATRON_LOSS_BYTES`): the
    chain's passes stream at the residual add's fused efficiency (fused_kernels.json), the fused kernel's own time is
    kept."""
    eff, res = fused_efficiency("cross_entropy", backward), fused_efficiency("residual_add", False)
    if not eff or not res:
        return 0.0
    chain = MEGATRON_LOSS_BYTES[1 if backward else 0] * logits
    return max(0.0, chain - fused_bytes * res / eff)


def eager_extra_bytes(kind: str, backward: bool, fused_bytes: float) -> float:
    """Residual-add-equivalent bytes (costmodel.graph.opbuild.hbm_pass, costed at the residual add's efficiency) that
    bring a fused ``kind`` operator of ``fused_bytes`` to the measured eager / fused time ratio of torchtitan's eager
    implementation; 0 where none was measured."""
    entry = fused_table().get("eager_over_fused", {}).get(kind, {}).get("bwd" if backward else "fwd")
    eff, res = fused_efficiency(kind, backward), fused_efficiency("residual_add", False)
    if not entry or not eff or not res:
        return 0.0
    return (float(entry["ratio"]) - 1.0) * fused_bytes * res / eff


FUSED_TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "fused_kernels.json"


@lru_cache(maxsize=1)
def fused_table() -> dict:
    """The shipped fused-kernel efficiency table (costmodel/data/fused_kernels.json)."""
    return json.loads(FUSED_TABLE_PATH.read_text(encoding="utf-8"))


def fused_efficiency(kind: str, backward: bool) -> float | None:
    """Fraction of the HBM bandwidth the fused kernel of ``kind`` reaches in that direction (None: not measured)."""
    dirs = fused_table()["kinds"].get(kind)
    if not dirs:
        return None
    entry = dirs.get("bwd" if backward else "fwd") or dirs.get("fwd")
    return float(entry["eff"]) if entry else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fit the fused-kernel efficiency table from the H100 measurements.")
    ap.add_argument("--measurements", type=Path, default=MEASUREMENT, help="folder with elementwise.csv, optimizer.csv")
    ap.add_argument("--out", type=Path, default=FUSED_TABLE_PATH)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh fit")
    args = ap.parse_args(argv)
    text = json.dumps(fit_fused(args.measurements), indent=1, sort_keys=True) + "\n"
    if args.check:
        return 0 if args.out.is_file() and args.out.read_text(encoding="utf-8") == text else 1
    atomic_write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0



# ------------------------------------------------------------------------------ host dispatch (no CUDA graphs)
HOST_KERNEL_S = 7.3e-6
"""CPU time to dispatch and launch one eager CUDA kernel: x.add_(1) on a 16-element tensor, 7.5 and 7.0 us per
kernel in two runs (reports/gpu-runs/h100-2026-11-27/raw/run{1,2}/overheads.csv, eager_add_; measured on that
machine's VM host, 3.6 us for the same op on a CPU tensor: bare-metal hosts dispatch faster)."""
HOST_LINEAR_S = 37e-6
"""CPU time of one forward linear under autocast (weight cast + GEMM: two kernels and the autocast dispatch): 42.3
and 32.0 us in the two runs (overheads.csv, eager_linear_64_autocast)."""
HOST_GEMM_S = 15e-6
"""CPU time of one cuBLAS GEMM launch (a backward dgrad / wgrad): 14.6 and 15.1 us (overheads.csv, eager_mm_64)."""
EAGER_KERNELS = {"norm": (8, 10), "rope": (5, 5), "activation": (2, 3), "cross_entropy": (2, 3)}
"""Kernels (forward, backward) of one PyTorch-eager element-wise chain, as EAGER_EXTRA_BYTES counts
them: RMSNorm x.float(), pow, mean, add eps, rsqrt, mul, type_as, mul weight (8) and its autograd nodes (10); the
complex RoPE's view, mul, view, flatten, type_as (5 each way); SwiGLU silu and mul (2, backward 3); the loss's cast
and log_softmax (2, backward 3). A fused or compiled stack runs each as one kernel."""


def host_layer_s() -> float:
    """CPU seconds per transformer layer and micro-batch (forward + backward) of a stack that runs its layers as PyTorch
    modules without CUDA graphs (Framework.python_layers): fitted by costmodel.graph.kernel_basis.fit_fused on the H100
    eager training steps (fused_kernels.json ``host_layer_s``: 3.0-3.2 ms per layer for the 125M, 370M and 1.1B models,
    the same with torchtitan-style per-block torch.compile, 3.3-3.7 ms; ANALYSIS.md sec. 2). The per-kernel sum of
    :func:`host_dispatch_s` is a third of it: the autograd engine, module hooks and autocast casts add the rest. The
    measuring host is a 2.1 GHz Xeon VM (bare-metal hosts dispatch faster): judged on the other small-model sources
    (shared/validation gh200_small_blackwell_runs.csv SMALL-*), not on the H100 runs it is fitted on. Megatron-Core's
    layers (Transformer Engine modules) take the same floor, unmeasured here: judged by leave-one-source-out on the
    published Megatron runs (MCORE-H100's GPT-1.7B at TP 1, MBS 1: +34 % too fast without it, +7 % with it)."""
    return float(fused_table().get("host_layer_s", {}).get("value", 0.0))


def python_layer_host_s(fwd: float, bwd: float) -> tuple[float, float]:
    """(forward, backward) host seconds of one layer of a PyTorch-module stack: the per-kernel estimate scaled up to at
    least :func:`host_layer_s` in total, split as the per-kernel estimate splits it."""
    floor = host_layer_s()
    if fwd + bwd <= 0 or fwd + bwd >= floor:
        return fwd, bwd
    k = floor / (fwd + bwd)
    return fwd * k, bwd * k


def host_dispatch_s(ops, compiled: bool, cuda_graphs: bool) -> tuple[float, float]:
    """(forward, backward incl. recomputation) CPU seconds to issue ``ops`` (one layer or one stage's ops, per
    micro-batch; counts applied) kernel by kernel: 0 when they replay from a CUDA graph. The GPU runs them no faster
    than the CPU issues them: a step is max(CPU issue, GPU) per layer (measured on H100 within a few percent,
    reports/gpu-runs/h100-2026-11-27/ANALYSIS.md sec. 2)."""
    if cuda_graphs:
        return 0.0, 0.0
    fwd = bwd = 0.0
    for o in ops:
        if o.kind in COLLECTIVE_KINDS or o.name.startswith("hbm."):
            continue  # collectives: their own stream; hbm.* passes: counted with the operator they belong to
        if o.kind == "gemm":
            s = HOST_LINEAR_S if o.phase is Phase.FWD or o.phase is Phase.RECOMPUTE else HOST_GEMM_S
        else:
            kernels = EAGER_KERNELS.get(o.kind, (1, 1)) if not compiled else (1, 1)
            s = HOST_KERNEL_S * kernels[1 if o.backward else 0]
        if o.phase is Phase.FWD:
            fwd += s * o.count
        elif o.phase in (Phase.BWD, Phase.RECOMPUTE):
            bwd += s * o.count
    return fwd, bwd


if __name__ == "__main__":
    raise SystemExit(main())
