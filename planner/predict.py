"""One prediction: (model, plan, hardware) -> iteration time, throughput, memory, breakdown.

The public API over :mod:`costmodel.compose` (the paper's step 4, Zhang et al. arXiv 2509.22832 §III-C):
operator times from the cost seam are summed into per-stage forward/backward times per micro-batch,
composed by the 1F1B pipeline timeline (:mod:`costmodel.timeline`), then the per-iteration tail is added:
the exposed part of the DP gradient reduction, the optimizer step and the exposed parameter all-gather,
taken on the stage that finishes last. :class:`Prediction` is what planner reports of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Protocol

from costmodel.block_variants import model_warnings
from costmodel.compose import (
    GIB,
    Composition,
    CompositionConstants,
    compose,
    compose_iteration_time,
    mfu_peak_dtype,
)
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.base import OperatorCostModel
from costmodel.cost.measured import MeasuredCostModel
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph import OperatorGraph, domain_warnings
from costmodel.layer_split import costed_graph
from planner.intervals import plan_framework, time_band

__all__ = ["GIB", "Calibrating", "Prediction", "default_cost_model", "mfu_peak_dtype", "predict",
           "prediction_from_times"]


class Calibrating(CompositionConstants, Protocol):
    """What :func:`predict` needs of a calibration (:class:`planner.calibrate.Calibration` has it)."""

    def scale_times(self, times: dict) -> dict:
        """Operator times (keyed by Op.key()) with the calibration's scales applied."""
        ...

    def warnings_for(self, cost_model_name: str) -> list[str]:
        """Notes on using the calibration with this cost model."""
        ...

    @property
    def name(self) -> str:
        """Name the outputs report."""
        ...

    def interval_group(self, gpu: str, framework: str, moe: bool = False) -> tuple[str, dict] | None:
        """(group, {n, q_low, q_high}) of the calibration's 80 % interval for this regime (``moe``: its table for
        mixture-of-experts plans); None = none."""
        ...


@lru_cache(maxsize=1)
def default_cost_model() -> OperatorCostModel:
    """The cost model used when none is given: the measured regressors, roofline where none exists."""
    return MeasuredCostModel(fallback=RooflineCostModel())


@dataclass
class Prediction:
    """Everything planner predicts for one plan. Times in seconds, memory in GiB (2^30 bytes)."""

    iteration_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    """Model FLOPs (fwd + bwd, no recomputation; full attention matrix, SC21 eq. 3 convention) per GPU per s."""
    hardware_tflops_per_gpu: float
    """FLOPs executed including recomputation, per GPU per second."""
    mfu: float
    """Model FLOPs utilisation: model TFLOP/s per GPU / dense bf16 peak of the GPU."""
    memory_gib_per_gpu: float
    fits_in_memory: bool
    bubble_fraction: float
    """Pipeline bubble (incl. p2p waits) as a fraction of the iteration."""
    memory: dict
    """Memory parts in GiB: weights, gradients, optimizer, activations, workspace (peak stage)."""
    exposed_comm_s: dict
    """Communication on the critical path per kind: tp, pp, dp, zero, cp (seconds per iteration)."""
    breakdown: list
    """[{operator, phase, time_s, share, category}] on the critical stage, sorted by time, shares sum to 1."""
    warnings: list = field(default_factory=list)
    iteration_time_low_s: float | None = None
    iteration_time_high_s: float | None = None
    interval: str = ""
    """What [iteration_time_low_s, iteration_time_high_s] is: an 80 % interval from a calibration's
    leave-one-source-out residuals (group and n stated), or the regressors' ensemble spread (not an 80 %
    interval); '' when there is none."""
    stage_times_s: list = field(default_factory=list)
    """Per stage: [forward, backward] seconds for one micro-batch."""
    cost_model: str = ""
    cost_sources: dict = field(default_factory=dict)
    """Distinct operators per cost source (measured, derived, roofline, none), largest first
    (:func:`costmodel.core.kinds.describe_cost_sources` words them)."""
    bottleneck: str = ""
    """Largest of compute, bubble, exposed tp/dp/pp/zero/cp communication, optimizer."""
    layer_split: list | None = None
    """Layers per pipeline stage when the split is uneven: the request's, or, when PP x VPP does not divide
    the layers, the Megatron-expressible split chosen to minimise the predicted pipeline
    (:func:`costmodel.layer_split.balanced_layer_split`); None = even split."""

    def to_dict(self) -> dict:
        return asdict(self)


