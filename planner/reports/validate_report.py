"""Markdown report of `planner validate --report PATH.md`: predicted vs measured.

The tables are planner.cli_validate's Markdown rendering (per-row table, error summaries by
source / GPU / parallelism kind / tier / metric, skipped runs, assumptions); above them, a log-log
scatter of predicted vs measured (``NAME_scatter.png`` beside the .md) with the y = x line and the
+-10 % and +-20 % bands. No date is written, so the same run files give the same report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from planner.reports.markdown import (ReportFiles, atomic_write_bytes, atomic_write_text, command_line, header,
                                      image_link, report_path, sibling)
from planner.validate import ValidationReport


def _cost_model_name() -> str:
    from planner.predict import default_cost_model

    return default_cost_model().name


def _shown(f: str | os.PathLike) -> str:
    """A run file as the report names it: relative to the working folder when given absolute."""
    p = Path(f)
    if p.is_absolute():
        try:
            p = Path(os.path.relpath(p))
        except ValueError:  # another drive (Windows)
            pass
    return p.as_posix()


def validation_report_text(md: Path, report: ValidationReport, run_files: Sequence[str | os.PathLike],
                           *, command: str | None = None, cost_model: str | None = None
                           ) -> tuple[str, list[tuple[Path, bytes]]]:
    """(Markdown, [(png path, png bytes)]) of a validation report; nothing is written."""
    from planner.cli_validate import render_markdown
    from planner.reports.plots import validation_png

    pred = report.predicted
    extra = ["", "Run files: " + ", ".join(f"`{_shown(f)}`" for f in run_files) + "; error = "
             "(predicted - measured) / measured, in the metric each run was published in."]
    parts = [header("Validation: predicted vs measured training runs", command or command_line(),
                    [cost_model or _cost_model_name()], extra)]
    overall = report.overall()
    if overall is not None:
        within10 = sum(1 for r in pred if abs(r.error) <= 0.10)
        within20 = sum(1 for r in pred if abs(r.error) <= 0.20)
        parts += [f"{overall.n} runs predicted, {len(report.skipped)} skipped: MAPE {overall.mape_pct:.1f} %, "
                  f"median |error| {overall.median_abs_pct:.1f} %, p90 {overall.p90_abs_pct:.1f} %, bias "
                  f"{overall.bias_pct:+.1f} %; {within10} within ±10 %, {within20} within ±20 %.", ""]
    else:
        parts += [f"No run could be predicted ({len(report.skipped)} skipped); see the skipped runs below.", ""]
    images = []
    if pred:
        png = validation_png([(r.source, r.metric, r.measured, r.predicted) for r in pred],
                             f"Predicted vs measured ({len(pred)} runs; bands ±10 %, ±20 %)")
        path = sibling(md, "scatter")
        images.append((path, png))
        parts += [image_link("Predicted vs measured, log-log", path, md), ""]
    parts += [render_markdown(report)]
    return "\n".join(parts).rstrip("\n") + "\n", images


def write_validation_report(path: str | os.PathLike, report: ValidationReport, run_files: Sequence[str | os.PathLike],
                            *, command: str | None = None, cost_model: str | None = None) -> ReportFiles:
    """Write the report to ``path`` (.md) and its scatter PNG beside it, each atomically, the PNG first."""
    md = report_path(path)
    text, images = validation_report_text(md, report, run_files, command=command, cost_model=cost_model)
    for p, data in images:
        atomic_write_bytes(p, data)
    atomic_write_text(md, text)
    return ReportFiles(md, [p for p, _ in images])


def build_and_write(path: str | os.PathLike, runs: Sequence[Path] | None, tiers: Sequence[str] | None,
                    *, command: str | None = None, calibration: str | None = None
                    ) -> tuple[ReportFiles, ValidationReport]:
    """Load the run files (default: shared/validation/published_runs.csv), predict (with the named
    `planner calibrate` calibration when given), write the report. Tier handling and errors are
    those of `planner validate`."""
    from planner.cli_validate import predict_runs

    md = report_path(path)
    files, report = predict_runs(runs, tiers, calibration)
    return write_validation_report(md, report, files, command=command), report
