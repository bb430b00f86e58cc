"""Console output of `planner search`, `compare`, `size` and `explain` in every format (table | json | csv | md).

Plan columns (CSV and the Markdown of size) come from :data:`planner.formats.PLAN_FIELDS` through
:func:`planner.search.records.to_csv`, so the three commands share their names and units. The command
module (planner/cli_search.py) parses flags and runs; this module prints.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.formats import PLAN_FIELDS, csv_text, md_rows, plan_row
from planner.prediction import gpu_scale_note
from planner.search.allocation import dominated
from planner.search.explain import render_explanation
from planner.tables import console, is_wide, print_table
from planner.search.records import (
    DROP_FIRST,
    MARKERS,
    flat_record,
    human_duration,
    plan_text,
    rich_table,
    to_csv,
    to_json,
    to_markdown,
)


def emit_records(records, fmt: str, model, meta: dict, title: str) -> None:
    """Ranked plans (search, compare) in ``fmt``."""
    if fmt == "json":
        typer.echo(to_json(records, meta))
    elif fmt == "csv":
        sys.stdout.write(to_csv(records, model))
    elif fmt == "md":
        sys.stdout.write(to_markdown(records))
    else:
        con = console()
        print_table(con, rich_table(records, title, is_wide()), DROP_FIRST, MARKERS,
                    [f"{r.rank}{'*' if r.pareto else ''}" for r in records])


# ------------------------------------------------------------------------------------------- explain
EXPLAIN_COLUMNS = ("Stage", "Layers", "Operator", "Kind", "Phase", "Overlapped", "Calls per Iteration",
                   "Time per Call [s]", "Time per Iteration [s]")
"""CSV / Markdown columns of `planner explain`: one row per (pipeline stage, operator)."""


def explain_rows(ex: dict) -> list[dict]:
    """One row per (stage, operator) of an explanation (planner.search.explain.explain_plan)."""
    return [dict(zip(EXPLAIN_COLUMNS, (s["stage"], s["layers"], r["operator"], r.get("kind", ""), r["phase"],
                                       r["overlapped"], f"{r['calls_per_iteration']:g}", f"{r['time_per_call_s']:.6g}",
                                       f"{r['time_per_iteration_s']:.6g}")))
            for s in ex["stages"] for r in s["operators"]]


def explain_out(result, fmt: str, top: int = 15) -> None:
    """Print an explanation (planner.search.explain.ExplainResult) in ``fmt``."""
    ex = result.to_dict()
    if fmt == "json":
        typer.echo(json.dumps(ex, indent=2))
    elif fmt == "csv":
        sys.stdout.write(csv_text(explain_rows(ex), EXPLAIN_COLUMNS))
    elif fmt == "md":
        sys.stdout.write(md_rows(explain_rows(ex), EXPLAIN_COLUMNS))
    else:
        render_explanation(ex, console(), top)


# ------------------------------------------------------------------------------------------- compare
COMPARE_HEAD = ("GPU", "node type", "nodes x GPUs/node", "plan", "iter time [s]", "tokens/s", "MFU [%]",
                "$/GPU-h (date, source)", "cost [$/Mtoken]")
COMPARE_TRAIN = ("time to train", "cost to train [$]", "goodput", "ckpt every [min / it]")
COMPARE_SHORT = {"nodes x GPUs/node": "nodes x GPUs", "iter time [s]": "time [s]", "$/GPU-h (date, source)":
                 "$/GPU-h", "cost [$/Mtoken]": "$/Mtok", "time to train": "train", "cost to train [$]": "train [$]",
                 "ckpt every [min / it]": "ckpt [min / it]"}
COMPARE_DROP = ("node type", "tokens/s", "ckpt [min / it]", "goodput", "$/GPU-h", "MFU [%]", "train [$]")
"""Columns of `planner compare` left out, in this order, when the terminal is too narrow (--wide: none)."""


def _compare_cells(r, tokens, wide: bool) -> list[str]:
    """One GPU type's row of the compare table."""
    b, g = r.best, r.hardware.gpu
    price = "-" if b.price_usd_per_gpu_hour is None else f"{b.price_usd_per_gpu_hour:.2f}"
    if wide and b.price_usd_per_gpu_hour is not None:
        price += (" (--price)" if b.price_usd_per_gpu_hour != g.price_usd_per_gpu_hour
                  else f" ({g.price_date or 'undated'}, {g.price_source or '--price'})")
    nodes = f"{b.nodes} x {b.gpus_per_node}" if wide else f"{b.nodes}x{b.gpus_per_node}"
    row = [b.gpu, r.hardware.cluster.name, nodes, plan_text(b), f"{b.iteration_time_s:.3f}",
           f"{b.tokens_per_s:,.0f}", f"{100 * b.mfu:.1f}", price,
           "-" if b.usd_per_mtoken is None else f"{b.usd_per_mtoken:.3f}"]
    if tokens:
        gc = goodput_cells(b)
        row += [human_duration(b.time_to_train_s),
                "-" if b.cost_to_train_usd is None else f"{b.cost_to_train_usd:,.0f}", gc[0], f"{gc[1]} / {gc[2]}"]
    return row


