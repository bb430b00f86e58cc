"""Markdown reports of `planner search`, `planner compare` and `planner size` (``--report PATH.md``).

Each report holds the command that produced it, the planner version and cost model, the ranked
table (the same :class:`~planner.search.records.PlanRecord` cells as ``--format md``), the Pareto
front (iteration time vs USD per million tokens) and a per-plan time breakdown as PNGs saved beside
the .md (``NAME_pareto.png``, ``NAME_breakdown.png``), and the cost-model warnings, in particular
where operator shapes leave the ranges the measured regressors were fitted on. The plans shown are
predicted again (cheap, a few plans) to get their breakdown and warnings, which records do not keep.
Reports carry no date, so the same inputs give the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.cost.base import OperatorCostModel
from costmodel.estimate import default_cost_model
from planner.prediction import predict
from planner.reports.markdown import (
    ReportFiles,
    atomic_write_bytes,
    atomic_write_text,
    command_line,
    header,
    image_link,
    md_table,
    report_path,
    sibling,
)
from planner.reports.plots import BREAKDOWN_CATEGORIES, breakdown_png, pareto_png
from planner.search.allocation import dominated
from planner.search.records import PlanRecord, human_duration, pareto_front, plan_text, rank, to_markdown

BREAKDOWN_PLANS = 10
"""Most plans drawn in the breakdown plot (one bar each)."""
TOP_OPERATORS = 12
"""Operator rows listed for the first plan."""
RANGE_MARK = "outside sampled range"
"""Text the measured cost model puts in a warning when a feature leaves its training range
(costmodel.cost.measured.MeasuredCostModel)."""


# ---------------------------------------------------------------------------------------- details
@dataclass
class PlanDetail:
    """One plan shown in a report, predicted again for its breakdown and warnings."""

    label: str
    """Row label in tables and plots, e.g. '#1 a100-80gb TP2 PP4 ...'."""
    record: PlanRecord
    """The ranked record."""
    categories: dict = field(default_factory=dict)
    """Seconds per iteration per category (compute, pipeline bubble, exposed TP/DP/PP/CP/ZeRO comm, optimizer)."""
    breakdown: list = field(default_factory=list)
    """The prediction's operator rows ({operator, phase, time_s, share})."""
    warnings: list = field(default_factory=list)
    """Cost-model and memory warnings of the prediction."""


def category_seconds(breakdown: list) -> dict[str, float]:
    """Seconds per time category from a prediction's breakdown rows (their ``category``)."""
    out: dict[str, float] = {}
    for row in breakdown:
        cat = row["category"]
        out[cat] = out.get(cat, 0.0) + float(row["time_s"])
    return out


def plan_details(records: Sequence[tuple[str, PlanRecord]], model: ModelSpec,
                 hardware_of: Callable[[PlanRecord], Hardware], cost_model: OperatorCostModel | None = None,
                 calibration=None) -> list[PlanDetail]:
    """Predict each (label, record) again with ``cost_model`` (default: planner's default) and the calibration the
    record was predicted with (its breakdown then adds up to the record's iteration time)."""
    cm = cost_model or default_cost_model()
    out = []
    for label, rec in records:
        pred = predict(model, rec.to_plan(), hardware_of(rec), cm, calibration=calibration)
        out.append(PlanDetail(label, rec, category_seconds(pred.breakdown), list(pred.breakdown),
                              list(pred.warnings)))
    return out


def _hardware_lookup(hardwares: Sequence[Hardware]) -> Callable[[PlanRecord], Hardware]:
    table = {(h.gpu.name, h.cluster.name): h for h in hardwares}

    def find(rec: PlanRecord) -> Hardware:
        return table[(rec.gpu, rec.cluster)]

    return find


