"""`planner validate`: predicted vs measured published training runs (tables, JSON or Markdown)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from planner.calibrate import calibration_option, default_calibration_path, load_calibration
from planner.cli_options import ModelsDir, Wide, write_or_print
from planner.formats import csv_text
from planner.intervals import MIN_GROUP_RUNS
from planner.prediction import predict
from planner.reports.validate_report import (
    RUN_COLUMNS,
    ReportSection,
    build_and_write,
    headline,
    render_cv_preface,
    render_markdown,
    report_tables,
    run_rows,
    write_validation_report,
)
from planner.source_cv import CVReport, validate_source_cv
from planner.tables import console as table_console
from planner.tables import print_table, progress_bar
from planner.validation.report import (
    ValidationReport,
    default_gh200_run_file,
    default_moe_run_file,
    load_run_files,
    validate_files,
)

FORMATS = ("table", "json", "csv", "md")
CV_CHOICES = ("none", "source")


PER_RUN_TABLES = ("Predicted vs measured", "Assumptions and warnings per run")
"""Titles (starts) of the tables with one row per run: on stdout only with --verbose (the report has them)."""


TABLE_DROP = {"Predicted vs measured": ("tier", "MBS [seq]", "GBS [seq]", "GPUs [#]", "model", "GPU"),
              "Error summary": ("p90 |err| [%]", "median |err| [%]"),
              "Measured MFU": ("measured min [%]", "measured max [%]")}
"""Columns of the validation tables left out, in this order, when the terminal is too narrow (--wide: none)."""


def render_rich(report: ValidationReport, console: Console, per_run: bool = True) -> None:
    """The summary tables first (error summary, skipped runs), then, when ``per_run``, the per-run tables; each
    fitted to the console (planner.tables)."""
    tables = report_tables(report)
    summary = [t for t in tables if not t[0].startswith(PER_RUN_TABLES)]
    for title, headers, rows in summary + ([t for t in tables if t not in summary] if per_run else []):
        table = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                      pad_edge=False, padding=(0, 0, 0, 1))
        for i, h in enumerate(headers):
            number = bool(rows) and all(NUMBER.fullmatch(row[i]) for row in rows)
            table.add_column(escape(h), justify="right" if number else "left")
        for row in rows:
            table.add_row(*(escape(c) for c in row))
        print_table(console, table, next((d for k, d in TABLE_DROP.items() if title.startswith(k)), ()))
    if report.excluded_by_tier:
        console.print(f"{report.excluded_by_tier} runs left out by the tier filter.")


NUMBER = re.compile(r"[+-]?[\d,]*\.?\d+(e[+-]?\d+)?|-")
"""A cell that is a number (or '-', none): right-aligned."""


def cv_report(runs: list[Path] | None, tiers: list[str] | None, constants: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> tuple[list[Path], CVReport]:
    """Load the run files as `planner validate` does and validate them leave-one-source-out, fitting the
    constants the shipped default calibration fits (its headline is then the shipped calibration's)."""
    files, rows, wanted = load_run_files(runs, tiers)
    if constants is None and default_calibration_path().is_file():
        constants = ",".join(load_calibration(default_calibration_path()).constants)
    return files, validate_source_cv(rows, wanted, constants, progress=progress)


def calibrated_predict(calibration: str | None) -> Callable | None:
    """predict with `planner calibrate`'s constants (calibration NAME or file, 'default' = the shipped one);
    None or 'none' = uncalibrated."""
    cal = None if calibration is None else calibration_option(calibration)
    return None if cal is None else partial(predict, calibration=cal)


def resolve_cv(cv: str | None, calibration: str | None, runs=()) -> str:
    """--cv as given, else 'source' when the shipped default calibration exists and no --calibration is
    given (the shipped constants were fitted on the published runs: only held-out figures are honest), else
    'none' (predictions as planner predict makes them, uncalibrated or with --calibration)."""
    if cv is None:  # a user's own --runs file: predictions as planner predict makes them
        return "source" if not runs and calibration is None and default_calibration_path().is_file() else "none"
    if cv not in CV_CHOICES:
        raise PlannerError(f"unknown --cv {cv!r}: use none or source.")
    if cv == "source" and calibration is not None:
        raise PlannerError("--cv source fits its own constants per held-out source; drop --calibration "
                           "(or use --cv none to apply a calibration).")
    return cv


MOE_INTRO = (
    "Mixture-of-experts runs (`moe_runs.csv`; its MOE_README.md describes the sources) are validated on their "
    "own: the figures above are the dense published runs' alone. Rows the reader refuses are listed with every "
    "reason under Skipped runs. With --cv source each MoE source is predicted with constants fitted on the other "
    "MoE sources only; TFLOP/s rows are compared in the FLOPs counter their source used "
    "(search_spaces/validation/published_sources.toml, rules tflops_mcore_*).")


GH200_INTRO = (
    "Quad-GH200 (JUPITER, CSCS Alps), small-model (llm.c, nanoGPT, TinyLlama) and Blackwell (NeMo on B200 / GB200) "
    "runs (`gh200_small_blackwell_runs.csv`; GH200_SMALL_BLACKWELL_README.md describes the sources) are validated on "
    "their own, read as `published_runs.csv` is. Their TFLOP/s column is Megatron-Core's own FLOPs counter, compared "
    "in the formula of the release each source ran (search_spaces/validation/published_sources.toml, rules "
    "tflops_mcore_*); with --cv source each source is predicted with constants fitted on the other sources of this "
    "file only.")


def gh200_section(tiers: list[str] | None, cv: str, calibration: str | None) -> ReportSection | None:
    """The GH200 / small-model / Blackwell runs' section of the default report (None without the file), validated as
    :func:`moe_section` validates the MoE runs."""
    return moe_section(tiers, cv, calibration, default_gh200_run_file(),
                       ("GH200, small-model and Blackwell runs", "gh200", GH200_INTRO))


def moe_section(tiers: list[str] | None, cv: str, calibration: str | None, moe: Path | None = None,
                heading: tuple[str, str, str] = ("Mixture-of-experts runs", "moe", MOE_INTRO)) -> ReportSection | None:
    """The MoE runs' section of the default report (None when the shared data has no moe_runs.csv), validated
    the way the report's headline is (--cv source or none); with --cv source it also lists the figures of the
    shipped calibration, saying whether it was fitted on the file's runs (in-sample) or on none of them (held out).
    ``moe`` and ``heading`` (title, key, intro) validate another run file the same way."""
    moe = moe if moe is not None else default_moe_run_file()
    if moe is None:
        return None
    extra = []
    try:
        if cv == "source":
            files, rep = cv_report([moe], tiers)
            banded = [r for r in rep.predicted if getattr(r, "interval_low", None) is not None]
            if len(banded) < len(rep.predicted):
                extra.append(f"80 % interval: {len(banded)} of {len(rep.predicted)} runs get one (a held-out source "
                             f"needs >= {MIN_GROUP_RUNS} held-out residuals of the other sources, planner.intervals); "
                             "the coverage above is over those")
            if default_calibration_path().is_file():
                shipped = validate_files([moe], tiers, calibrated_predict("default"))[1]
                o = shipped.overall()
                if o is not None:
                    extra.append(f"shipped calibration ({_shipped_basis(shipped)}): MAPE {o.mape_pct:.1f} %, "
                                 f"bias {o.bias_pct:+.1f} %")
        else:
            files, rep = validate_files([moe], tiers, calibrated_predict(calibration))
    except PlannerError as exc:
        typer.echo(f"{heading[0]} not validated: {exc}", err=True)
        return None
    return ReportSection(heading[0], heading[1], rep, files, [heading[2]], extra)


def _shipped_basis(report: ValidationReport) -> str:
    """Whether the shipped calibration was fitted on the predicted runs of ``report``: held out or in-sample."""
    cal = load_calibration(default_calibration_path())
    fitted = cal.fitted_run_ids()
    ids = [r.id for r in report.predicted]
    seen = sum(i in fitted for i in ids)
    if seen == 0:
        return "fitted on none of these runs, so held out for every run of this file"
    return (f"fitted on {seen} of these {len(ids)} runs, so in-sample for them: "
            "the leave-one-source-out figures above are the held-out ones")


def _report(runs, tiers, calibration, cv, progress: bool = False) -> tuple[list[Path], ValidationReport]:
    """The validation report (a progress bar on a terminal's stderr while the runs are predicted, ``progress``)."""
    with progress_bar("predicting runs", progress) as update:
        if cv == "source":
            return cv_report(runs, tiers, progress=update)
        return validate_files(runs, tiers, calibrated_predict(calibration), progress=update)


def run_validate(runs: list[Path] | None, tiers: list[str] | None, fmt: str, out: Path | None,
                 calibration: str | None = None, cv: str = "none", verbose: bool = False, quiet: bool = False
                 ) -> str | None:
    """Load, predict and render; returns the text for json/csv/md and for a table written to ``out`` (None
    when printed as rich tables). A table printed to the terminal is the summary (headline, error summaries,
    skipped runs); the per-run rows follow only with ``verbose`` (they are in ``out``, csv, md and json). A progress
    bar shows on a terminal's stderr unless ``quiet`` or JSON."""
    if fmt not in FORMATS:
        raise PlannerError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}.")
    _, report = _report(runs, tiers, calibration, cv, progress=not quiet and fmt != "json")
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    if fmt == "csv":
        return csv_text(run_rows(report), RUN_COLUMNS)
    preface = render_cv_preface(report)
    if fmt == "md":
        return "".join(f"{line}\n\n" for line in preface) + render_markdown(report)
    console = table_console() if out is None else None
    buf = io.StringIO()
    console = console or Console(file=buf, width=240, no_color=True, force_terminal=False)
    for line in preface:
        console.print(escape(line))
    console.print(escape(headline(report)))
    per_run = verbose or out is not None
    render_rich(report, console, per_run)
    if not per_run:
        console.print(f"Per-run rows ({len(report.rows)} runs): --verbose prints them here; --report PATH.md, "
                      "--out FILE or --format csv|md|json write them.")
    return None if out is None else buf.getvalue()


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        runs: Annotated[list[Path] | None, typer.Option(
            "--runs", help="Run CSV(s) with the published_runs.csv header (default: shared/validation).")] = None,
        tier: Annotated[list[str] | None, typer.Option(
            "--tier", help="Keep only these tiers (repeat: --tier A --tier B); default all.")] = None,
        fmt: Annotated[str, typer.Option("--format", help="table | json | csv | md (csv: one row per run).")] = "table",
        out: Annotated[Path | None, typer.Option("--out", help="Write the report to this file.")] = None,
        report: Annotated[Path | None, typer.Option(
            "--report", help="Write a Markdown report with a predicted-vs-measured PNG, e.g. reports/validation.md; "
                             "prints only its summary unless --format/--out is given.")] = None,
        calibration: Annotated[str | None, typer.Option(
            "--calibration", help="With --cv none: calibration NAME (calibrations/NAME.json), file from planner "
                                  "calibrate, or 'default' (the shipped one); default uncalibrated.")] = None,
        cv: Annotated[str | None, typer.Option(
            "--cv", help="source: each source predicted by constants fitted on the other sources (leave one "
                         "source out; headline figures and 80 % interval coverage are held-out); none: "
                         "predictions as planner predict makes them. Default: source when planner ships a "
                         "default calibration and no --calibration is given, else none.")] = None,
        models: ModelsDir = None,
        verbose: Annotated[bool, typer.Option(
            "--verbose", "-v", help="Table format: also print the per-run rows after the summary.")] = False,
        quiet: Annotated[bool, typer.Option(
            "--quiet", "-q", help="No progress bar (it shows on a terminal's stderr, never with --format json).")
        ] = False,
        wide: Wide = False,
    ) -> None:
        """Compare whole-iteration predictions with measured published training runs (summary first)."""
        cv = resolve_cv(cv, calibration, runs)
        if report is not None:
            sections = [s for s in ([moe_section(tier, cv, calibration), gh200_section(tier, cv, calibration)]
                                    if not runs else []) if s is not None]
            if cv == "source":
                with progress_bar("predicting runs", not quiet) as update:
                    files_used, rep = cv_report(runs, tier, progress=update)
                files = write_validation_report(report, rep, files_used, sections=sections)
            else:
                files, rep = build_and_write(report, runs, tier, predict_fn=calibrated_predict(calibration),
                                             sections=sections)
            o = rep.overall()
            label = "cross-validated " if cv == "source" else ""
            typer.echo(f"wrote {files.markdown}" + (f" ({o.n} runs, {label}MAPE {o.mape_pct:.1f} %)" if o else ""),
                       err=True)
            if fmt == "table" and out is None:
                return
        text = run_validate(runs, tier, fmt, out, calibration, cv, verbose, quiet)
        if text is None:
            return
        write_or_print(text, out)
