"""Per-tensor FP8 training GEMMs on the training basis: the measured latencies without the inference quantisation.

What the fp8 GEMM regressors learn from (shared/data/aiconfigurator/PROVENANCE.md, "Which FP8 is which"): TRT-LLM
``Linear`` with ``QuantAlgo.FP8`` and no input scale, so each timed call quantises its bf16 input x dynamically
(``quantize_e4m3_per_tensor``: an amax reduction over x, then the cast of x to E4M3) before the GEMM
(ai-dynamo/aiconfigurator collector/trtllm/collect_gemm.py and collect_computescale.py @095f58a5: "the collected fp8
GEMM includes the compute-scale overhead"; upstream derives its static fp8 GEMM by subtracting it). Those two passes
move :data:`DYNAMIC_QUANT_BYTES` bytes per element of the GEMM's input (M x K).

A Transformer Engine training step with delayed scaling (Megatron-Core / NeMo ``--fp8-format hybrid``) has no
amax pass (the scale comes from the amax history; the amax is taken inside the cast) and casts each tensor once
(transformer_engine/pytorch/module/linear.py @ release_v2.x: ``cast_transpose`` of the input in forward, of the
output gradient in backward, both reused by the dgrad and wgrad GEMMs): :data:`TE_CAST_BYTES` per GEMM phase.
So each fp8 GEMM's time loses the dynamic quantisation's bytes and gains TE's cast bytes, both at the GPU's achieved
HBM bandwidth, and is never below its tensor-core time at the fp8 peak.

Checked on H100 (reports/gpu-runs/h100-2026-11-27/raw/run1/gemm.csv: ``torch._scaled_mm`` with static scales, no
quantisation in the timed call): the aiconfigurator fp8 latency less the 5-byte pass at 90 % of 3.35 TB/s is
0.89-1.05 of the measured kernel for m, n, k >= 4096 and 1.04-1.22 for 8192 x 2048/6144 x 2048/6144 shapes, against
1.05-1.73 for the uncorrected latency.

Only ``fp8`` GEMMs whose time comes from a measured regressor change (``fp8-block`` has its own measured ratio,
:mod:`costmodel.cost.fp8_block`; roofline times carry no quantisation).
"""

from __future__ import annotations

from dataclasses import replace

from costmodel.core.kinds import CostSource, Phase
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.framework_kernels import hbm_times
from costmodel.cost.measured import default_cost_model
from costmodel.graph.build import OperatorGraph
from costmodel.graph.opbuild import hbm_pass

DTYPE = "fp8"
"""The per-tensor FP8 dtype whose GEMMs are corrected."""

DYNAMIC_QUANT_BYTES = 5.0
"""Bytes per input element of TRT-LLM's dynamic per-tensor quantisation inside the measured call: the amax pass reads
bf16 x (2), the cast reads it again (2) and writes E4M3 (1) (collect_computescale.py: dynamic = compute scale +
scale matrix)."""

TE_CAST_BYTES = {"fwd": 4.0, "dgrad": 4.0, "wgrad": 0.0}
"""Bytes per input element of Transformer Engine's own cast for each fp8 GEMM: forward and dgrad read their bf16
input (2) and write it and its transpose in E4M3 (1 + 1, ``cast_transpose``, the transposes being the wgrad GEMM's
operands); the wgrad GEMM reads those saved fp8 tensors and casts nothing. LayerNormLinear's forward cast, fused into
the norm kernel, is charged as a separate cast (an upper bound)."""


def _role(op) -> str:
    if op.phase is Phase.BWD:
        return "wgrad" if op.name.endswith(".wgrad") else "dgrad"
    return "fwd"


def measured_on(hardware: Hardware) -> Hardware:
    """The hardware whose GEMM measurements cost ``hardware``'s (MeasuredCostModel.measured_on: its own, a same-die
    sibling's, GH200 from H100 SXM, or its donor's): the dynamic quantisation inside them ran at that GPU's HBM
    bandwidth."""
    return default_cost_model().measured_on(hardware, "gemm.fwd")


def _seconds(hardware: Hardware, name: str, op, nbytes: float) -> float:
    hbm = hbm_pass(f"fp8_quant.{name}.{op.name}", op.phase, nbytes, "bf16")
    return hbm_times(hardware, [hbm])[hbm.key()]


def _new_times(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times) -> dict[tuple, float]:
    """{Op.key(): seconds} of the measured fp8 GEMMs on the training basis: less the dynamic quantisation at the
    measuring GPU's HBM bandwidth, plus TE's casts at this GPU's."""
    peak = hardware.gpu.peak_tflops.get(DTYPE, 0.0) * 1e12
    source_hw = measured_on(hardware)
    out = {}
    for key, op in graph.distinct_operators().items():
        if op.kind != "gemm" or op.dtype != DTYPE or key not in times.time_s:
            continue
        if times.source.get(key) in (CostSource.ROOFLINE, CostSource.NONE):
            continue
        m, _, k = op.features[:3]
        dynamic = _seconds(source_hw, "dynamic", op, DYNAMIC_QUANT_BYTES * m * k)
        te = _seconds(hardware, "te", op, TE_CAST_BYTES[_role(op)] * m * k) if TE_CAST_BYTES[_role(op)] else 0.0
        floor = op.flops / peak if peak > 0 else 0.0
        out[key] = max(times.time_s[key] - dynamic + te, floor)
    return out


def apply(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times):
    """fp8 plans: every measured fp8 GEMM's time (interval ends keep their ratio) on the training basis (module
    docstring), with a note; ``times`` itself otherwise."""
    if plan.dtype != DTYPE:
        return times
    new = _new_times(plan, hardware, graph, times)
    if not new:
        return times
    note = ("fp8 GEMMs: measured inference latencies less TensorRT-LLM's dynamic amax + cast of the input (5 B per "
            "element) plus Transformer Engine's cast_transpose (4 B per element in forward and dgrad, none in wgrad), "
            "at the achieved HBM bandwidth (costmodel/cost/fp8_training.py)")
    return replace(times.replaced(new), warnings=times.warnings + (note,))