# --------------------------------------------------------------------------------------- sections
def _pareto(records: list[PlanRecord], title: str, group_of: Callable[[PlanRecord], str]) -> tuple[str, bytes | None]:
    """Markdown text about the front and the plot's PNG (None when no plan has a price)."""
    priced = [r for r in records if r.usd_per_mtoken is not None]
    if not priced:
        return ("No price is known for these GPUs, so there is no cost axis and no Pareto front; pass "
                "`--price GPU=USD_PER_GPU_HOUR` to get one.\n"), None
    front = pareto_front(priced)
    best = min(priced, key=lambda r: (r.iteration_time_s, r.usd_per_mtoken))
    png = pareto_png([(group_of(r), r.iteration_time_s, r.usd_per_mtoken) for r in priced],
                     [(r.iteration_time_s, r.usd_per_mtoken) for r in front], title,
                     best=(best.iteration_time_s, best.usd_per_mtoken))
    lines = [f"{len(priced)} feasible plans with a price; {len(front)} on the (iteration time, USD per million "
             "tokens) Pareto front:", ""]
    rows = [[r.gpu, f"{r.nodes} x {r.gpus_per_node}", plan_text(r), f"{r.iteration_time_s:.3f}",
             f"{r.usd_per_mtoken:.3f}", f"{100 * r.mfu:.1f}"] for r in front]
    lines.append(md_table(["GPU", "nodes x GPUs/node", "plan", "iter time [s]", "$/Mtoken", "MFU %"], rows))
    allocations = {(r.gpu, r.cluster, r.gpus) for r in priced}
    if len(allocations) == 1:
        lines.append("All plans run on one allocation (one GPU type and count), so USD per million tokens is "
                     "proportional to the iteration time and the front is the fastest plan.\n")
    return "\n".join(lines), png


def _breakdown(details: list[PlanDetail]) -> tuple[str, bytes]:
    cats = [c for c in BREAKDOWN_CATEGORIES if any(d.categories.get(c, 0.0) > 0 for d in details)]
    rows = [[d.label, f"{d.record.iteration_time_s:.3f}"] + [f"{d.categories.get(c, 0.0):.3f}" for c in cats]
            + [d.record.bottleneck] for d in details]
    text = md_table(["plan", "iter time [s]"] + [f"{c} [s]" for c in cats] + ["bottleneck"], rows)
    png = breakdown_png([(d.label, d.categories) for d in details],
                        "Where each plan's iteration time goes (critical stage, whole iteration)")
    return text, png


def _top_operators(d: PlanDetail) -> str:
    rows = [[r["operator"], r["phase"], f"{r['time_s']:.4g}", f"{100 * r['share']:.1f}"]
            for r in d.breakdown[:TOP_OPERATORS]]
    return (f"Largest operator rows of {d.label} (critical stage; `planner explain` gives every stage):\n\n"
            + md_table(["operator", "phase", "time [s]", "share [%]"], rows))


def _warnings(details: list[PlanDetail]) -> str:
    """Warnings of the plans shown, out-of-sampled-range ones first, each with the plans it concerns."""
    seen: dict[str, list[str]] = {}
    for d in details:
        for w in dict.fromkeys(d.warnings):
            seen.setdefault(w, []).append(d.label.split(" ", 1)[0])
    out_of_range = [(w, p) for w, p in seen.items() if RANGE_MARK in w]
    other = [(w, p) for w, p in seen.items() if RANGE_MARK not in w]
    lines = ["## Where the numbers leave the sampled range", ""]
    if out_of_range:
        lines += ["These operator shapes lie outside the ranges the measured regressors were fitted on; "
                  "their times are extrapolated and less certain than the rest:", "",
                  md_table(["warning", "plans"], [[w, ", ".join(p)] for w, p in sorted(out_of_range)])]
    else:
        lines += ["Every operator of the plans shown lies inside the sampled ranges of its cost model.", ""]
    lines += ["## Other warnings", ""]
    if other:
        lines += [md_table(["warning", "plans"], [[w, ", ".join(p)] for w, p in sorted(other)])]
    else:
        lines += ["None.", ""]
    return "\n".join(lines)


