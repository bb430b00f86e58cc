"""`planner explain`: one plan's operator breakdown by pipeline stage and phase.

One costing (:func:`costmodel.estimate.estimate`, as `planner predict` costs the plan, with the same calibration)
gives both the prediction and the per-stage operator lists with their composed times, so the rows add up to the
stage times the prediction composes and the iteration time is predict's.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.core.calibration import Calibration
from costmodel.core.kinds import describe_cost_sources
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan, describe_split
from costmodel.cost.base import OperatorCostModel
from costmodel.estimate import Estimate, estimate
from planner.prediction import Prediction, prediction


@dataclass
class ExplainResult:
    """One plan's prediction and its operators per pipeline stage (what `planner explain` prints)."""

    model: str
    gpu: str
    cluster: str
    plan: str
    """The layout in words (ParallelPlan.factors())."""
    layer_split: list | None
    """Layers per stage when uneven (Prediction.layer_split)."""
    num_microbatches: int
    prediction: Prediction
    """The prediction, as `planner predict` makes it (same calibration, same iteration time)."""
    stages: list[dict]
    """Per stage: layers, forward/backward seconds per micro-batch, seconds per iteration by phase and every
    operator (calls per iteration, seconds per call, seconds per iteration, overlapped or not), largest first."""

    @property
    def iteration_time_s(self) -> float:
        return self.prediction.iteration_time_s

    def to_dict(self) -> dict:
        """The `planner explain --format json` object."""
        return {"model": self.model, "gpu": self.gpu, "cluster": self.cluster, "plan": self.plan,
                "layer_split": self.layer_split, "num_microbatches": self.num_microbatches,
                "prediction": self.prediction.to_dict(), "stages": self.stages}


def explain_plan(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, cost_model: OperatorCostModel | None = None,
                 calibration: Calibration | None = None) -> ExplainResult:
    """The prediction, and per stage its layers, forward/backward time per micro-batch, seconds per iteration by
    phase, and every operator (calls per iteration, seconds per call, seconds per iteration), from one costing.
    Overlapped communication (CP ring, ZeRO-3 prefetch) is listed with ``overlapped`` = True; only its part beyond
    the layer's compute is on the critical path."""
    est = estimate(model, plan, hardware, cost_model=cost_model, calibration=calibration)
    pred = prediction(est)
    stages = [_stage(est, i, pred.stage_times_s[i]) for i in range(len(est.graph.stages))]
    return ExplainResult(model.name, hardware.gpu.name, hardware.cluster.name, est.plan.factors(), pred.layer_split,
                         est.graph.num_microbatches, pred, stages)


def _stage(est: Estimate, i: int, fwd_bwd: list[float]) -> dict:
    """Stage ``i`` of an estimate: its operators, seconds per iteration each and per phase."""
    graph, times = est.graph, est.times.time_s
    st, m = graph.stages[i], graph.num_microbatches
    groups = [(st.layer_ops, st.layers * m, False), (st.layer_overlap_ops, st.layers * m, True),
              (st.stage_ops, m, False), (st.iteration_ops, 1, False)]
    ops = [(o, mult, ov) for lst, mult, ov in groups for o in lst]
    if graph.p2p is not None:
        ops.append((graph.p2p, 2 * m * graph.vpp, False))  # one send forward, one backward per chunk
    rows: dict[tuple, dict] = {}
    phases: dict[str, float] = {}
    for o, mult, ov in ops:
        t = float(times[o.key()])
        calls = o.count * mult
        row = rows.setdefault((o.name, o.phase.value, ov), {
            "operator": o.name, "kind": o.kind, "phase": o.phase.value, "overlapped": ov, "calls_per_iteration": 0.0,
            "time_per_call_s": t, "time_per_iteration_s": 0.0})
        row["calls_per_iteration"] += calls
        row["time_per_iteration_s"] += t * calls
        label = f"{o.phase.value} (overlapped)" if ov else o.phase.value
        phases[label] = phases.get(label, 0.0) + t * calls
    return {"stage": i, "layers": st.layers, "fwd_per_microbatch_s": fwd_bwd[0], "bwd_per_microbatch_s": fwd_bwd[1],
            "phases_s": phases, "operators": sorted(rows.values(), key=lambda r: -r["time_per_iteration_s"])}


def distinct_stages(stages: list[dict]) -> list[list[int]]:
    """Groups of stage indices with the same operator list (first, middle, last usually differ)."""
    groups: dict[tuple, list[int]] = {}
    for s in stages:
        sig = tuple((r["operator"], r["phase"], round(r["time_per_iteration_s"], 12)) for r in s["operators"])
        groups.setdefault(sig, []).append(s["stage"])
    return list(groups.values())