def compare_table(m, rows, tokens) -> None:
    """The rich table of `planner compare`: best plan per GPU type (or why none), then the hardware and notes."""
    wide = is_wide()
    t = Table(title=f"{m.name}: best plan per GPU type" + (f", {tokens:.3g} tokens" if tokens else "")
              + (f", seq {rows[0].result.problem.seq_len}" if rows else ""))
    head = [*COMPARE_HEAD, *(COMPARE_TRAIN if tokens else ())]
    for h in head:
        t.add_column(escape(h if wide else COMPARE_SHORT.get(h, h)),
                     justify="left" if h in ("GPU", "plan") else "right")
    for r in rows:
        if r.best is None:
            t.add_row(r.gpu, r.hardware.cluster.name, "-", escape(r.message), *["-"] * (len(head) - 4))
        else:
            t.add_row(*[escape(c) for c in _compare_cells(r, tokens, wide)])
    con = console()
    print_table(con, t, COMPARE_DROP)
    for line in compare_basis_lines(rows, m.is_moe):
        con.print(escape(line))
    for note in compare_notes(rows):
        con.print(("" if note.startswith("warning") else "note: ") + escape(note))


def compare_notes(rows) -> list[str]:
    """The batch each GPU type ran, where the batch limits scaling, the goodput model, and the prices' sources."""
    from planner.search.nofit import search_notes  # deferred: the search package loads with the command
    from planner.search.sizing import price_notes  # deferred: as above
    from planner.search.space import settings_note  # deferred: as above

    notes: list[str] = []
    for r in rows:
        p = r.result.problem
        settings = settings_note(p.space, p.model.is_moe)
        for note in (*((p.batch_note(),) if p.batch_note() else ()), *search_notes(r.result),
                     *((settings,) if settings else ())):
            if note.startswith("the batch"):
                note = f"{r.gpu}: {note}"
            if note not in notes:
                notes.append(note)
    overrides = {r.gpu: r.result.problem.prices[r.gpu] for r in rows if r.gpu in r.result.problem.prices}
    return notes + price_notes(rows, overrides)



def _calibration(rows):
    """The calibration the compared rows were predicted with (None: uncalibrated or not known)."""
    return next((c for r in rows if (c := getattr(r.result.problem, "calibration", None)) is not None), None)


def compare_basis_lines(rows, moe: bool = False) -> list[str]:
    """What a comparison of ``rows`` (planner.search.sizing.CompareRow) turns on, as `planner compare` prints it and
    its report lists it: :func:`hardware_lines` for their GPUs, node types and calibration, then each best plan at its
    GPU's kernel rate where measured node types sustain it (CompareRow.kernel_rate_note)."""
    lines = hardware_lines([r.hardware for r in rows], _calibration(rows), moe)
    return lines + [n for r in rows if (n := r.kernel_rate_note())]