def _prices(hardwares: Sequence[Hardware], used: dict[str, float | None]) -> str:
    rows = []
    for h in hardwares:
        p = used.get(h.gpu.name)
        if p is None:
            rows.append([h.gpu.name, h.cluster.name, "-", "-", "no public price; pass --price"])
            continue
        cat = h.price_usd_per_gpu_hour
        src = h.cluster if h.cluster.price_usd_per_gpu_hour is not None else h.gpu
        if cat is not None and abs(cat - p) < 1e-12:
            rows.append([h.gpu.name, h.cluster.name, f"{p:.2f}", src.price_date or "undated",
                         src.price_source or "catalogue"])
        else:
            rows.append([h.gpu.name, h.cluster.name, f"{p:.2f}", "-", "--price"])
    return "Prices (USD per GPU-hour) behind the cost columns:\n\n" + md_table(
        ["GPU", "node type", "USD/GPU-h", "date", "source"], rows)


def _write(md: Path, text: str, images: list[tuple[Path, bytes]]) -> ReportFiles:
    """Write the PNGs, then the .md, each atomically (everything was rendered before the first write)."""
    for p, data in images:
        atomic_write_bytes(p, data)
    atomic_write_text(md, text)
    return ReportFiles(md, [p for p, _ in images])


def _assemble(md: Path, parts: list[str], pareto: tuple[str, bytes | None], details: list[PlanDetail],
              plans_title: str, pareto_title: str = "Pareto front: iteration time vs cost per token",
              image: str = "pareto") -> tuple[str, list[tuple[Path, bytes]]]:
    images = []
    text, png = pareto
    parts += [f"## {pareto_title}", ""]
    if png is not None:
        pp = sibling(md, image)
        images.append((pp, png))
        parts += [image_link("Pareto front", pp, md), ""]
    parts += [text]
    if details:
        btext, bpng = _breakdown(details)
        bp = sibling(md, "breakdown")
        images.append((bp, bpng))
        parts += [f"## {plans_title}", "", image_link("Per-plan time breakdown", bp, md), "", btext,
                  _top_operators(details[0]), _warnings(details)]
    return "\n".join(parts).rstrip("\n") + "\n", images


# ------------------------------------------------------------------------------------------ search
def search_report_text(md: Path, result, *, top: int = 10, command: str | None = None,
                       cost_model: OperatorCostModel | None = None) -> tuple[str, list[tuple[Path, bytes]]]:
    """(Markdown, [(png path, png bytes)]) of a search report; nothing is written."""
    p = result.problem
    recs = result.top(top)
    s = result.summary()
    hws = list({(t.hardware.gpu.name, t.hardware.cluster.name): t.hardware for t in p.targets}.values())
    cms = [r.cost_model for r in result.records] or [(cost_model or _default_cm()).name]
    alloc = ", ".join(f"{t.gpus} x {t.hardware.gpu.name} ({t.nodes} x {t.gpus_per_node} on "
                      f"{t.hardware.cluster.name})" for t in p.targets)
    extra = ["", f"Model {p.model.name}, {p.model.total_params() / 1e9:.2f} B parameters; allocation(s): {alloc}; "
             f"{p.batch_text()}, sequences of {p.seq_len} tokens"
             + (f"; token budget {p.tokens:.3g}" if p.tokens else "") + "."]
    parts = [header(f"{p.model.name}: parallel layout search", command or command_line(), cms, extra)]
    study = f"; study {result.study_name!r} holds {result.study_trials} trials" if result.study_name else ""
    trials = f" over {result.trials} trials" if result.trials else ""
    parts += [f"Search space `{p.space.name}`, {s['method']}{trials}, objective {s['objective']}: "
              f"{s['evaluated']} distinct candidates evaluated of a space of {s['space_size']}: {s['feasible']} "
              f"feasible, {s['out_of_memory']} out of memory, {s['invalid']} invalid{study}.", ""]
    if result.reasons:
        parts += ["Most common rejections: " + "; ".join(f"{r} ({n})" for r, n in result.reasons[:3]) + ".", ""]
    if not recs:
        parts += ["No feasible plan was found.", ""]
        return "\n".join(parts), []
    parts += [f"## Top {len(recs)} plans", "", "`*` = on the (iteration time, USD per million tokens) Pareto "
              "front of all feasible plans; the interval after the time is the cost model's prediction interval "
              "where it gives one.", "", to_markdown(recs),
              _prices(hws, {r.gpu: r.price_usd_per_gpu_hour for r in result.records})]
    details = plan_details([(f"#{r.rank} {r.gpu} {plan_text(r)}", r) for r in recs[:BREAKDOWN_PLANS]], p.model,
                           _target_lookup(p), cost_model, p.calibration)
    many_gpus = len({t.hardware.gpu.name for t in p.targets}) > 1
    group = (lambda r: f"{r.gpus} x {r.gpu}") if (many_gpus or len(p.targets) > 1) else (lambda r: r.gpu)
    pareto = _pareto(result.records, f"{p.model.name}: every feasible plan found", group)
    return _assemble(md, parts, pareto, details, f"Time breakdown of the top {len(details)} plans")


