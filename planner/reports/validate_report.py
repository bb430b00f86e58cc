"""Markdown report of `planner validate --report PATH.md`: predicted vs measured.

:func:`report_tables` gives every table of a validation (per-row table, error summaries by source / GPU /
parallelism kind / tier / metric, measured and predicted MFU per source and GPU, skipped runs, assumptions);
``planner validate`` prints them (rich or Markdown) and the report writes them as Markdown. Above them, the report
has a log-log scatter of predicted vs measured (``NAME_scatter.png`` beside the .md) with the y = x line and the
+-10 % and +-20 % bands. No date is written, so the same run files give the same report.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from costmodel.estimate import default_cost_model
from planner.reports.markdown import (
    ReportFiles,
    atomic_write_bytes,
    atomic_write_text,
    command_line,
    header,
    image_link,
    report_path,
    sibling,
)
from planner.validation.report import ValidationReport, validate_files
from planner.validation.runs import METRIC_UNITS


def _cost_model_name() -> str:
    return default_cost_model().name


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
    keys = ("tp", "pp", "dp", "cp", "vp") + (("ep", "etp") if any("ep" in r.layout for r in pred) else ())
    for r in pred:
        lay = r.layout
        split = "/".join(str(lay.get(k, "-")) for k in keys)
        rows.append([r.id, r.model, r.gpu, str(r.n_gpus), split,
                     str(lay["mbs"]), str(lay["gbs"]), f"{r.metric} [{METRIC_UNITS[r.metric]}]",
                     _num(r.measured), _num(r.predicted), _pct(100 * r.error), r.tier])
    tables.append((f"Predicted vs measured ({len(pred)} runs)",
                   ["id", "model", "GPU", "GPUs [#]", "/".join(k.upper() for k in keys), "MBS [seq]", "GBS [seq]",
                    "metric [unit]", "measured [unit]", "predicted [unit]", "error [%]", "tier"], rows))
    rows = [[s.group, s.value, str(s.n), f"{s.mape_pct:.1f}", f"{s.median_abs_pct:.1f}", f"{s.p90_abs_pct:.1f}",
             _pct(s.bias_pct)] for s in report.summaries]
    tables.append(("Error summary (error = (predicted - measured) / measured)",
                   ["group", "value", "n [runs]", "MAPE [%]", "median |err| [%]", "p90 |err| [%]", "bias [%]"],
                   rows))
    tables.append(mfu_table(pred))
    skipped = report.skipped
    tables.append((f"Skipped runs ({len(skipped)})", ["id", "model", "reason"],
                   [[r.id, r.model, r.skip_reason] for r in skipped]))
    notes = [[r.id, "; ".join(r.assumptions) or "-", "; ".join(r.warnings) or "-"]
             for r in report.rows if r.assumptions or r.warnings]
    tables.append((f"Assumptions and warnings per run ({len(notes)})", ["id", "assumptions", "warnings"], notes))
    return tables


def mfu_table(pred: list) -> tuple[str, list[str], list[list[str]]]:
    """Measured and predicted MFU per source, GPU and dtype (RowResult.measured_mfu: planner's convention, so runs of
    different GPUs and counters compare on one basis)."""
    groups: dict[tuple[str, str, str], list] = {}
    for r in pred:
        if r.measured_mfu is not None:
            groups.setdefault((r.source, r.gpu, r.dtype), []).append(r)
    rows = []
    for (source, gpu, dtype), members in groups.items():
        meas = sorted(100 * r.measured_mfu for r in members)
        rows.append([source, gpu, dtype, str(len(members)), f"{meas[0]:.1f}", f"{statistics.median(meas):.1f}",
                     f"{meas[-1]:.1f}", f"{statistics.median(100 * r.predicted_mfu for r in members):.1f}"])
    return ("Measured MFU per source, GPU and dtype (model FLOPs of costmodel.schedule.flops over the dense bf16 "
            "peak; the measured value converted to time by the row's metric)",
            ["source", "GPU", "dtype", "n [runs]", "measured min [%]", "measured median [%]", "measured max [%]",
             "predicted median [%]"], rows)


RUN_COLUMNS = ("id", "source", "model", "GPU", "GPUs", "TP", "PP", "DP", "CP", "VP", "MBS [seq]", "GBS [seq]",
               "kind", "metric", "unit", "measured [unit]", "predicted [unit]", "error [%]", "dtype",
               "measured MFU [%]", "predicted MFU [%]", "tier", "skip reason")
"""CSV columns of `planner validate --format csv`: one row per run, numbers unformatted."""


def run_rows(report: ValidationReport) -> list[dict]:
    """Every run (predicted and skipped) as a row of :data:`RUN_COLUMNS`."""
    out = []
    for r in report.rows:
        lay = r.layout or {}
        err = None if r.error is None else round(100 * r.error, 3)
        mfu = [None if v is None else round(100 * v, 3) for v in (r.measured_mfu, r.predicted_mfu)]
        out.append(dict(zip(RUN_COLUMNS, (
            r.id, r.source, r.model, r.gpu, r.n_gpus,
            *(lay.get(k) for k in ("tp", "pp", "dp", "cp", "vp", "mbs", "gbs")),
            r.kind, r.metric, METRIC_UNITS.get(r.metric, ""), r.measured, r.predicted, err, r.dtype, *mfu, r.tier,
            r.skip_reason))))
    return out


def headline(report: ValidationReport) -> str:
    """One line: runs predicted and skipped, MAPE, median and p90 |error|, bias, runs within 10 % and 20 %."""
    overall = report.overall()
    if overall is None:
        return f"No run could be predicted ({len(report.skipped)} skipped); see the skipped runs."
    pred = report.predicted
    within10 = sum(1 for r in pred if abs(r.error) <= 0.10)
    within20 = sum(1 for r in pred if abs(r.error) <= 0.20)
    return (f"{overall.n} runs predicted, {len(report.skipped)} skipped: MAPE {overall.mape_pct:.1f} %, "
            f"median |error| {overall.median_abs_pct:.1f} %, p90 {overall.p90_abs_pct:.1f} %, bias "
            f"{overall.bias_pct:+.1f} %; {within10} within ±10 %, {within20} within ±20 %.")


def render_markdown(report: ValidationReport) -> str:
    """The report's tables as Markdown (``planner validate --format md`` and the report body)."""
    out = []
    for title, headers, rows in report_tables(report):
        out += [f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        out.append("")
    if report.excluded_by_tier:
        out.append(f"{report.excluded_by_tier} runs left out by the tier filter.")
    return "\n".join(out) + "\n"


def _shown(f: str | os.PathLike) -> str:
    """A run file as the report names it: relative to the working folder when given absolute."""
    p = Path(f)
    if p.is_absolute():
        try:
            p = Path(os.path.relpath(p))
        except ValueError:  # another drive (Windows)
            pass
    return p.as_posix()


def render_cv_preface(report: ValidationReport) -> list[str]:
    """Lines that say what the headline figures of a --cv source report are, and the coverage per source."""
    if getattr(report, "cv", None) != "source":  # planner.source_cv.CVReport
        return []
    o = report.overall()
    lines = ["Cross-validated (leave-one-source-out): each source is predicted with constants ("
             + ", ".join(report.constants) + ") fitted on the other sources only; the summaries below are "
             "these held-out errors. Interval = 80 % interval from the other sources' held-out residuals."]
    if o is not None:
        cov = "-" if o.interval_coverage is None else f"{100 * o.interval_coverage:.0f} %"
        lines.append(f"cross-validated: {o.n} runs, MAPE {o.mape_pct:.1f} %, bias {o.bias_pct:+.1f} %, "
                     f"80 % interval coverage {cov}")
    for label, st in (("in-sample (constants fitted on all runs, optimistic)", report.in_sample),
                      ("uncalibrated", report.uncalibrated)):
        if st and st.get("mape_pct") is not None:
            lines.append(f"{label}: MAPE {st['mape_pct']:.1f} %, bias {st['bias_pct']:+.1f} %")
    per_source = [s for s in report.summaries if s.group == "source"]
    if per_source:
        lines.append("per source (cross-validated): " + "; ".join(
            f"{s.value} n={s.n} MAPE {s.mape_pct:.1f} % bias {s.bias_pct:+.1f} % coverage "
            + ("-" if s.interval_coverage is None else f"{100 * s.interval_coverage:.0f} %") for s in per_source))
    return lines


@dataclass
class ReportSection:
    """A run file validated on its own and appended to the report under its own heading (e.g. the MoE runs,
    whose sources are cross-validated among themselves and do not move the published dense runs' figures)."""

    title: str
    """Section heading."""
    key: str
    """Suffix of the section's scatter PNG (``NAME_KEY_scatter.png``)."""
    report: ValidationReport
    """The section's validation."""
    run_files: Sequence[str | os.PathLike]
    """Run files the section validates."""
    intro: list[str] = field(default_factory=list)
    """Paragraphs before its figures (what it validates and how)."""
    extra: list[str] = field(default_factory=list)
    """Further labelled figure lines (e.g. the shipped calibration's), listed under the cross-validated ones."""


def _section_text(md: Path, sec: ReportSection, validation_png) -> tuple[list[str], list[tuple[Path, bytes]]]:
    rep, parts, images = sec.report, [f"## {sec.title}", ""], []
    parts += [line for p in sec.intro for line in (p, "")]
    parts += ["Run files: " + ", ".join(f"`{_shown(f)}`" for f in sec.run_files) + ".", "", headline(rep), ""]
    preface = render_cv_preface(rep)
    if preface:
        parts += [preface[0], ""] + [f"- {line}" for line in preface[1:]]
    parts += [f"- {line}" for line in sec.extra] + ([""] if preface or sec.extra else [])
    pred = rep.predicted
    if pred:
        png = validation_png([(r.source, r.metric, r.measured, r.predicted) for r in pred],
                             f"{sec.title}: predicted vs measured ({len(pred)} runs; bands ±10 %, ±20 %)")
        path = sibling(md, f"{sec.key}_scatter")
        images.append((path, png))
        parts += [image_link(f"{sec.title}: predicted vs measured, log-log", path, md), ""]
    return parts + [render_markdown(rep)], images


def validation_report_text(md: Path, report: ValidationReport, run_files: Sequence[str | os.PathLike],
                           *, command: str | None = None, cost_model: str | None = None,
                           sections: Sequence[ReportSection] = ()) -> tuple[str, list[tuple[Path, bytes]]]:
    """(Markdown, [(png path, png bytes)]) of a validation report (and its ``sections`` after it); nothing is
    written."""
    from planner.reports.plots import validation_png  # deferred: matplotlib, only when a report is written

    pred = report.predicted
    extra = ["", "Run files: " + ", ".join(f"`{_shown(f)}`" for f in run_files) + "; error = "
             "(predicted - measured) / measured, in the metric each run was published in."]
    parts = [header("Validation: predicted vs measured training runs", command or command_line(),
                    [cost_model or _cost_model_name()], extra)]
    parts += [headline(report), ""]
    preface = render_cv_preface(report)  # held-out figures: say so before any number is read
    if preface:
        parts += [preface[0], ""] + [f"- {line}" for line in preface[1:]] + [""]
    images = []
    if pred:
        png = validation_png([(r.source, r.metric, r.measured, r.predicted) for r in pred],
                             f"Predicted vs measured ({len(pred)} runs; bands ±10 %, ±20 %)")
        path = sibling(md, "scatter")
        images.append((path, png))
        parts += [image_link("Predicted vs measured, log-log", path, md), ""]
    parts += [render_markdown(report)]
    for sec in sections:
        more, pngs = _section_text(md, sec, validation_png)
        parts += more
        images += pngs
    return "\n".join(parts).rstrip("\n") + "\n", images


def write_validation_report(path: str | os.PathLike, report: ValidationReport, run_files: Sequence[str | os.PathLike],
                            *, command: str | None = None, cost_model: str | None = None,
                            sections: Sequence[ReportSection] = ()) -> ReportFiles:
    """Write the report to ``path`` (.md) and its scatter PNGs beside it, each atomically, the PNGs first."""
    md = report_path(path)
    text, images = validation_report_text(md, report, run_files, command=command, cost_model=cost_model,
                                          sections=sections)
    for p, data in images:
        atomic_write_bytes(p, data)
    atomic_write_text(md, text)
    return ReportFiles(md, [p for p, _ in images])


def build_and_write(path: str | os.PathLike, runs: Sequence[Path] | None, tiers: Sequence[str] | None,
                    *, command: str | None = None, predict_fn: Callable | None = None,
                    sections: Sequence[ReportSection] = ()) -> tuple[ReportFiles, ValidationReport]:
    """Load the run files (default: shared/validation/published_runs.csv), predict (with ``predict_fn``,
    e.g. a calibrated predict, when given), write the report. Tier handling and errors are those of
    `planner validate` (:func:`planner.validation.report.validate_files`)."""
    md = report_path(path)
    files, report = validate_files(runs, tiers, predict_fn)
    return write_validation_report(md, report, files, command=command, sections=sections), report
