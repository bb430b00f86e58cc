"""`planner validate`: predicted vs measured published training runs (tables, JSON or Markdown)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from planner.calibrate import resolve_calibration
from planner.cli_options import ModelsDir, write_or_print
from planner.predict import predict
from planner.reports.validate_report import build_and_write, render_markdown, report_tables
from planner.validation.report import ValidationReport, validate_files

FORMATS = ("table", "json", "md")


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


def calibrated_predict(calibration: str | None) -> Callable | None:
    """predict with `planner calibrate`'s constants (calibration NAME or file); None = uncalibrated."""
    if calibration is None:
        return None
    return partial(predict, calibration=resolve_calibration(calibration))


def run_validate(runs: list[Path] | None, tiers: list[str] | None, fmt: str, out: Path | None,
                 calibration: str | None = None) -> str | None:
    """Load, predict and render; returns the text for json/md (None when printed as rich tables)."""
    if fmt not in FORMATS:
        raise PlannerError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}.")
    _, report = validate_files(runs, tiers, calibrated_predict(calibration))
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
        models: ModelsDir = None,
    ) -> None:
        """Compare whole-iteration predictions with measured published training runs."""
        if report is not None:
            files, rep = build_and_write(report, runs, tier, predict_fn=calibrated_predict(calibration))
            o = rep.overall()
            typer.echo(f"wrote {files.markdown}" + (f" ({o.n} runs, MAPE {o.mape_pct:.1f} %)" if o else ""), err=True)
            if fmt == "table" and out is None:
                return
        text = run_validate(runs, tier, fmt, out, calibration)
        if text is None:
            return
        write_or_print(text, out)