def _prediction(comp: Composition, warnings: list, cost_model: str, cost_sources: dict) -> Prediction:
    met, mem = comp.metrics, comp.metrics.memory
    return Prediction(
        iteration_time_s=comp.iteration_time_s,
        tokens_per_s=met.tokens_per_s,
        tokens_per_s_per_gpu=met.tokens_per_s_per_gpu,
        model_tflops_per_gpu=met.model_tflops_per_gpu,
        hardware_tflops_per_gpu=met.hardware_tflops_per_gpu,
        mfu=met.mfu,
        memory_gib_per_gpu=mem.total / GIB,
        fits_in_memory=met.fits_in_memory,
        bubble_fraction=comp.bubble_fraction,
        memory={"weights": mem.weights / GIB, "gradients": mem.gradients / GIB, "optimizer": mem.optimizer / GIB,
                "activations": mem.activations / GIB, "workspace": mem.workspace / GIB, "stage": mem.stage,
                "allocator": mem.allocator / GIB, "host": mem.host / GIB},
        exposed_comm_s=comp.breakdown.exposed_comm_s,
        breakdown=[row.to_dict() for row in comp.breakdown.rows],
        warnings=list(warnings) + list(comp.warnings),
        stage_times_s=[[f, b] for f, b in zip(comp.stages.fwd_s, comp.stages.bwd_s)],
        cost_model=cost_model,
        cost_sources=dict(cost_sources),
        bottleneck=comp.breakdown.bottleneck(),
    )


def prediction_from_times(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph,
                          times: Mapping[tuple, float], warnings: list, cost_model: str,
                          calibration: CompositionConstants | None = None,
                          cost_sources: dict | None = None) -> Prediction:
    """The Prediction for already costed (and, if wanted, calibration-scaled) operator ``times`` of ``graph``
    (no prediction interval); ``warnings`` come first in its warnings."""
    comp = compose(model, plan, hardware, graph, times, calibration)
    pred = _prediction(comp, warnings, cost_model, cost_sources or {})
    if plan.layer_split is not None:
        pred.layer_split = list(plan.layer_split)
    return pred


def predict(model: ModelSpec, plan: ParallelPlan, hardware: Hardware,
            cost_model: OperatorCostModel | None = None,
            calibration: Calibrating | None = None) -> Prediction:
    """Predict one training iteration of ``model`` under ``plan`` on ``hardware``.

    ``calibration`` (:class:`planner.calibrate.Calibration`) scales compute / collective operator times,
    limits how much DP gradient reduction hides under backward and adds a fixed per-iteration overhead;
    None leaves the prediction exactly uncalibrated.
    """
    plan.validate(model)
    skipped = []
    if calibration is not None and not getattr(calibration, "applies_to", lambda hw: True)(hardware):
        skipped = [f"calibration {calibration.name!r} was fitted on published GPU runs: not applied to "
                   f"{hardware.gpu.name}"]
        calibration = None
    cost_model = cost_model or default_cost_model()
    # PP x VPP not dividing the layers: the split with the shortest predicted pipeline that fits is predicted
    plan, graph, times = costed_graph(model, plan, hardware, cost_model,
                                      calibration.scaler(plan) if calibration is not None else None)
    warnings = skipped + domain_warnings(plan) + model_warnings(model) + list(times.warnings)
    unread = model.extra.get("unread_keys") if isinstance(model.extra, dict) else None
    if unread:
        shown = ", ".join(map(str, unread[:8])) + (f" and {len(unread) - 8} more" if len(unread) > 8 else "")
        warnings = [f"{model.source or 'config.json'}: keys planner does not read, ignored: {shown} (check that "
                    "they do not change the architecture)"] + warnings
    if calibration is not None:
        times = times.scaled(calibration.scaler(plan))
        warnings = warnings + calibration.warnings_for(cost_model.name)
    pred = prediction_from_times(model, plan, hardware, graph, times.time_s, warnings, cost_model.name,
                                 calibration, times.source_counts())
    found = None
    if calibration is not None:
        # MoE plans: the calibration's band of MoE runs (planner.intervals.MOE_TABLE), never the dense runs'
        gpu = hardware.gpu.measured_as  # a declared sibling's band: the same silicon
        found = calibration.interval_group(gpu, plan_framework(plan), moe=model.is_moe)
        if found is None and model.is_moe and calibration.interval_group(gpu, plan_framework(plan)):
            pred.warnings.append(f"no 80 % interval for mixture-of-experts plans: calibration {calibration.name!r} "
                                 "has bands of dense runs only (scripts/fit_default_calibration.py adds one from "
                                 "shared/validation/moe_runs.csv)")
    if found is not None:
        # 80 % interval: percentiles of held-out log(predicted / measured) of published runs of sources the
        # calibration's fold never saw (planner.intervals), for this GPU family / framework group
        key, group = found
        pred.iteration_time_low_s, pred.iteration_time_high_s = time_band(pred.iteration_time_s, group)
        pred.interval = (f"80 % interval from leave-one-source-out residuals of calibration {calibration.name!r} "
                         f"({'mixture-of-experts runs, ' if model.is_moe else ''}{key}, n={group['n']})")
    elif times.low_s is not None and times.high_s is not None and times.has_interval:
        # the regressors' ensemble intervals, carried through the same composition (each end
        # composes every operator at that end: a conservative band, not a joint quantile)
        pred.iteration_time_low_s = compose_iteration_time(plan, hardware, graph, times.low_s, calibration)
        pred.iteration_time_high_s = compose_iteration_time(plan, hardware, graph, times.high_s, calibration)
        pred.interval = ("ensemble spread of the operator regressors, not an 80 % interval "
                         "(no calibration with intervals applied)")
    return pred