def _default_cm():
    return default_cost_model()


def _target_lookup(problem) -> Callable[[PlanRecord], Hardware]:
    table = {(t.hardware.gpu.name, t.hardware.cluster.name, t.gpus): t.hardware for t in problem.targets}
    return lambda r: table[(r.gpu, r.cluster, r.gpus)]


def write_search_report(path: str | os.PathLike, result, *, top: int = 10, command: str | None = None,
                        cost_model: OperatorCostModel | None = None) -> ReportFiles:
    """Write the report of a :class:`planner.search.engine.SearchResult` to ``path`` (.md) and its PNGs
    beside it. ``command`` defaults to sys.argv as ``planner ...``."""
    md = report_path(path)
    text, images = search_report_text(md, result, top=top, command=command, cost_model=cost_model)
    return _write(md, text, images)


# ----------------------------------------------------------------------------------------- compare
def write_compare_report(path: str | os.PathLike, rows: list, model: ModelSpec, *, tokens: float | None = None,
                         command: str | None = None, cost_model: OperatorCostModel | None = None) -> ReportFiles:
    """Report of `planner compare`: best plan per GPU type, every type's feasible plans on one Pareto plot."""
    md = report_path(path)
    best = [r.best for r in rows if r.best is not None]
    cms = [b.cost_model for b in best] or [(cost_model or _default_cm()).name]
    r0 = rows[0].result.problem if rows else None
    extra = ["", f"Model {model.name}, {model.total_params() / 1e9:.2f} B parameters"
             + (f"; {r0.batch_text()}, sequences of {r0.seq_len} tokens" if r0 else "")
             + (f"; token budget {tokens:.3g}" if tokens else "") + "; each GPU type searched exhaustively "
             f"(space `{r0.space.name if r0 else '-'}`), ranked by iteration time."]
    parts = [header(f"{model.name}: " + " vs ".join(r.gpu for r in rows) + " (cost per token)",
                    command or command_line(), cms, extra)]
    head = ["GPU", "nodes x GPUs/node", "plan", "iter time [s]", "tokens/s", "MFU %", "$/Mtoken"]
    if tokens:
        head += ["time to train", "cost to train [$]"]
    head += ["feasible / evaluated"]
    table = []
    for r in rows:
        s = r.result.summary()
        b = r.best
        if b is None:
            table.append([r.gpu, "-", r.message] + ["-"] * (len(head) - 4) + [f"0 / {s['evaluated']}"])
            continue
        row = [b.gpu, f"{b.nodes} x {b.gpus_per_node}", plan_text(b), f"{b.iteration_time_s:.3f}",
               f"{b.tokens_per_s:,.0f}", f"{100 * b.mfu:.1f}",
               "-" if b.usd_per_mtoken is None else f"{b.usd_per_mtoken:.3f}"]
        if tokens:
            row += [human_duration(b.time_to_train_s),
                    "-" if b.cost_to_train_usd is None else f"{b.cost_to_train_usd:,.0f}"]
        table.append(row + [f"{s['feasible']} / {s['evaluated']}"])
    parts += ["## Best plan per GPU type", "", md_table(head, table)]
    cheapest = min((b for b in best if b.usd_per_mtoken is not None), key=lambda b: b.usd_per_mtoken, default=None)
    fastest = min(best, key=lambda b: b.iteration_time_s, default=None)
    if cheapest is not None and fastest is not None:
        parts += [f"Fastest: {fastest.gpu} ({fastest.iteration_time_s:.3f} s per iteration). Cheapest per token: "
                  f"{cheapest.gpu} (${cheapest.usd_per_mtoken:.3f} per million tokens).", ""]
    parts += [_prices([r.hardware for r in rows], {r.gpu: (r.best.price_usd_per_gpu_hour if r.best else None)
                                                  for r in rows})]
    parts += _compare_basis(rows, model)
    parts += ["### Ranked best plans", "", to_markdown(rank(best, "time", None)) if best else "None fits.\n"]
    every = [rec for r in rows for rec in r.result.records]
    details = plan_details([(f"#{i} {b.gpu} {plan_text(b)}", b) for i, b in enumerate(rank(best, "time", None), 1)],
                           model, _hardware_lookup([r.hardware for r in rows]), cost_model,
                           r0.calibration if r0 is not None else None)
    pareto = _pareto(every, f"{model.name}: every feasible plan per GPU type", lambda r: r.gpu)
    text, images = _assemble(md, parts, pareto, details, "Time breakdown of each GPU type's best plan")
    return _write(md, text, images)


