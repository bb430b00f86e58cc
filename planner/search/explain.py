"""`planner explain`: one plan's operator breakdown by pipeline stage and phase.

The prediction itself comes from :func:`planner.predict.predict`; the per-stage operator lists and their times
are rebuilt here with :func:`costmodel.layer_split.costed_graph`, the function predict costs with (co-run
slowdown, framework kernels and grouped expert GEMMs applied; the cost model's cache makes the second pass
free), so the rows add up to the stage times predict composes.
"""

from __future__ import annotations

import dataclasses

from costmodel.core.kinds import describe_cost_sources
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan, describe_split
from costmodel.cost.base import OperatorCostModel
from costmodel.layer_split import costed_graph
from planner.predict import default_cost_model, predict


def explain_plan(model: ModelSpec, plan: ParallelPlan, hardware: Hardware,
                 cost_model: OperatorCostModel | None = None) -> dict:
    """JSON-ready breakdown: the prediction, and per stage its layers, forward/backward time per
    micro-batch, seconds per iteration by phase, and every operator (calls per iteration, seconds
    per call, seconds per iteration). Overlapped communication (CP ring, ZeRO-3 prefetch) is listed
    with ``overlapped`` = True; only its part beyond the layer's compute is on the critical path."""
    cost_model = cost_model or default_cost_model()
    pred = predict(model, plan, hardware, cost_model)
    if pred.layer_split is not None:  # the split predict used (chosen when PP x VPP does not divide the layers)
        plan = dataclasses.replace(plan, layer_split=tuple(pred.layer_split))
    plan, graph, costed = costed_graph(model, plan, hardware, cost_model)
    m = graph.num_microbatches
    stages = []
    for i, st in enumerate(graph.stages):
        groups = [(st.layer_ops, st.layers * m, False), (st.layer_overlap_ops, st.layers * m, True),
                  (st.stage_ops, m, False), (st.iteration_ops, 1, False)]
        ops = [(o, mult, ov) for lst, mult, ov in groups for o in lst]
        if graph.p2p is not None:
            ops.append((graph.p2p, 2 * m * graph.vpp, False))  # one send forward, one backward per chunk
        times = [costed.time_s[o.key()] for o, _, _ in ops]
        rows: dict[tuple, dict] = {}
        phases: dict[str, float] = {}
        for (o, mult, ov), t in zip(ops, times):
            calls = o.count * mult
            key = (o.name, o.phase.value, ov)
            row = rows.setdefault(key, {"operator": o.name, "kind": o.kind, "phase": o.phase.value, "overlapped": ov,
                                        "calls_per_iteration": 0.0, "time_per_call_s": float(t),
                                        "time_per_iteration_s": 0.0})
            row["calls_per_iteration"] += calls
            row["time_per_iteration_s"] += float(t) * calls
            label = f"{o.phase.value} (overlapped)" if ov else o.phase.value
            phases[label] = phases.get(label, 0.0) + float(t) * calls
        fwd, bwd = pred.stage_times_s[i] if i < len(pred.stage_times_s) else (None, None)
        stages.append({"stage": i, "layers": st.layers, "fwd_per_microbatch_s": fwd, "bwd_per_microbatch_s": bwd,
                       "phases_s": phases,
                       "operators": sorted(rows.values(), key=lambda r: -r["time_per_iteration_s"])})
    return {"model": model.name, "gpu": hardware.gpu.name, "cluster": hardware.cluster.name,
            "plan": plan.factors(), "layer_split": pred.layer_split,
            "num_microbatches": m, "prediction": pred.to_dict(), "stages": stages}


def distinct_stages(stages: list[dict]) -> list[list[int]]:
    """Groups of stage indices with the same operator list (first, middle, last usually differ)."""
    groups: dict[tuple, list[int]] = {}
    for s in stages:
        sig = tuple((r["operator"], r["phase"], round(r["time_per_iteration_s"], 12)) for r in s["operators"])
        groups.setdefault(sig, []).append(s["stage"])
    return list(groups.values())


def render_explanation(ex: dict, console, top: int = 15) -> None:
    """Print an explanation with rich: stage summary, critical-stage breakdown, operators per stage."""
    # deferred: rich loads only when a table is printed (JSON and CSV output never need it)
    from rich.markup import escape
    from rich.table import Table

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
    phase_names = sorted({p for s in ex["stages"] for p in s["phases_s"]})
    t = Table(title="Per stage: seconds per micro-batch and per iteration by phase")
    for h in ["stage", "layers", "fwd/mb", "bwd/mb"] + phase_names:
        t.add_column(escape(h), justify="right")
    for s in ex["stages"]:
        t.add_row(str(s["stage"]), str(s["layers"]), f"{s['fwd_per_microbatch_s']:.4g}",
                  f"{s['bwd_per_microbatch_s']:.4g}", *[f"{s['phases_s'].get(p, 0.0):.4g}" for p in phase_names])
    console.print(t)
    b = Table(title="Critical stage, whole iteration (shares of the iteration time)")
    for col in ("operator", "phase", "time [s]", "share [%]"):
        b.add_column(escape(col), justify="left" if col in ("operator", "phase") else "right")
    for row in pred["breakdown"][:top]:
        b.add_row(escape(row["operator"]), row["phase"], f"{row['time_s']:.4g}", f"{100 * row['share']:.1f}")
    console.print(b)
    for group in distinct_stages(ex["stages"]):
        s = ex["stages"][group[0]]
        label = f"stage {group[0]}" if len(group) == 1 else f"stages {group[0]}-{group[-1]}" \
            if group == list(range(group[0], group[-1] + 1)) else f"stages {', '.join(map(str, group))}"
        o = Table(title=f"Operators of {label} (per GPU, per iteration; top {top})")
        for col in ("operator", "phase", "calls", "s/call", "s/iteration"):
            o.add_column(escape(col), justify="left" if col in ("operator", "phase") else "right")
        for r in s["operators"][:top]:
            ph = r["phase"] + (" (overlapped)" if r["overlapped"] else "")
            o.add_row(escape(r["operator"]), escape(ph), f"{r['calls_per_iteration']:g}",
                      f"{r['time_per_call_s']:.3g}", f"{r['time_per_iteration_s']:.4g}")
        console.print(o)
