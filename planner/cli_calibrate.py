"""`planner calibrate`: fit composition constants of one cluster to its measured runs, saved as JSON."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from costmodel.core.errors import PlannerError
from planner.calibrate import CONSTANTS, USER_DIR, calibrate_files, calibration_dir
from planner.cli_options import ModelsDir, Wide
from planner.formats import csv_text, md_rows
from planner.tables import console as table_console
from planner.tables import print_table

FORMATS = ("table", "json", "csv", "md")

CONSTANT_COLUMNS = ("constant", "value", "unit", "sigma (1 sd)", "uncalibrated", "meaning")
"""CSV / Markdown columns of the fitted constants (a constant's unit in its own column: they differ)."""


def _fmt(v: float | None, pct: bool = False) -> str:
    """'-' for None; signed one-decimal percent when ``pct``; else 4 significant digits."""
    if v is None:
        return "-"
    return f"{v:+.1f}" if pct else f"{v:.4g}"


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def constant_rows(cal) -> list[dict]:
    """One row per fitted constant (numbers unformatted)."""
    return [dict(zip(CONSTANT_COLUMNS, (name, value, CONSTANTS[name].unit, cal.uncertainty.get(name),
                                        CONSTANTS[name].default, CONSTANTS[name].doc)))
            for name, value in cal.constants.items()]


def error_rows(cal) -> list[dict]:
    """Held-out and in-sample error before and after calibration, [%]."""
    cv = cal.cv
    out = []
    for label, before, after in (
            (f"held-out ({cv['scheme']}, {cv['folds'] - cv['folds_skipped']} folds)", cv["held_out_before"],
             cv["held_out_after"]),
            ("in-sample (all fitted runs)", cal.in_sample["before"], cal.in_sample["after"])):
        out.append({"runs": label, "n": after["n"], "MAPE before [%]": before["mape_pct"],
                    "MAPE after [%]": after["mape_pct"], "median |err| before [%]": before["median_abs_pct"],
                    "median |err| after [%]": after["median_abs_pct"], "bias before [%]": before["bias_pct"],
                    "bias after [%]": after["bias_pct"]})
    return out


def render_table(cal, path: Path | None) -> str:
    """Plain-text report: constants with uncertainty, before/after error (held-out and in-sample)."""
    buf = io.StringIO()
    con = table_console(file=buf, no_color=True, force_terminal=False)
    n_runs = sum(len(f["run_ids"]) for f in cal.fitted_on)
    con.print(f"calibration {cal.name!r}: {n_runs} runs, cost model {cal.cost_model}, planner {cal.planner_version}")
    t = Table(title="Fitted constants", title_justify="left")
    for col in ("constant", "value", "+- 1 sigma", "uncalibrated", "meaning"):
        t.add_column(escape(col))
    for name, value in cal.constants.items():
        spec = CONSTANTS[name]
        unit = f" {spec.unit}" if spec.unit else ""
        t.add_row(name, f"{value:.4g}{unit}", _fmt(cal.uncertainty.get(name)), f"{spec.default:g}", spec.doc)
    print_table(con, t, ("uncalibrated", "+- 1 sigma"))
    e = Table(title="Error vs measured, (predicted - measured) / measured", title_justify="left")
    for col in ("runs", "n", "MAPE [%] before -> after", "median |err| [%] before -> after",
                "bias [%] before -> after"):
        e.add_column(escape(col))
    cv = cal.cv
    for label, before, after in (
            (f"held-out ({cv['scheme']}, {cv['folds'] - cv['folds_skipped']} folds)", cv["held_out_before"],
             cv["held_out_after"]),
            ("in-sample (all fitted runs)", cal.in_sample["before"], cal.in_sample["after"])):
        e.add_row(escape(label), str(after["n"]), f"{_pc(before['mape_pct'])} -> {_pc(after['mape_pct'])}",
                  f"{_pc(before['median_abs_pct'])} -> {_pc(after['median_abs_pct'])}",
                  f"{_fmt(before['bias_pct'], True)} -> {_fmt(after['bias_pct'], True)}")
    print_table(con, e)
    for w in cal.warnings:
        con.print(f"warning: {escape(w)}")
    if path is not None:
        con.print(f"wrote {path}  (use: planner predict/validate --calibration {_ref(cal.name, path)})")
    return buf.getvalue()


def _ref(name: str, path: Path) -> str:
    """What --calibration takes for a calibration saved at ``path``: its name in the user's directory, else the
    path."""
    return name if Path(path).parent.resolve() == calibration_dir().resolve() else str(path)


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        runs: Annotated[list[Path], typer.Option(
            "--runs", help="Measured run CSV(s) in the published_runs.csv schema (repeatable).")],
        name: Annotated[str, typer.Option("--name", help="Name of the calibration (file <out>/<name>.json).")],
        constants: Annotated[str | None, typer.Option(
            "--constants", help="Comma-separated constants to fit (default all): compute_scale, comm_scale, "
                                "overlap_efficiency, iteration_overhead_s, compute_scale_torch, and the GPU-scoped "
                                "compute_scale_gh200, compute_scale_blackwell (moved only by runs on those GPUs; the "
                                "Blackwell one by dense runs only), compute_scale_moe (by MoE runs).")
    ] = None,
        out: Annotated[Optional[Path], typer.Option(
            "--out", help="Directory to write the calibration to (default: $XDG_CONFIG_HOME/planner/calibrations, "
                          "~/.config/planner/calibrations, where --calibration NAME finds it).")] = None,
        cv: Annotated[str, typer.Option("--cv", help="Cross-validation: kfold, model (leave one model out), "
                                                     "kind (leave one parallelism kind out) or source (leave one "
                                                     "source, the run id prefix, out; also fits the 80 % interval "
                                                     "table).")] = "kfold",
        folds: Annotated[int, typer.Option("--folds", help="Folds for --cv kfold.")] = 5,
        seed: Annotated[int, typer.Option("--seed", help="Shuffle seed for --cv kfold.")] = 0,
        tier: Annotated[list[str] | None, typer.Option(
            "--tier", help="Keep only runs of these tiers (repeatable); default all runs.")] = None,
        fmt: Annotated[str, typer.Option(
            "--format", help="table | json | csv (the constants) | md (constants and errors).")] = "table",
        models: ModelsDir = None,
        wide: Wide = False,
    ) -> None:
        """Fit a few composition constants (compute/comm scale, overlap, overhead) to your measured runs."""

        if fmt not in FORMATS:
            raise PlannerError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}.")
        if folds < 2:
            raise PlannerError(f"--folds {folds} is too small: use 2 or more.")
        cal, path = calibrate_files(runs, name, constants, out_dir=USER_DIR if out is None else out, cv=cv,
                                    folds=folds, seed=seed, tiers=tier)
        if fmt == "csv":  # the table and md outputs name the file, the JSON has "path"
            typer.echo(f"wrote {path}  (use: --calibration {_ref(cal.name, path)})", err=True)
        if fmt == "json":
            typer.echo(json.dumps({**cal.to_dict(), "path": str(path)}, indent=2))
        elif fmt == "csv":
            typer.echo(csv_text(constant_rows(cal), CONSTANT_COLUMNS), nl=False)
        elif fmt == "md":
            typer.echo(f"### Fitted constants ({cal.name}, written to {path})\n\n" + md_rows(constant_rows(cal))
                       + "\n### Error vs measured, (predicted - measured) / measured\n\n" + md_rows(error_rows(cal)),
                       nl=False)
        else:
            typer.echo(render_table(cal, path), nl=False)