def render_explanation(ex: dict, console, top: int = 15) -> None:
    """Print an explanation with rich: stage summary, critical-stage breakdown, operators per stage (each table
    fitted to the console, planner.tables)."""
    # deferred: rich loads only when a table is printed (JSON and CSV output never need it)
    from rich.markup import escape

    from planner.tables import print_table  # deferred: as above

    pred = ex["prediction"]
    split = f"  layers per stage: {describe_split(ex['layer_split'])}" if ex.get("layer_split") else ""
    console.print(f"[bold]{ex['model']}[/] on {ex['gpu']} ({ex['cluster']}): {escape(ex['plan'])}{split}")
    lo, hi = pred.get("iteration_time_low_s"), pred.get("iteration_time_high_s")
    sources = describe_cost_sources(pred.get("cost_sources") or {}, pred["cost_model"])
    interval = f" [{lo:.3f}-{hi:.3f}]" if lo is not None and hi is not None else ""
    console.print(f"iteration {pred['iteration_time_s']:.4g} s{interval}, {pred['tokens_per_s']:,.0f} tokens/s, "
                  f"MFU {100 * pred['mfu']:.1f} %, memory {pred['memory_gib_per_gpu']:.1f} GiB/GPU, "
                  f"bubble {100 * pred['bubble_fraction']:.1f} %, bottleneck: {pred['bottleneck']}, "
                  f"{ex['num_microbatches']} micro-batches  [dim](cost model: {sources})[/]")
    stages, drop = _stage_table(ex)
    print_table(console, stages, drop)
    print_table(console, _critical_table(pred, top), ("phase",))
    for group in distinct_stages(ex["stages"]):
        print_table(console, _operator_table(ex, group, top), ("calls", "per call [s]"))


def _stage_table(ex: dict):
    """Seconds per micro-batch and per iteration by phase, per stage; and the phase columns least worth their
    room first (smallest total time)."""
    from rich.markup import escape  # deferred: rich loads only when a table is printed
    from rich.table import Table

    totals: dict[str, float] = {}
    for s in ex["stages"]:
        for p, v in s["phases_s"].items():
            totals[p] = totals.get(p, 0.0) + v
    phase_names = sorted(totals)
    t = Table(title="Per stage: seconds per micro-batch (/mb) and per iteration by phase")
    for h in ["stage", "layers", "fwd/mb [s]", "bwd/mb [s]"] + [f"{p} [s]" for p in phase_names]:
        t.add_column(escape(h), justify="right")
    for s in ex["stages"]:
        t.add_row(str(s["stage"]), str(s["layers"]), f"{s['fwd_per_microbatch_s']:.4g}",
                  f"{s['bwd_per_microbatch_s']:.4g}", *[f"{s['phases_s'].get(p, 0.0):.4g}" for p in phase_names])
    return t, [f"{p} [s]" for p in sorted(phase_names, key=totals.__getitem__)]


def _critical_table(pred: dict, top: int):
    from rich.markup import escape  # deferred: rich loads only when a table is printed
    from rich.table import Table

    b = Table(title="Critical stage, whole iteration (shares of the iteration time)")
    for col in ("operator", "phase", "time [s]", "share [%]"):
        b.add_column(escape(col), justify="left" if col in ("operator", "phase") else "right")
    for row in pred["breakdown"][:top]:
        b.add_row(escape(row["operator"]), row["phase"], f"{row['time_s']:.4g}", f"{100 * row['share']:.1f}")
    return b


def _operator_table(ex: dict, group: list[int], top: int):
    """The top operators of one stage (or of identical stages ``group``)."""
    from rich.markup import escape  # deferred: rich loads only when a table is printed
    from rich.table import Table

    s = ex["stages"][group[0]]
    label = f"stage {group[0]}" if len(group) == 1 else f"stages {group[0]}-{group[-1]}" \
        if group == list(range(group[0], group[-1] + 1)) else f"stages {', '.join(map(str, group))}"
    o = Table(title=f"Operators of {label} (per GPU, per iteration; top {top})")
    for col in ("operator", "phase", "calls", "per call [s]", "time [s]"):
        o.add_column(escape(col), justify="left" if col in ("operator", "phase") else "right")
    for r in s["operators"][:top]:
        ph = r["phase"] + (" (overlapped)" if r["overlapped"] else "")
        o.add_row(escape(r["operator"]), escape(ph), f"{r['calls_per_iteration']:g}",
                  f"{r['time_per_call_s']:.3g}", f"{r['time_per_iteration_s']:.4g}")
    return o