def hardware_lines(hardwares, calibration=None, moe: bool = False) -> list[str]:
    """One line per GPU on its node type with the datasheet and node figures a comparison turns on, then, for GPUs of
    one die, what differs between them (costmodel.cost.basis): why their predictions differ, including a GPU-scoped
    constant of ``calibration`` (planner.calibrate.GPU_SCOPED) as it acts on plans of a mixture-of-experts model when
    ``moe``."""
    # deferred: the cost-model basis module loads only where a comparison prints
    from costmodel.cost.basis import die_of

    out = []
    for hw in hardwares:
        g, c = hw.gpu, hw.cluster
        out.append(f"{g.name} on {c.name}: {c.gpus_per_node} GPUs per node, NVLink domain {hw.nvlink_domain} at "
                   f"{c.intra_node_bw_gbs:g} GB/s, network {c.inter_node_bw_gbs:g} GB/s per GPU; bf16 peak "
                   f"{g.peak_tflops.get('bf16', 0):g} TFLOP/s, HBM {g.hbm_bw_gbs:,.0f} GB/s, {g.hbm_gb:g} GB"
                   + (f" ({c.resized})" if c.resized else ""))
    for i, a in enumerate(hardwares):
        for b in hardwares[i + 1:]:
            die = die_of(a.gpu.name)
            if die is not None and die == die_of(b.gpu.name):
                out.append(f"{a.gpu.name} and {b.gpu.name}: the same {die} die; they differ in HBM "
                           f"({a.gpu.hbm_bw_gbs:,.0f} vs {b.gpu.hbm_bw_gbs:,.0f} GB/s, {a.gpu.hbm_gb:g} vs "
                           f"{b.gpu.hbm_gb:g} GB) and node type ({a.cluster.name} vs {b.cluster.name}: network "
                           f"{a.cluster.inter_node_bw_gbs:g} vs {b.cluster.inter_node_bw_gbs:g} GB/s per GPU, "
                           f"NVLink domains of {a.nvlink_domain} vs {b.nvlink_domain})")
    for gpu, cluster in dict.fromkeys((hw.gpu.name, hw.cluster.name) for hw in hardwares):
        note = gpu_scale_note(calibration, gpu, moe, cluster)
        if note:
            out.append(note)
    return out


# ---------------------------------------------------------------------------------------------- size
SIZE_COLUMNS = ("Allocation", "GPU-hours [GPU-h]", "Node-hours [node-h]", "Cost [USD]", "Goodput",
                "Checkpoint Interval [min]", "Checkpoint Interval [iterations]", "Interruptions", "Lost [GPU-h]",
                "Searched")
"""Columns of `planner size` besides the plan columns (planner.formats.PLAN_FIELDS)."""


def size_allocations(res) -> list[tuple[str, object]]:
    """(label, Allocation) rows of a sizing answer: smallest, cheapest (if another), smallest per GPU type."""
    rows = [("smallest", res.smallest)]
    if res.cheapest is not None and res.cheapest is not res.smallest \
            and res.cheapest.record.key() != res.smallest.record.key():
        rows.append(("cheapest", res.cheapest))
    elif res.cheapest is not None:
        rows[0] = ("smallest & cheapest", res.smallest)
    rows += [(f"smallest {a.record.gpu}", a) for a in res.per_gpu
             if a.record.key() not in {x.record.key() for _, x in rows}]
    return rows


def goodput_cells(r) -> list[str]:
    """Goodput, checkpoint interval (min, iterations), expected interruptions and lost GPU-hours of a record."""
    if r.goodput is None:
        return ["-"] * 5
    return [f"{r.goodput:.3f}", "-" if r.checkpoint_interval_s is None else f"{r.checkpoint_interval_s / 60:.1f}",
            "-" if r.checkpoint_interval_iters is None else str(r.checkpoint_interval_iters),
            "-" if r.interruptions is None else f"{r.interruptions:.0f}",
            "-" if r.lost_gpu_hours is None else f"{r.lost_gpu_hours:,.0f}"]


def size_rows(m, res) -> list[dict]:
    """CSV / Markdown rows of `planner size`: the allocation label, its figures, then the plan columns."""
    out = []
    for label, a in size_allocations(res):
        own = dict(zip(SIZE_COLUMNS, (label, f"{a.gpu_hours:.6g}", f"{a.node_hours:.6g}",
                                      "" if a.cost_usd is None else f"{a.cost_usd:.6g}", *goodput_cells(a.record),
                                      "exhaustive" if a.exhaustive else "plan shapes")))
        out.append({**own, **plan_row(flat_record(a.record, m))})
    return out


def size_out(result, fmt: str) -> None:
    """Print a sizing answer (planner.search.api.SizeResult) in ``fmt``."""
    if fmt == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    m, tokens, deadline_s, res = result.spec, result.tokens, result.deadline_s, result.sizing
    if fmt in ("csv", "md"):
        rows = size_rows(m, res)
        head = [*SIZE_COLUMNS, *(f.header for f in PLAN_FIELDS)]
        sys.stdout.write(csv_text(rows, head) if fmt == "csv" else md_rows(rows, head))
        return
    con = console()
    con.print(f"[bold]{escape(m.name)}[/]: {tokens:.3g} tokens within {human_duration(deadline_s)}, seq "
              f"{_size_seq(res)} "
              f"({res.searched} allocations evaluated" + (", interrupted" if res.interrupted else "") + ")")
    print_table(con, allocation_table(res), SIZE_DROP)
    frontier, marks = frontier_table(res, deadline_s)
    print_table(con, frontier, FRONTIER_DROP, FRONTIER_MARKERS, marks)
    for gpu, why in res.left_out:
        con.print(f"left out {escape(gpu)}: {escape(why)}")
    for note in res.notes:
        con.print(("" if note.startswith("warning") else "note: ") + escape(note))


