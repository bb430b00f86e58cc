"""`planner validate`: predicted vs measured published training runs (tables, JSON or Markdown)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Annotated, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from costmodel.core.paths import validation_dir
from planner.validate import METRIC_UNITS, ValidationReport, load_runs, validate

RUN_FILE_NAME = "published_runs.csv"
FORMATS = ("table", "json", "md")


def default_run_file() -> Path:
    d = validation_dir()
    if d is None or not (d / RUN_FILE_NAME).is_file():
        raise PlannerError("no run file: pass --runs FILE or set PLANNER_DATA_DIR")
    return d / RUN_FILE_NAME


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def report_tables(report: ValidationReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) for every table of the report; shared by the rich and Markdown output."""
    tables = []
    pred = report.predicted
    rows = []
    for r in pred:
        lay = r.layout
        split = "/".join(str(lay[k]) for k in ("tp", "pp", "dp", "cp", "vp"))
        rows.append([r.id, r.model, r.gpu, str(r.n_gpus), split,
                     str(lay["mbs"]), str(lay["gbs"]), f"{r.metric} [{METRIC_UNITS[r.metric]}]",
                     _num(r.measured), _num(r.predicted), _pct(100 * r.error), r.tier])
    tables.append((f"Predicted vs measured ({len(pred)} runs)",
                   ["id", "model", "GPU", "GPUs [#]", "TP/PP/DP/CP/VP", "MBS [seq]", "GBS [seq]",
                    "metric [unit]", "measured [unit]", "predicted [unit]", "error [%]", "tier"], rows))
    rows = [[s.group, s.value, str(s.n), f"{s.mape_pct:.1f}", f"{s.median_abs_pct:.1f}", f"{s.p90_abs_pct:.1f}",
             _pct(s.bias_pct)] for s in report.summaries]
    tables.append(("Error summary (error = (predicted - measured) / measured)",
                   ["group", "value", "n [runs]", "MAPE [%]", "median |err| [%]", "p90 |err| [%]", "bias [%]"],
                   rows))
    skipped = report.skipped
    tables.append((f"Skipped runs ({len(skipped)})", ["id", "model", "reason"],
                   [[r.id, r.model, r.skip_reason] for r in skipped]))
    notes = [[r.id, "; ".join(r.assumptions) or "-", "; ".join(r.warnings) or "-"]
             for r in report.rows if r.assumptions or r.warnings]
    tables.append((f"Assumptions and warnings per run ({len(notes)})", ["id", "assumptions", "warnings"], notes))
    return tables


def render_markdown(report: ValidationReport) -> str:
    out = []
    for title, headers, rows in report_tables(report):
        out += [f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        out.append("")
    if report.excluded_by_tier:
        out.append(f"{report.excluded_by_tier} runs left out by the tier filter.")
    return "\n".join(out) + "\n"


def render_rich(report: ValidationReport, console: Console) -> None:
    for title, headers, rows in report_tables(report):
        table = Table(title=escape(title), title_justify="left")
        for h in headers:
            table.add_column(escape(h), overflow="fold")
        for row in rows:
            table.add_row(*(escape(c) for c in row))
        console.print(table)
    if report.excluded_by_tier:
        console.print(f"{report.excluded_by_tier} runs left out by the tier filter.")


def predict_runs(runs: Sequence[Path] | None, tiers: Sequence[str] | None,
                 calibration: str | None = None) -> tuple[list[Path], ValidationReport]:
    """Load the run files (default: shared/validation/published_runs.csv), check the tier filter and
    predict every run (with the named `planner calibrate` calibration when given)."""
    tiers = [t.upper() for t in tiers] if tiers else None
    bad = [t for t in tiers or () if t not in ("A", "B", "C")]
    if bad:
        raise PlannerError(f"unknown --tier {bad[0]!r}: use A, B or C.")
    files = list(runs) if runs else [default_run_file()]
    rows = [row for f in files for row in load_runs(f)]
    predict_fn = None
    if calibration is not None:  # planner calibrate's constants (NAME or file)
        from functools import partial

        from planner.calibrate import resolve_calibration
        from planner.predict import predict

        predict_fn = partial(predict, calibration=resolve_calibration(calibration))
    return files, validate(rows, predict_fn=predict_fn, tiers=tiers)


def run_validate(runs: list[Path] | None, tiers: list[str] | None, fmt: str, out: Path | None,
                 calibration: str | None = None) -> str | None:
    """Load, predict and render; returns the text for json/md (None when printed as rich tables)."""
    if fmt not in FORMATS:
        raise PlannerError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}.")
    _, report = predict_runs(runs, tiers, calibration)
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    if fmt == "md":
        return render_markdown(report)
    if out is None:
        render_rich(report, Console())
        return None
    buf = io.StringIO()
    render_rich(report, Console(file=buf, width=240, no_color=True, force_terminal=False))
    return buf.getvalue()


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        runs: Annotated[list[Path] | None, typer.Option(
            "--runs", help="Run CSV(s) with the published_runs.csv header (default: shared/validation).")] = None,
        tier: Annotated[list[str] | None, typer.Option(
            "--tier", help="Keep only these tiers (repeat: --tier A --tier B); default all.")] = None,
        fmt: Annotated[str, typer.Option("--format", help="table, json or md.")] = "table",
        out: Annotated[Path | None, typer.Option("--out", help="Write the report to this file.")] = None,
        report: Annotated[Path | None, typer.Option(
            "--report", help="Write a Markdown report with a predicted-vs-measured PNG, e.g. reports/validation.md; "
                             "prints only its summary unless --format/--out is given.")] = None,
        calibration: Annotated[str | None, typer.Option(
            "--calibration", help="Calibration NAME (calibrations/NAME.json) or file from planner calibrate.")] = None,
    ) -> None:
        """Compare whole-iteration predictions with measured published training runs."""
        if report is not None:
            from planner.reports.validate_report import build_and_write

            files, rep = build_and_write(report, runs, tier, calibration=calibration)
            o = rep.overall()
            typer.echo(f"wrote {files.markdown}" + (f" ({o.n} runs, MAPE {o.mape_pct:.1f} %)" if o else ""), err=True)
            if fmt == "table" and out is None:
                return
        text = run_validate(runs, tier, fmt, out, calibration)
        if text is None:
            return
        from planner.cli_options import write_or_print

        write_or_print(text, out)
