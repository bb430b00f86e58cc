"""`planner predict`: one plan from flags, or a JSONL batch (the Python API's planner.predict for each)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import describe_cost_sources
from costmodel.core.specs.plan import describe_split
from costmodel.core.specs.presets import resolve_model
from planner import cli_options as O
from planner.advice import fitting_changes, memory_advice, seq_len_note
from planner.api import predict_request
from planner.calibrate import calibration_option
from planner.formats import PLAN_FIELDS, csv_text, md_rows, prediction_row, shown_warnings
from planner.requests import PlanRequest
from planner.tables import console, print_table

FORMATS = ("table", "json", "jsonl", "csv", "md")


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def predict_one(raw: dict, hardware_files: tuple = (), calibration=None) -> dict:
    """Predict one batch-line dict; returns the JSON-ready record, ``id`` first when the line has one
    (raises PlannerError on bad input)."""
    rec = predict_request(PlanRequest.from_dict(raw), hardware_files, calibration).to_dict()
    return {"id": raw.get("id"), **rec} if isinstance(raw, dict) and "id" in raw else rec


def run_batch(lines, hardware_files: tuple = (), calibration=None):
    """Yield one output record per non-empty input line; a bad line yields {id, error}."""
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        rid = None
        try:
            raw = json.loads(line)
            if isinstance(raw, dict):
                rid = raw.get("id")
            yield predict_one(raw, hardware_files, calibration)
        except json.JSONDecodeError as exc:
            yield {"id": rid, "line": lineno,
                   "error": f"line {lineno} is not valid JSON ({exc.msg} at column {exc.colno})"}
        except RecursionError:
            yield {"id": rid, "line": lineno, "error": f"line {lineno} is nested too deeply to be a request object"}
        except (PlannerError, ValueError, TypeError, KeyError) as exc:
            yield {"id": rid, "line": lineno, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}


def _notes(req: PlanRequest) -> tuple[str, ...]:
    """The table's notes on the request: where a defaulted sequence length came from (planner.advice)."""
    note = seq_len_note(resolve_model(req.model), req.seq_len)
    return (note,) if note else ()


def _render_table(rec: dict, verbose: bool = False, notes: tuple = (), fits_with: str | None = None) -> None:
    con = console()
    p = rec["plan"]
    con.print(f"[bold]{p['model']}[/] on {p['gpus']} x {p['gpu']} ({p['cluster']}, {p['gpus_per_node']}/node)  "
              f"TP={p['tp']} PP={p['pp']} DP={p['dp']} CP={p['cp']} VPP={p['vpp']} MBS={p['mbs']} GBS={p['gbs']} "
              f"({p['gbs'] * p['seq_len'] / 1e6:.3g}M tokens) "
              f"seq={p['seq_len']} micro-batches={p['num_microbatches']} recompute={p['recompute']} "
              f"SP={p['sequence_parallel']} ZeRO={p['zero']} dtype={p['dtype']} framework={p.get('framework')}  "
              + (f"EP={p['ep']} ETP={p['etp']} EDP={p['expert_dp']} dispatcher={p['moe_dispatcher']}  "
                 if p.get("ep") is not None else "") +
              f"[dim](cost model: {describe_cost_sources(rec.get('cost_sources') or {}, rec['cost_model'])})[/]")
    print_table(con, _metrics_table(rec))
    for note in notes:
        con.print(f"note: {escape(note)}")
    advice = memory_advice(rec, moe=p.get("ep") is not None)
    if advice:
        con.print(f"[red]does not fit:[/] {escape(advice)}")
    if fits_with:
        con.print(f"note: {escape(fits_with)}")
    for table in _operator_tables(rec["breakdown"]):
        print_table(con, table, ("phase",))
    con.print(f"fitted models: {escape(rec.get('models_dir') or 'none for this GPU (roofline)')}")
    con.print(f"calibration: {escape(rec.get('calibration') or 'none')}"
              + (f"; interval: {escape(rec['interval'])}" if rec.get("interval") else ""))
    lines, note = shown_warnings(rec["warnings"], verbose)
    for w in lines:
        con.print(f"[yellow]warning:[/] {escape(w)}")
    if note:
        con.print(f"[dim]{escape(note)}[/]")


