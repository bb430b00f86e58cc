"""One prediction: (model, plan, hardware) -> iteration time, throughput, memory, breakdown.

:func:`predict` costs the plan with :func:`costmodel.estimate.estimate` (operator graph, operator costs and their
adjustments, calibration, the paper's step 4 composition: Zhang et al. arXiv 2509.22832 §III-C) and reports the
estimate as a :class:`Prediction` (:func:`prediction`): its figures, warnings and interval, the 80 % interval of
the calibration (:mod:`planner.intervals`) where it has one, else the cost model's ensemble spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from costmodel.core.calibration import Calibration
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost.base import OperatorCostModel
from costmodel.estimate import Estimate, estimate
from costmodel.schedule.compose import GIB
from planner.intervals import plan_framework, time_band

__all__ = ["KernelRate", "Prediction", "kernel_rate", "predict", "prediction"]


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
    (:func:`costmodel.schedule.layer_split.balanced_layer_split`); None = even split."""

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict: what ``dataclasses.asdict`` returns (containers copied), without its
        deep copy of every number (a third of a batch line's time)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value):
    """A copy of a JSON-like value: dicts, lists and tuples copied, numbers, strings and None as they are."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _from_estimate(est: Estimate, warnings: Sequence[str]) -> Prediction:
    comp = est.composition
    if comp is None:
        raise ValueError("a Prediction needs an estimate of mode full")
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
        warnings=list(warnings),
        stage_times_s=[[f, b] for f, b in zip(comp.stages.fwd_s, comp.stages.bwd_s)],
        cost_model=est.cost_model,
        cost_sources=est.costed.source_counts(),
        bottleneck=comp.breakdown.bottleneck(),
        layer_split=list(est.plan.layer_split) if est.plan.layer_split is not None else None,
    )


def gpu_scale_note(calibration: Calibration | None, gpu: str, moe: bool = False, cluster: str = "") -> str | None:
    """What a GPU-scoped constant of ``calibration`` does to plans on ``gpu`` in node type ``cluster`` of a
    mixture-of-experts model when ``moe`` (planner.calibrate.Calibration.gpu_scale_note); None for no calibration or
    one without such constants."""
    note = getattr(calibration, "gpu_scale_note", None)
    return note(gpu, moe, cluster) if note is not None else None


@dataclass(frozen=True)
class KernelRate:
    """A plan costed without a GPU-scoped constant of its calibration that some measured node types of the same GPU
    do not need (planner.calibrate.NODE_EXEMPT): what the plan takes where the GPU sustains its kernel data's rate."""

    constant: str
    """The constant left out (e.g. compute_scale_gh200)."""
    value: float
    """Its value in the calibration (the factor the as-deployed prediction carries)."""
    node_types: tuple[str, ...]
    """Node types (catalogue keys) whose measurements sustain the kernel rate (the constant does not act there)."""
    iteration_time_s: float
    """Seconds per iteration without the constant."""
    mfu: float
    """Model FLOPs utilisation without the constant (fraction of dense bf16 peak)."""

    def to_dict(self) -> dict:
        return {"constant": self.constant, "value": self.value, "node_types": list(self.node_types),
                "iteration_time_s": self.iteration_time_s, "mfu": self.mfu}

    def note(self, gpu: str, cluster: str, time_s: float, mfu: float) -> str:
        """One line for a plan on ``gpu`` in node type ``cluster`` predicted at ``time_s`` and ``mfu`` as deployed."""
        where = ", ".join(f"--cluster {gpu}={c}" for c in self.node_types)
        return (f"{gpu} on {cluster} at the kernel rate (without {self.constant} = {self.value:.3g}: the rate that "
                f"node type {' and '.join(self.node_types)} sustains in its own measurements; {where} costs that node "
                f"type): the same plan {self.iteration_time_s:.3f} s, MFU {100 * self.mfu:.1f} % (predicted as "
                f"deployed: {time_s:.3f} s, {100 * mfu:.1f} %)")


def kernel_rate(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, calibration: Calibration | None,
                cost_model: OperatorCostModel | None = None) -> KernelRate | None:
    """``plan`` costed without the calibration's node-exempted GPU-scoped constant
    (planner.calibrate.Calibration.exempted_constant); None when none acts on it."""
    exempted = getattr(calibration, "exempted_constant", None)
    found = exempted(hardware.gpu.name, model.is_moe, hardware.cluster.name) if exempted is not None else None
    if found is None:
        return None
    name, node_types = found
    est = estimate(model, plan, hardware, cost_model=cost_model, calibration=calibration.without(name), mode="time")
    return KernelRate(name, calibration.value(name), node_types, est.iteration_time_s, est.metrics.mfu)


def prediction(est: Estimate, warnings: Sequence[str] | None = None) -> Prediction:
    """What planner reports of an estimate (mode full): its figures and warnings (``warnings`` replace them when
    given), with the calibration's 80 % interval, or else the cost model's ensemble spread (with ``warnings``
    given: no interval)."""
    if warnings is not None:
        return _from_estimate(est, warnings)
    pred = _from_estimate(est, est.warnings)
    cal, model = est.calibration, est.model
    found = None
    if cal is not None:
        # MoE plans: the calibration's band of MoE runs (planner.intervals.MOE_TABLE), never the dense runs'
        framework = plan_framework(est.plan)
        gpu = est.hardware.gpu.measured_as  # a declared sibling's band: the same silicon
        found = cal.interval_group(gpu, framework, moe=model.is_moe)
        if found is None and model.is_moe and cal.interval_group(gpu, framework):
            pred.warnings.append(f"no 80 % interval for mixture-of-experts plans: calibration {cal.name!r} "
                                 "has bands of dense runs only (scripts/fit_default_calibration.py adds one from "
                                 "shared/validation/moe_runs.csv)")
    note = gpu_scale_note(cal, est.hardware.gpu.name, model.is_moe, est.hardware.cluster.name)
    if note:
        pred.warnings.append(note)
    spread = est.spread() if found is None else None
    if found is not None and cal is not None:
        # 80 % interval: percentiles of held-out log(predicted / measured) of published runs of sources the
        # calibration's fold never saw (planner.intervals), for this GPU family / framework group
        key, group = found
        pred.iteration_time_low_s, pred.iteration_time_high_s = time_band(pred.iteration_time_s, group)
        pred.interval = (f"80 % interval from leave-one-source-out residuals of calibration {cal.name!r} "
                         f"({'mixture-of-experts runs, ' if model.is_moe else ''}{key}, n={group['n']})")
    elif spread is not None:
        pred.iteration_time_low_s, pred.iteration_time_high_s = spread
        pred.interval = ("ensemble spread of the operator regressors, not an 80 % interval "
                         "(no calibration with intervals applied)")
    return pred


def predict(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, cost_model: OperatorCostModel | None = None,
            calibration: Calibration | None = None) -> Prediction:
    """Predict one training iteration of ``model`` under ``plan`` on ``hardware``.

    ``calibration`` (:class:`planner.calibrate.Calibration`) scales compute / collective operator times,
    limits how much DP gradient reduction hides under backward and adds a fixed per-iteration overhead;
    None leaves the prediction exactly uncalibrated.
    """
    return prediction(estimate(model, plan, hardware, cost_model=cost_model, calibration=calibration))
