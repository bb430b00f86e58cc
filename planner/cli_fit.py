"""`planner fit` (fit per-operator regressors, write artifacts) and `planner costmodel report`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import FEATURES
from costmodel.core.paths import require_data_dir
from costmodel.cost.regressors.artifacts import SHIPPED_MODELS_DIR
from planner.cli_options import write_or_print
from planner.formats import FORMATS, csv_text
from planner.models_dir import fit_output_dir


def run_fit(data_dir: Path | None, profiles: list[Path] | None, out: Path | None, gpus: list[str] | None,
            kinds: str | None, quick: bool, no_public: bool, max_rows: int | None, jobs: int) -> dict:
    from costmodel.fitting import fit as F  # deferred: the fitting stack (xgboost, sklearn) takes seconds to import

    kind_list = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else None
    bad = [k for k in kind_list or [] if k not in FEATURES]
    if bad:
        raise PlannerError(f"unknown --kinds {bad[0]!r}; choose among {', '.join(FEATURES)}")
    datasets: dict = {}
    if not no_public:
        from costmodel.fitting.datasets.importers import import_all  # deferred: the importers load only when fitting

        datasets.update(import_all(Path(data_dir) if data_dir else require_data_dir()))
    if profiles:
        for p in profiles:
            if not Path(p).is_dir():
                raise PlannerError(f"--profile {p} is not a folder; pass the output folder of `planner profile`")
        user = F.dataset_dirs_to_datasets(profiles)
        if not user:
            raise PlannerError(f"no datasets (*.csv + .json sidecar) found under {', '.join(map(str, profiles))}")
        for key, ds in user.items():
            datasets[key] = F._concat(datasets[key], ds) if key in datasets else ds
    if not datasets:
        raise PlannerError("nothing to fit: give --data-dir (public data) and/or --profile DIR")
    if gpus:
        missing = [g for g in gpus if g not in {k[1] for k in datasets}]
        if missing:
            raise PlannerError(f"no measured data for --gpu {missing[0]}; GPUs with data: "
                               f"{', '.join(sorted({k[1] for k in datasets}))}")
    out = fit_output_dir(out)  # the user's folder, never the installed package's (planner.models_dir)
    # deferred: the sampling readers load only when fitting
    from costmodel.profiling.sampling.corun import load as load_corun
    from costmodel.profiling.sampling.skew import load as load_skew

    typer.echo(f"writing fitted models to {out}")
    result = F.fit_all(datasets, out, gpus=set(gpus) if gpus else None, kinds=set(kind_list) if kind_list else None,
                       quick=quick, max_rows=max_rows or F.MAX_ROWS, n_jobs=jobs, log=typer.echo,
                       sync_skew=load_skew(profiles), corun=load_corun(profiles))
    typer.echo(f"models in {out}; predict with them: --models {out} (or PLANNER_MODELS_DIR={out}); "
               "GPUs they do not cover keep the shipped models")
    return result


REPORT_COLUMNS = {"gpu": "GPU", "kind": "kind", "direction": "direction", "samples": "samples",
                  "available": "available", "model": "model", "target": "target", "cv_mape": "CV MAPE [fraction]",
                  "median_ape": "median APE [fraction]", "p90_ape": "p90 APE [fraction]",
                  "ranges": "training ranges", "mape_target": "MAPE goal [fraction]", "met": "goal met",
                  "why": "why not met"}
"""CSV columns of `planner costmodel report --format csv` (costmodel.fitting.fit.report_rows keys -> header)."""


def report_csv(models_dir: Path) -> str:
    """One row per (GPU, operator kind, direction) of the fitted models."""
    from costmodel.fitting.fit import report_rows  # deferred: the fitting stack (xgboost, sklearn) is slow to import

    rows = [{REPORT_COLUMNS[k]: ("; ".join(f"{n} {lo:g}..{hi:g}" for n, (lo, hi) in v.items()) if k == "ranges" else v)
             for k, v in r.items() if k in REPORT_COLUMNS} for r in report_rows(models_dir)]
    return csv_text(rows, list(REPORT_COLUMNS.values()))


def register(app: typer.Typer) -> None:
    @app.command("fit")
    def fit_cmd(
        data_dir: Annotated[Path | None, typer.Option(
            "--data-dir", help="shared/data folder (default: costmodel.core.paths).")] = None,
        profile: Annotated[list[Path] | None, typer.Option(
            "--profile", help="Dataset folder(s) written by `planner profile` (repeatable).")] = None,
        out: Annotated[Path | None, typer.Option(
            "--out", help="Models folder (default: $XDG_CACHE_HOME/planner/models or ~/.cache/planner/models; "
                          "never the installed package's).")] = None,
        gpu: Annotated[list[str] | None, typer.Option(
            "--gpu", help="Only these GPUs (repeatable), e.g. h100-sxm or cpu.")] = None,
        kinds: Annotated[str | None, typer.Option(
            "--kinds", help="Comma-separated operator kinds, e.g. gemm,attention_fwd.")] = None,
        quick: Annotated[bool, typer.Option("--quick", help="One candidate per family, for a fast smoke fit.")] = False,
        no_public: Annotated[bool, typer.Option(
            "--no-public", help="Fit only --profile datasets (skip shared/data).")] = False,
        max_rows: Annotated[int | None, typer.Option("--max-rows", help="Seeded subsample cap per regressor.")] = None,
        jobs: Annotated[int, typer.Option("--jobs", help="xgboost threads.")] = 2,
    ) -> None:
        """Fit one regressor per (GPU, operator kind, direction) and write xgboost JSON artifacts."""
        t0 = time.perf_counter()
        run_fit(data_dir, profile, out, gpu, kinds, quick, no_public, max_rows, jobs)
        typer.echo(f"fit done in {time.perf_counter() - t0:.0f} s")

    cm = typer.Typer(help="Inspect the measured operator cost models.", no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(cm, name="costmodel")

    @cm.command("report")
    def report_cmd(
        models: Annotated[Path | None, typer.Option("--models", help="Models folder (default: shipped).")] = None,
        fmt: Annotated[str, typer.Option("--format", help="table | json | csv | md.")] = "table",
        out: Annotated[Path | None, typer.Option("--out", help="Write the report to this file.")] = None,
    ) -> None:
        """Per (GPU, operator): samples, grouped-CV MAPE, median and p90 error, ranges, winning model."""
        # deferred: the fitting stack (xgboost, sklearn) is slow to import
        from costmodel.fitting.fit import render_report

        if fmt not in FORMATS:
            raise PlannerError(f"unknown --format {fmt!r}: use {', '.join(FORMATS)}")
        text = report_csv(models or SHIPPED_MODELS_DIR) if fmt == "csv" else render_report(models or SHIPPED_MODELS_DIR,
                                                                                            fmt)
        write_or_print(text, out)