def _metrics_table(rec: dict) -> Table:
    """The prediction's figures: time, throughput, FLOP rates, bubble, memory by part, exposed communication."""
    t = Table(title="Prediction", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    band = ""
    if rec.get("iteration_time_low_s") is not None and rec.get("iteration_time_high_s") is not None:
        band = f" [{rec['iteration_time_low_s']:.4g} .. {rec['iteration_time_high_s']:.4g}]"
    t.add_row(escape("iteration time [s]"), f"{rec['iteration_time_s']:.4g}{band}")
    t.add_row(escape("throughput [tokens/s]"), f"{rec['tokens_per_s']:,.0f}")
    t.add_row(escape("throughput [tokens/s/GPU]"), f"{rec['tokens_per_s_per_gpu']:,.1f}")
    t.add_row(escape("model FLOPs [TFLOP/s/GPU]"), f"{rec['model_tflops_per_gpu']:.1f}")
    t.add_row(escape("hardware FLOPs [TFLOP/s/GPU]"), f"{rec['hardware_tflops_per_gpu']:.1f}")
    t.add_row(escape("MFU [%]"), f"{100 * rec['mfu']:.1f}")
    t.add_row(escape("pipeline bubble [%]"), f"{100 * rec['bubble_fraction']:.1f}")
    t.add_row(escape("bottleneck"), rec["bottleneck"])
    if rec.get("layer_split"):
        t.add_row(escape("layers per stage"), describe_split(rec["layer_split"]))
    mem = rec["memory"]
    fits = "fits" if rec["fits_in_memory"] else "[red]DOES NOT FIT[/]"
    t.add_row(escape("memory per GPU [GiB]"), f"{rec['memory_gib_per_gpu']:.1f} ({fits}; peak on stage {mem['stage']})")
    for part in ("weights", "gradients", "optimizer", "activations", "workspace", "allocator"):
        if part in mem:
            t.add_row(escape(f"  {part} [GiB]"), f"{mem[part]:.2f}")
    if mem.get("host"):
        t.add_row(escape("  offloaded to host [GiB]"), f"{mem['host']:.2f}")
    for k, v in rec["exposed_comm_s"].items():
        if v > 0:
            t.add_row(escape(f"exposed {k.upper()} comm [s]"), f"{v:.4g}")
    return t


def _operator_tables(breakdown: list[dict]) -> list[Table]:
    """The top operators of the critical stage, and the MoE block's operators (forward and backward summed)."""
    b = Table(title="Top operators (critical stage, whole iteration)")
    for col, just in (("operator", "left"), ("phase", "left"), ("time [s]", "right"), ("share [%]", "right")):
        b.add_column(escape(col), justify=just)
    for row in breakdown[:12]:
        b.add_row(row["operator"], row["phase"], f"{row['time_s']:.4g}", f"{100 * row['share']:.1f}")
    moe: dict[str, list[float]] = {}
    for row in breakdown:  # MoE layers: every operator of the MoE block, forward and backward summed
        if row["operator"].startswith("moe."):
            t = moe.setdefault(row["operator"], [0.0, 0.0])
            t[0] += row["time_s"]
            t[1] += row["share"]
    if not moe:
        return [b]
    m = Table(title="MoE layer operators (critical stage, fwd + bwd)")
    for col, just in (("operator", "left"), ("time [s]", "right"), ("share [%]", "right")):
        m.add_column(escape(col), justify=just)
    for name, (t, share) in sorted(moe.items(), key=lambda kv: -kv[1][0]):
        m.add_row(name, f"{t:.4g}", f"{100 * share:.1f}")
    return [b, m]


BATCH_COLUMNS = ("id", *(f.header for f in PLAN_FIELDS), "error")
"""CSV / Markdown columns of `predict --batch --format csv|md`: the request id, the plan columns, the error."""


def _write_rows(recs, fmt: str) -> None:
    """Batch records as CSV or Markdown rows, one line each as they come (a bad line: id and error only)."""
    for i, rec in enumerate(recs):
        row = {"id": rec.get("id"), "error": rec.get("error", "")}
        if "error" not in rec:
            row.update(prediction_row(rec))
        text = csv_text([row], BATCH_COLUMNS) if fmt == "csv" else md_rows([row], BATCH_COLUMNS)
        sys.stdout.write(text if i == 0 else text.split("\n", 1 if fmt == "csv" else 2)[-1])


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_command)


@O.plan_options
def predict_command(
    plan: dict,
    batch: Optional[str] = typer.Option(None, "--batch", help="JSONL file of requests ('-' = stdin)."),
    fmt: str = typer.Option(
        "table", "--format", help="table | json | csv | md; jsonl (one JSON object per line, the --batch "
        "default); csv and md give the plan columns shared with search, compare and size."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Every warning on its own line (default: "
                                 "one line per cause with a count)."),
    hardware_file: O.HardwareFile = [], wide: O.Wide = False,
    models: O.ModelsDir = None,
    calibration: O.CalibrationRef = None,
) -> None:
    """Predict iteration time, throughput, MFU, memory and operator breakdown of one plan (or a batch)."""
    if fmt not in FORMATS:
        raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    hw_files = tuple(hardware_file)
    try:
        cal = calibration_option(calibration)
    except PlannerError as exc:
        raise _err(str(exc)) from None
    if batch is not None:
        _predict_batch(batch, "jsonl" if fmt == "table" else fmt, hw_files, cal)
        return
    try:
        req = O.plan_request(plan, "planner predict --model llama-13b --gpu a100-80gb --gpus 128 --tp 2 --pp 2")
        rec = predict_request(req, hw_files, cal).to_dict()
    except PlannerError as exc:
        raise _err(str(exc)) from None
    if fmt in ("json", "jsonl"):
        typer.echo(json.dumps(rec, indent=2 if fmt == "json" else None))
    elif fmt in ("csv", "md"):
        row = prediction_row(rec)
        sys.stdout.write(csv_text([row]) if fmt == "csv" else md_rows([row]))
    else:
        fits_with = fitting_changes(req, rec, lambda r: predict_request(r, hw_files, cal).to_dict())
        _render_table(rec, verbose, _notes(req), fits_with)


def _predict_batch(batch: str, fmt: str, hw_files: tuple, cal) -> None:
    """`predict --batch FILE`: one output line per request line, as each is predicted."""
    try:
        fh = sys.stdin if batch == "-" else open(batch, encoding="utf-8")
    except OSError as exc:
        raise _err(f"cannot read batch file {batch}: {exc.strerror}; pass an existing JSONL file or '-'") from None
    with fh:
        try:
            if fmt in ("csv", "md"):
                _write_rows(run_batch(fh, hw_files, cal), fmt)
            else:  # json and jsonl: one object per line
                for rec in run_batch(fh, hw_files, cal):
                    sys.stdout.write(json.dumps(rec) + "\n")
        except UnicodeDecodeError:
            raise _err(f"batch file {batch} is not UTF-8 text; pass a JSONL file") from None
