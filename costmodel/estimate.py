"""One function costs a plan: :func:`estimate` (model, plan, hardware) -> :class:`Estimate`.

Every way of asking for a plan's cost (``planner predict``, ``explain``, ``search``, ``calibrate``, ``validate``
and the Python API) goes through it, so they agree. The steps, in order (the paper's method, Zhang et al.
arXiv 2509.22832 §III: operator decomposition, per-operator costs, analytical timeline):

1. the operator graph of the plan (:func:`costmodel.graph.build.build_graph`);
2. one time per distinct operator from the cost model (:func:`costmodel.schedule.compose.cost_operators`);
3. the adjustments of :data:`ADJUSTMENTS`, in order, the calibration's scales last;
4. when PP x VPP does not divide the layers, the layer split:
:func:`costmodel.schedule.layer_split.balanced_layer_split`
   chooses it from steps 1-3 of the count-based default split (calibrated times, the split that fits in memory),
   and steps 1-3 run again for the chosen split;
5. the composition (:func:`costmodel.schedule.compose.compose`: stage times, 1F1B pipeline, iteration tail, breakdown,
   throughput, FLOP rates and memory) and the warnings.

``mode="time"`` is the search's fast path: it stops at the iteration time and the metrics derived from it (no
breakdown, interval ends or warnings) and gives the same iteration time as ``mode="full"``; it costs plans its
caller has checked (the search rejects plans with ``ParallelPlan.problems`` first), so it does not validate again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from costmodel.core.calibration import Calibration
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.cost import fp8_block, fp8_training, moe_kernels
from costmodel.cost.base import OperatorCostModel
from costmodel.cost.measured import default_cost_model
from costmodel.graph.block_variants import model_warnings
from costmodel.graph.build import OperatorGraph, build_graph, domain_warnings
from costmodel.schedule.compose import (
    Composition,
    Metrics,
    OperatorTimes,
    compose,
    compose_iteration_time,
    corun_slowdown,
    cost_operators,
    framework_kernels,
    metrics,
)
from costmodel.schedule.layer_split import balanced_layer_split, split_fits

MODES = ("full", "time")
"""full: everything :class:`Estimate` holds; time: iteration time and metrics only, for an already checked plan (the
search's fast path)."""


# ------------------------------------------------------------------------------------------ adjustments
@dataclass(frozen=True)
class Costing:
    """What an adjustment sees of the plan being costed."""

    plan: ParallelPlan
    hardware: Hardware
    graph: OperatorGraph
    calibration: Calibration | None
    model: ModelSpec | None = None
    """The model (the calibration may scale mixture-of-experts plans apart); None where no step needs it."""


@dataclass(frozen=True)
class Adjustment:
    """One named step applied to the cost model's operator times."""

    name: str
    apply: Callable[[Costing, OperatorTimes], OperatorTimes]
    """(plan being costed, operator times) -> adjusted times (interval ends adjusted alike)."""


def _calibration_scales(c: Costing, times: OperatorTimes) -> OperatorTimes:
    return times if c.calibration is None else times.scaled(c.calibration.scaler(c.plan, c.hardware, c.model))


ADJUSTMENTS: tuple[Adjustment, ...] = (
    # fp8-block GEMMs are costed as fp8 (fp8_block.cost_model_for), then scaled by the measured block / per-tensor
    # latency ratio
    Adjustment("block-scaled FP8", lambda c, t: fp8_block.apply(c.plan, c.hardware, c.graph, t)),
    # per-tensor fp8 GEMMs: the measured inference latency less its dynamic quantisation, plus TE's casts
    Adjustment("FP8 training basis", lambda c, t: fp8_training.apply(c.plan, c.hardware, c.graph, t)),
    Adjustment("co-run slowdown", lambda c, t: corun_slowdown(c.plan, c.hardware, t)),
    Adjustment("framework kernels", lambda c, t: framework_kernels(c.plan, c.hardware, c.graph, t)),
    Adjustment("grouped expert GEMMs", lambda c, t: moe_kernels.apply(c.plan, c.hardware, c.graph, t)),
    Adjustment("calibration", _calibration_scales),
)
"""The adjustments of the cost model's operator times, in the order they are applied (each module documents its
own: :mod:`costmodel.cost.fp8_block`, :mod:`costmodel.cost.fp8_training`,
:func:`costmodel.schedule.compose.corun_slowdown`, :mod:`costmodel.cost.framework_kernels`,
:mod:`costmodel.cost.moe_kernels`, :class:`costmodel.core.calibration.Calibration`). The calibration comes last: an
:class:`Estimate` keeps the times before it (``costed``), so another calibration is applied without costing the
plan again (:meth:`Estimate.recalibrated`)."""
_BEFORE_CALIBRATION, _CALIBRATION = ADJUSTMENTS[:-1], ADJUSTMENTS[-1]


def _costed(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, cost_model: OperatorCostModel
            ) -> OperatorTimes:
    """Steps 2-3 up to the calibration: the cost model's times with every adjustment before it."""
    times = cost_operators(graph, hardware, fp8_block.cost_model_for(plan, cost_model))
    costing = Costing(plan, hardware, graph, None)
    for step in _BEFORE_CALIBRATION:
        times = step.apply(costing, times)
    return times


def _calibrated(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, costed: OperatorTimes,
                calibration: Calibration | None) -> OperatorTimes:
    """The last adjustment: ``costed`` with the calibration's scales (itself when uncalibrated)."""
    return _CALIBRATION.apply(Costing(plan, hardware, graph, calibration, model), costed)


def _calibrated_point(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, costed: OperatorTimes,
                      calibration: Calibration | None) -> dict:
    """The last adjustment on the point times alone (what the layer-split choice and mode time compose)."""
    return calibration.scaler(plan, hardware, model)(costed.time_s) if calibration is not None else costed.time_s


def _split_and_cost(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, cost_model: OperatorCostModel,
                    calibration: Calibration | None) -> tuple[ParallelPlan, OperatorGraph, OperatorTimes]:
    """Steps 1-4: the plan with its layer split, its graph and its operator times before the calibration."""
    graph = build_graph(model, plan)
    costed = _costed(plan, hardware, graph, cost_model)
    if plan.needs_layer_split(model.num_layers):
        point = _calibrated_point(model, plan, hardware, costed, calibration)
        split = balanced_layer_split(graph, point, hardware, model.num_layers, fits=split_fits(model, plan, hardware))
        plan = replace(plan, layer_split=split)
        if split != tuple(st.layers for st in graph.stages):
            graph = build_graph(model, plan)
            costed = _costed(plan, hardware, graph, cost_model)
    return plan, graph, costed


# ------------------------------------------------------------------------------------------ the estimate
@dataclass(frozen=True)
class Estimate:
    """A costed plan: its graph, operator times, composition, metrics and warnings."""

    model: ModelSpec
    plan: ParallelPlan
    """The plan as costed: ``layer_split`` is the chosen split where PP x VPP does not divide the layers."""
    hardware: Hardware
    graph: OperatorGraph
    cost_model: str
    """Name of the operator cost model."""
    costed: OperatorTimes
    """Operator times from the cost model and every adjustment before the calibration."""
    calibration: Calibration | None
    """The calibration applied (None: none given, or it does not apply to this hardware)."""
    times: OperatorTimes
    """The operator times composed: ``costed`` with the calibration's scales (point times only in mode time)."""
    iteration_time_s: float
    metrics: Metrics
    """Throughput, FLOP rates, MFU and memory per GPU."""
    composition: Composition | None
    """Stage times, pipeline, iteration tail and breakdown (None in mode time)."""
    input_warnings: tuple[str, ...] = ()
    """Notes on the inputs: model-config keys not read, a calibration not applied, groups spanning NVLink domains,
    model blocks costed approximately (none in mode time)."""
    cost_warnings: tuple[str, ...] = ()
    """Notes of the cost model, the adjustments and the calibration, in order (none in mode time)."""

    @property
    def warnings(self) -> tuple[str, ...]:
        """Every note: the inputs', the costing's, then the composition's (rank skew, memory)."""
        own = self.composition.warnings if self.composition is not None else ()
        return self.input_warnings + self.cost_warnings + own

    def spread(self) -> tuple[float, float] | None:
        """Iteration times with every operator at the low / high end of the cost model's ensemble interval (a
        conservative band, not a joint quantile); None when the cost model gives no interval."""
        t = self.times
        if t.low_s is None or t.high_s is None or not t.has_interval:
            return None
        return (compose_iteration_time(self.plan, self.hardware, self.graph, t.low_s, self.calibration),
                compose_iteration_time(self.plan, self.hardware, self.graph, t.high_s, self.calibration))

    def recalibrated(self, calibration: Calibration | None, mode: str = "full") -> Estimate:
        """This plan (graph, layer split and operator times kept) composed with another calibration."""
        return _composed(self.model, self.plan, self.hardware, self.graph, self.costed, self.cost_model, calibration,
                         mode)


def _applicable(calibration: Calibration | None, hardware: Hardware) -> tuple[Calibration | None, list[str]]:
    """(the calibration, or None when it does not apply to ``hardware``; the note saying so)."""
    if calibration is None or calibration.applies_to(hardware):
        return calibration, []
    return None, [f"calibration {calibration.name!r} was fitted on published GPU runs: not applied to "
                  f"{hardware.gpu.name}"]


def _unread_keys(model: ModelSpec) -> list[str]:
    unread = model.extra.get("unread_keys") if isinstance(model.extra, dict) else None
    if not unread:
        return []
    shown = ", ".join(map(str, unread[:8])) + (f" and {len(unread) - 8} more" if len(unread) > 8 else "")
    return [f"{model.source or 'config.json'}: keys planner does not read, ignored: {shown} (check that they do "
            "not change the architecture)"]


def _composed(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, costed: OperatorTimes,
              cost_model: str, calibration: Calibration | None, mode: str) -> Estimate:
    """Step 5 for already costed operator times."""
    calibration, skipped = _applicable(calibration, hardware)
    if mode == "time":  # point times only: the interval ends are not composed here
        times = OperatorTimes(_calibrated_point(model, plan, hardware, costed, calibration))
        t = compose_iteration_time(plan, hardware, graph, times.time_s, calibration)
        return Estimate(model, plan, hardware, graph, cost_model, costed, calibration, times, t,
                        metrics(model, plan, hardware, t), None)
    times = _calibrated(model, plan, hardware, graph, costed, calibration)
    comp = compose(model, plan, hardware, graph, times.time_s, calibration)
    resized = [hardware.cluster.resized] if hardware.cluster.resized else []
    inputs = tuple(_unread_keys(model) + skipped + resized + domain_warnings(plan) + model_warnings(model))
    notes = costed.warnings + (tuple(calibration.warnings_for(cost_model)) if calibration is not None else ())
    return Estimate(model, plan, hardware, graph, cost_model, costed, calibration, times, comp.iteration_time_s,
                    comp.metrics, comp, inputs, notes)


def estimate(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, *, cost_model: OperatorCostModel | None = None,
             calibration: Calibration | None = None, mode: str = "full") -> Estimate:
    """Cost one training iteration of ``model`` under ``plan`` on ``hardware`` (steps in the module docstring).

    ``cost_model``: None = :func:`default_cost_model`. ``calibration`` (e.g. :class:`planner.calibrate.Calibration`):
    applied last among the adjustments and in the iteration tail; None = uncalibrated. ``mode``: one of
    :data:`MODES`. Raises :class:`costmodel.core.errors.PlanError` when the plan is not valid for the model (mode full).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "full":
        plan.validate(model)
    cost_model = cost_model or default_cost_model()
    applied = _applicable(calibration, hardware)[0]
    plan, graph, costed = _split_and_cost(model, plan, hardware, cost_model, applied)
    return _composed(model, plan, hardware, graph, costed, cost_model.name, calibration, mode)