def _compare_basis(rows: list, model: ModelSpec) -> list[str]:
    """The GPU and node figures the comparison turns on, the calibration's GPU-scoped constants and each best plan at
    its GPU's kernel rate where measured node types sustain it (`planner compare` prints the same lines)."""
    from planner.reports.results import compare_basis_lines  # deferred: rich loads with it

    lines = compare_basis_lines(rows, model.is_moe)
    return ["### GPUs and node types", "", *(f"- {line}" for line in lines), ""] if lines else []


# -------------------------------------------------------------------------------------------- size
def write_size_report(path: str | os.PathLike, res, model: ModelSpec, tokens: float, deadline_s: float,
                      hardwares: Sequence[Hardware], *, command: str | None = None,
                      cost_model: OperatorCostModel | None = None, calibration=None) -> ReportFiles:
    """Report of `planner size`: the allocations that meet the deadline (smallest, cheapest, smallest per GPU
    type) with their goodput, the frontier (GPUs vs days vs USD) as a table and a plot, the GPU types left out and
    why, the notes the answer rests on, and each allocation's plan breakdown (predicted with ``calibration``, the
    one the sizing applied)."""
    from planner.reports.results import goodput_cells, size_allocations  # deferred: rich loads with it

    md = report_path(path)
    allocs = size_allocations(res)
    cms = [a.record.cost_model for _, a in allocs]
    extra = ["", f"Model {model.name}, {model.total_params() / 1e9:.2f} B parameters; {tokens:.3g} tokens within "
             f"{human_duration(deadline_s)}; GPU types considered: {', '.join(h.gpu.name for h in hardwares)}; every "
             "node count from --min-gpus to --max-gpus is considered (planner/search/allocation.py: an exhaustive "
             "anchor search, per-shape bisection, one node fewer than the answer searched exhaustively)."]
    parts = [header(f"{model.name}: sizing an allocation for {tokens:.3g} tokens in {human_duration(deadline_s)}",
                    command or command_line(), cms, extra)]
    rows = []
    for label, a in allocs:
        b = a.record
        rows.append([label, b.gpu, f"{b.nodes} x {b.gpus_per_node}", str(b.gpus), plan_text(b),
                     f"{b.iteration_time_s:.3f}", human_duration(b.time_to_train_s), *goodput_cells(b),
                     f"{a.gpu_hours:,.0f}", "-" if a.cost_usd is None else f"{a.cost_usd:,.0f}"])
    parts += ["## Allocations that meet the deadline", "",
              md_table(["", "GPU", "nodes x GPUs/node", "GPUs", "plan", "iter time [s]", "time to train", "goodput",
                        "ckpt every [min]", "ckpt every [iterations]", "interruptions", "lost [GPU-h]", "GPU-hours",
                        "cost [$]"], rows),
              _prices(list(hardwares), {a.record.gpu: a.record.price_usd_per_gpu_hour for _, a in allocs})]
    parts += _size_context(res)
    recs = [replace(a.record, rank=i, pareto=False) for i, (_, a) in enumerate(allocs, 1)]
    parts += ["### Plans", "", "Numbered as the allocation table above.", "", to_markdown(recs)]
    details = plan_details([(f"#{i} {label}: {a.record.gpus} x {a.record.gpu} {plan_text(a.record)}", a.record)
                            for i, (label, a) in enumerate(allocs, 1)], model, _hardware_lookup(hardwares),
                           cost_model, calibration)
    text, images = _assemble(md, parts, _frontier(res, deadline_s, model), details,
                             "Time breakdown of each allocation's plan", "Frontier: GPUs vs days vs USD", "frontier")
    return _write(md, text, images)


