"""A prediction in a run row's measured metric, and its signed relative error.

Metric meanings differ between sources (shared/validation/README.md, "Metric meanings"): a published
source whose ``tflops_per_gpu`` counts the recompute forward pass (rule ``tflops_counts_recompute`` of
:mod:`planner.validation.sources`) is compared with hardware FLOPs, every other row with model FLOPs; MFU
rows whose notes say the FP8 peak was the denominator are converted from planner's bf16-peak MFU.
"""

from __future__ import annotations

import math

from costmodel.core.errors import PlannerError
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.schedule.flops import model_flops_per_iteration, published_flops_per_iteration
from planner.intervals import time_residual
from planner.validation.moe_rows import TFLOPS_RULES, megatron_flops
from planner.validation.runs import RunRow


def uses_fp8_peak(row: RunRow) -> bool:
    """MFU divided by the FP8 peak (DGXC recipes, shared/validation/README.md) rather than bf16."""
    t = row.text["notes"].lower()
    return "fp8 peak" in t or "fp8-peak" in t or "dgxc" in t


def compare(row: RunRow, prediction, model: ModelSpec, plan: ParallelPlan, hardware=None) -> tuple[float, float]:
    """(predicted value in the row's measured_metric, signed relative error (pred - meas) / meas).

    ``model`` and ``plan`` are the row's (:func:`planner.validation.runs.row_to_inputs`, which the caller ran to
    predict): TFLOP/s and MFU rows count FLOPs with them. ``hardware`` is needed only for MFU rows with FP8-peak
    denominators.
    """
    metric, measured = row.measured_metric, row.measured_value
    if measured is None:
        raise PlannerError(f"row {row.id}: no measured value to compare with")
    if metric == "iteration_time_s":
        pred = prediction.iteration_time_s
    elif metric == "tokens_per_s_per_gpu":
        pred = prediction.tokens_per_s_per_gpu
    elif metric == "tflops_per_gpu" and (model.is_moe or any(row.rule(r) for r in TFLOPS_RULES)):
        # Megatron-Core counters (rule tflops_mcore_*; MoE rows without one are refused when loaded)
        causal = row.rule("tflops_mcore_causal") is not None
        if not causal and row.rule("tflops_mcore_full_attention") is None:
            raise PlannerError(f"row {row.id}: the FLOPs formula of its tflops_per_gpu is not known")
        flops = megatron_flops(model, plan.gbs, plan.seq_len, causal)
        pred = flops / (prediction.iteration_time_s * plan.gpus) / 1e12
    elif metric == "tflops_per_gpu":
        # published TFLOP/s use SC21 eq. 3 / PaLM counting (full s x s attention), not planner's causal
        # MFU convention (costmodel/schedule/flops.py): convert the predicted time into the source's convention
        hfu = row.rule("tflops_counts_recompute") is not None
        flops = published_flops_per_iteration(model, plan.gbs, plan.seq_len,
                                              plan.recompute if hfu else "none")
        pred = flops / (prediction.iteration_time_s * plan.gpus) / 1e12
    elif metric == "mfu" and model.is_moe:
        raise PlannerError(f"row {row.id}: MFU of a mixture-of-experts run: its FLOPs convention is not known")
    elif metric == "mfu":
        # published MFU (PaLM appendix B, Llama 3, Megatron) counts full attention too: scale planner's causal
        # MFU by the ratio of the two conventions' model FLOPs (same time, same peak)
        ratio = (published_flops_per_iteration(model, plan.gbs, plan.seq_len, "none")
                 / model_flops_per_iteration(model, plan.gbs, plan.seq_len))
        pred = 100.0 * prediction.mfu * ratio
        if uses_fp8_peak(row):
            if hardware is None:
                raise PlannerError(f"row {row.id}: FP8-peak MFU needs the hardware peaks to convert")
            peaks = hardware.gpu.peak_tflops
            if "bf16" not in peaks or "fp8" not in peaks:
                raise PlannerError(f"row {row.id}: FP8-peak MFU needs bf16 and fp8 peaks of {hardware.gpu.name}")
            pred *= peaks["bf16"] / peaks["fp8"]
    else:
        raise PlannerError(f"row {row.id}: unknown measured_metric {metric!r}")
    pred = float(pred)
    return pred, (pred - measured) / measured


def measured_mfu(metric: str, predicted: float, measured: float, predicted_mfu: float) -> float:
    """MFU of a measured run in planner's convention (the prediction's model FLOPs over the dense bf16 peak): the
    predicted MFU times predicted / measured time, that ratio from the row's ``predicted`` and ``measured`` values in
    its ``metric`` (:func:`planner.intervals.time_residual`). Model-free up to the metric's own conversion
    (:func:`compare`)."""
    return predicted_mfu * math.exp(time_residual(metric, predicted, measured))