SIZE_HEAD = ("", "GPU", "node type", "nodes x GPUs/node", "GPUs", "plan", "time to train", "goodput",
             "ckpt every [min / it]", "interruptions", "lost [GPU-h]", "GPU-hours [GPU-h]", "cost [$]")
SIZE_SHORT = {"nodes x GPUs/node": "nodes x GPUs", "time to train": "train", "ckpt every [min / it]":
              "ckpt [min / it]", "interruptions": "stops", "lost [GPU-h]": "lost [GPU-h]",
              "GPU-hours [GPU-h]": "GPU-h"}
SIZE_DROP = ("node type", "stops", "lost [GPU-h]", "ckpt [min / it]", "goodput", "GPUs")
"""Columns of the allocations table left out, in this order, when the terminal is too narrow (--wide: none)."""
FRONTIER_DROP = ("USD/GPU-h", "cost [$]")
FRONTIER_MARKERS = {"*": "meets the deadline", "e": "best of every plan (exhaustive search; unmarked: best of the "
                    "plan shapes searched)", "d": "dominated: a smaller allocation of the GPU type trains in no more "
                    "days for no more USD (the batch caps DP)"}
"""Markers of the frontier's nodes column."""


def _size_seq(res) -> str:
    """The sequence length the sizing searched (its first allocation's plans)."""
    a = res.smallest or next(iter(res.per_gpu), None)
    return str(a.record.seq_len) if a is not None else "-"


def allocation_table(res) -> Table:
    """Allocations that meet the deadline: the smallest, the cheapest, the smallest per GPU type."""
    wide = is_wide()
    t = Table(title="Allocations that meet the deadline" + (" (expected times: goodput model)" if res.failures
                                                            is not None else " (a perfect run)"))
    for h in SIZE_HEAD:
        t.add_column(escape(h if wide else SIZE_SHORT.get(h, h)), justify="left" if h in ("", "GPU", "plan")
                     else "right")
    for label, a in size_allocations(res):
        b = a.record
        g = goodput_cells(b)
        nodes = f"{b.nodes} x {b.gpus_per_node}" if wide else f"{b.nodes}x{b.gpus_per_node}"
        t.add_row(escape(label), b.gpu, b.cluster, nodes, f"{b.gpus:,}", escape(plan_text(b)),
                  human_duration(b.time_to_train_s), g[0], f"{g[1]} / {g[2]}", g[3], g[4], f"{a.gpu_hours:,.0f}",
                  "-" if a.cost_usd is None else f"{a.cost_usd:,.0f}")
    return t


def frontier_table(res, deadline_s: float) -> tuple[Table, list[str]]:
    """Frontier of every GPU type: GPUs vs expected days vs USD (meeting the deadline or not), and the marked
    cells (for the legend)."""
    t = Table(title="Frontier: GPUs vs days vs USD")
    for h in ("GPU", "nodes", "GPUs", "days", "cost [$]", "USD/GPU-h", "plan"):
        t.add_column(h, justify="left" if h in ("GPU", "plan") else "right")
    marks = []
    for ty in res.types:
        beaten = dominated(ty.frontier)
        for p in ty.frontier:
            r = p.record
            mark = ("*" if p.meets(deadline_s) else " ") + ("e" if p.exhaustive else " ") + ("d" if p.nodes in beaten
                                                                                            else "")
            marks.append(mark)
            t.add_row(ty.gpu, f"{p.nodes}{mark}", f"{p.gpus:,}", "-" if p.days is None else f"{p.days:.1f}",
                      "-" if p.cost_usd is None else f"{p.cost_usd:,.0f}",
                      "-" if r.price_usd_per_gpu_hour is None else f"{r.price_usd_per_gpu_hour:.2f}",
                      escape(plan_text(r)))
    return t, marks


@contextmanager
def working(description: str):
    """A spinner with the elapsed time on stderr while a long step runs (terminals only; gone when done)."""
    # deferred: the progress display loads only around a long step
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True, disable=not console.is_terminal) as bar:
        bar.add_task(description, total=None)
        yield