def _size_context(res) -> list[str]:
    """The GPU types left out (and why) and the notes the answer rests on (batch, proof, goodput, prices)."""
    out = ["## What the answer rests on", ""]
    if res.left_out:
        out += ["GPU types without an answer:", "", md_table(["GPU", "why"], [[g, w] for g, w in res.left_out])]
    out += [f"- {n}" for n in res.notes] + [""]
    return out


def _frontier(res, deadline_s: float, model: ModelSpec) -> tuple[str, bytes | None]:
    """The frontier of every GPU type as a table and the plot's PNG (GPUs vs days vs USD)."""
    from planner.reports.plots import frontier_png  # deferred: matplotlib loads with it

    rows, series = [], {}
    for t in res.types:
        beaten = dominated(t.frontier)
        for p in t.frontier:
            r = p.record
            rows.append([t.gpu, str(p.nodes), f"{p.gpus:,}", "-" if p.days is None else f"{p.days:.2f}",
                         "-" if p.cost_usd is None else f"{p.cost_usd:,.0f}", "yes" if p.meets(deadline_s) else "no",
                         "every plan" if p.exhaustive else "plan shapes", "yes" if p.nodes in beaten else "no",
                         plan_text(r)])
            series.setdefault(t.gpu, []).append((p.gpus, p.days, None if p.cost_usd is None else p.cost_usd / 1e6,
                                                 p.meets(deadline_s)))
    if not rows:
        return "No allocation was costed.\n", None
    png = frontier_png(series, deadline_s / 86400.0, f"{model.name}: expected days and cost to train vs GPUs")
    text = ("Expected days and cost to train (goodput included where a failure model was used) of every allocation "
            "costed; the smallest allocation and one node fewer are searched over every plan, the others over the "
            "plan shapes fastest on the smallest at every MBS; dominated: a smaller allocation of the GPU type "
            "trains in no more days for no more USD (the batch caps DP):\n\n" + md_table(
                ["GPU", "nodes", "GPUs", "days", "cost [$]", "meets the deadline", "searched", "dominated", "plan"],
                rows))
    return text, png
