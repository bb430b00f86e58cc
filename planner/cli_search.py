"""`planner search`, `planner explain`, `planner compare`, `planner size`: flags in, the Python API's
(planner.search.api, planner.api) results printed."""

from __future__ import annotations

import inspect
import json
import shlex
import sys
from typing import Optional

import typer
from rich.markup import escape

from costmodel.core.errors import Interrupted, PlannerError
from planner import cli_options as O
from planner.api import explain as explain_request
from planner.calibrate import calibration_option
from planner.formats import FORMATS
from planner.reports.markdown import report_path
from planner.reports.results import compare_table, emit_records, explain_out, size_out
from planner.search.api import RankedPlans, SearchRequest, run_search
from planner.search.api import compare as compare_gpus
from planner.search.api import size as size_allocation
from planner.search.explain import explain_plan
from planner.search.records import rank
from planner.tables import console


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)
    app.command("explain")(explain_command)
    app.command("compare")(compare_command)
    app.command("size")(size_command)


@O.spec_file
def search_command(
    model: O.Model,
    gpu: O.SearchGpuList = [],
    gpus: O.AllocGpus = None,
    nodes: O.Nodes = None,
    nodes_range: O.NodesRange = None,
    cluster: O.Cluster = None,
    gpus_per_node: O.GpusPerNode = None,
    space: O.Space = "default",
    tp: O.TpChoices = None,
    pp: O.PpChoices = None,
    cp: O.CpChoices = None, ep: O.EpChoices = None, etp: O.EtpChoices = None,
    vpp: O.VppChoices = None,
    mbs: O.MbsChoices = None,
    recompute: O.RecomputeChoices = None,
    zero: O.ZeroChoices = None,
    sp: O.SpChoices = None,
    dtype: O.DtypeChoices = None, framework: O.FrameworkChoices = None,
    allow_tp_across_nodes: O.AllowTpAcrossNodes = False,
    headroom: O.Headroom = None,
    main_grads_dtype: O.MainGradsDtype = "", main_params_dtype: O.MainParamsDtype = "fp32",
    exp_avg_dtype: O.ExpAvgDtype = "fp32", exp_avg_sq_dtype: O.ExpAvgSqDtype = "fp32",
    fp8_param_gather: O.Fp8ParamGather = False, optimizer_offload_fraction: O.OptimizerOffloadFraction = 0.0,
    offload_modules: O.OffloadModules = None, reshard_after_forward: O.ReshardAfterForward = None,
    gbs: O.Gbs = None,
    tokens_per_batch: O.TokensPerBatchRange = None,
    seq_len: O.SeqLen = None,
    tokens: O.TokenBudget = None,
    price: O.Price = [],
    objective: str = typer.Option("time", "--objective", help="time | cost | pareto (time and $/Mtoken)."),
    trials: int = typer.Option(200, "--trials", help="Optuna trials to run (added to a resumed study)."),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="Same as --mode exhaustive."),
    mode: str = typer.Option(
        "auto", "--mode", help="auto (every valid plan when the space is small enough, else Optuna) | "
        "exhaustive | optuna."),
    jobs: int = typer.Option(0, "--jobs", help="Processes for --exhaustive (0 = one per CPU core, at most 4)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed (reproducible runs)."),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe | nsga2 | random."),
    storage: Optional[str] = typer.Option(
        None, "--storage", help="Optuna storage: sqlite:///F.db, journal:FILE, RDB URL."),
    study_name: Optional[str] = typer.Option(
        None, "--study-name", help="Study to create or resume (default storage sqlite:///planner.db)."),
    resume: bool = typer.Option(
        False, "--resume",
        help="Finish the study's interrupted run (its remaining trials, same seed) instead of adding --trials."),
    top: int = typer.Option(10, "--top", "-k", help="Plans to print."),
    fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
    explain: Optional[int] = typer.Option(None, "--explain", help="Also explain the plan ranked N."),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", help="Progress bar on stderr (terminals only)."),
    hardware_file: O.HardwareFile = [], wide: O.Wide = False,
    report: O.Report = None, models: O.ModelsDir = None,
) -> None:
    """Search parallel layouts (every valid plan when the space is small enough, else Optuna) and print the
    ranked plans."""
    if fmt not in FORMATS:
        raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        _check_report(report)
        ranked = run_search(SearchRequest.from_flags(locals()))
        _print_search(ranked, fmt)
        if explain is not None:
            _explain_rank(ranked, explain, fmt)
        if report is not None:
            # deferred: the report writer loads matplotlib
            from planner.reports.search_report import write_search_report

            _write_report(lambda: write_search_report(report, ranked.result, top=top))
    except PlannerError as exc:
        raise _err(str(exc)) from None
    except Interrupted as exc:  # a study keeps the trials that finished: say how to finish it
        raise (Interrupted(f"resume with {_resume_command()}", True) if exc.resumable else exc) from None


def _print_search(ranked: RankedPlans, fmt: str) -> None:
    """The ranked plans in ``fmt``; a table ends with how the search went (:func:`search_footer`)."""
    result, problem = ranked.result, ranked.result.problem
    recs = ranked.plans
    title = (f"{problem.model.name}: top {len(recs)} of {len(result.records)} distinct feasible plans "
             f"({problem.batch_text()}, seq {problem.seq_len}, "
             f"{result.method}, objective {result.objective})")
    emit_records(recs, fmt, problem.model, {"model": ranked.model, "search": ranked.search}, title)
    if fmt != "table":
        return
    con = console()
    for line in search_footer(ranked):
        con.print(escape(line))


def search_footer(ranked: RankedPlans) -> list[str]:
    """How the search went: what ran and why, then one count line whose numbers add up (space = evaluated +
    ruled out; evaluated = feasible + out of memory + invalid; feasible = distinct + folded; shown <= distinct),
    the notes, and the folded equivalents."""
    result, s, recs = ranked.result, ranked.search, ranked.plans
    exhaustive = result.method == "exhaustive"
    skipped = s["space_size"] - s["evaluated"]
    lines = [f"search: {result.method} ({result.mode_note}); {s['elapsed_s']:.2f} s"
             + (f"; study {result.study_name!r} has {result.study_trials} trials" if result.study_name else ""),
             f"plans: {s['space_size']:,} combinations in the space; {s['evaluated']:,} evaluated"
             + (f" by {result.study_trials or result.trials:,} trials" if not exhaustive else "")
             + (f" ({skipped:,} ruled out before costing: degrees that do not divide the GPUs or the model, or "
                "duplicates)" if exhaustive else f" ({skipped:,} not visited)")
             + f" = {s['feasible']:,} feasible + {s['out_of_memory']:,} out of memory + {s['invalid']:,} invalid; "
             f"{s['feasible']:,} feasible = {len(result.records):,} distinct + {result.collapsed:,} folded as "
             f"equivalent; {len(recs):,} shown"]
    lines += [f"note: {note}" for note in ranked.notes]
    same = [f"#{r.rank} = {', '.join(r.equivalent)}" for r in recs if r.equivalent]
    if same:
        lines.append("equivalent plans folded into one row (same predicted time and cost, memory within 0.1 GiB; the "
                     f"row keeps the least memory): {'; '.join(same)}")
    return lines


def _explain_rank(ranked: RankedPlans, rank: int, fmt: str) -> None:
    """`search --explain N`: the plan ranked N explained, with the calibration the search predicted it with."""
    records, problem = ranked.result.records, ranked.result.problem
    if not 1 <= rank <= len(records):
        raise PlannerError(f"--explain {rank} is not a rank between 1 and {len(records)}.")
    rec = records[rank - 1]
    hw = next(t.hardware for t in problem.targets if t.hardware.gpu.name == rec.gpu and t.gpus == rec.gpus)
    explain_out(explain_plan(problem.model, rec.to_plan(), hw, calibration=problem.calibration),
                "json" if fmt == "json" else "table")


@O.plan_options
def explain_command(
    plan: dict,
    fmt: str = typer.Option("table", "--format", help="table | json | csv | md (csv, md: every operator)."),
    top: int = typer.Option(15, "--top", help="Operators per table."),
    hardware_file: O.HardwareFile = [], wide: O.Wide = False,
    models: O.ModelsDir = None,
    calibration: O.CalibrationRef = None,
) -> None:
    """Operator breakdown of one plan by pipeline stage and phase.

    The prediction is `planner predict`'s with the same flags (the same calibration, the same iteration time)."""
    if fmt not in FORMATS:
        raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        calibration_option(calibration)  # a bad --calibration is refused before the plan is looked at
        O.plan_request(plan, "planner explain --model llama-13b --gpu a100-80gb --gpus 128 --tp 2 --pp 4")
        explain_out(explain_request(**plan, hardware_file=hardware_file, calibration=calibration), fmt, top)
    except PlannerError as exc:
        raise _err(str(exc)) from None


@O.spec_file
def compare_command(
    model: O.Model,
    gpu: O.CompareGpuList = [],
    cluster: O.NodeTypeList = [],
    gpus: O.AllocGpus = None,
    nodes: O.Nodes = None,
    tokens: O.TokenBudget = None,
    price: O.Price = [],
    space: O.Space = "default",
    gbs: O.Gbs = None,
    tokens_per_batch: O.TokensPerBatchRange = None,
    seq_len: O.SeqLen = None,
    goodput: O.Goodput = True, failure_rate: O.FailureRate = None,
    planned_interruptions: O.PlannedInterruptions = None, restart_min: O.RestartMin = None,
    ckpt_mode: O.CkptMode = None, ckpt_bandwidth: O.CkptBandwidth = None, ckpt_interval: O.CkptInterval = None,
    slowdown: O.Slowdown = None,
    main_grads_dtype: O.MainGradsDtype = "", main_params_dtype: O.MainParamsDtype = "fp32",
    exp_avg_dtype: O.ExpAvgDtype = "fp32", exp_avg_sq_dtype: O.ExpAvgSqDtype = "fp32",
    fp8_param_gather: O.Fp8ParamGather = False, optimizer_offload_fraction: O.OptimizerOffloadFraction = 0.0,
    offload_modules: O.OffloadModules = None, reshard_after_forward: O.ReshardAfterForward = None,
    fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
    hardware_file: O.HardwareFile = [], wide: O.Wide = False,
    report: O.Report = None,
) -> None:
    """Best plan per GPU type: time/iteration, tokens/s, $ per Mtoken, time and cost to train (expected, with
    the goodput of each allocation)."""
    if fmt not in FORMATS:
        raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        _check_report(report)
        res = compare_gpus(**_api_flags(locals(), compare_gpus))
    except PlannerError as exc:
        raise _err(str(exc)) from None
    m = res.spec
    if fmt == "json":
        typer.echo(json.dumps(res.to_dict(), indent=2))
    elif fmt in ("csv", "md"):
        emit_records(rank(res.best, "time", None), fmt, m, {}, "")
    else:
        compare_table(m, res.rows, res.tokens)
    if report is not None and res.best:
        # deferred: the report writer loads matplotlib
        from planner.reports.search_report import write_compare_report

        _write_report(lambda: write_compare_report(report, res.rows, m, tokens=res.tokens))
    if res.interrupted:
        typer.echo(f"interrupted: {len(res.rows)} of {res.types_asked} GPU types compared before Ctrl-C", err=True)
        raise typer.Exit(code=130)
    if not res.best:
        raise _err(res.rows[0].message)


@O.spec_file
def size_command(
    model: O.Model,
    tokens: O.TokenBudget,
    deadline: str = typer.Option(..., "--deadline", help="Wall-clock limit: 72h, 30d, 3w."),
    gpu: O.SizeGpuList = [],
    cluster: O.NodeTypeList = [],
    min_gpus: O.MinGpus = 1,
    max_gpus: O.MaxGpus = 16384,
    budget: Optional[float] = typer.Option(None, "--budget", help="Largest cost in USD."),
    price: O.Price = [],
    space: O.Space = "default",
    gbs: O.Gbs = None,
    tokens_per_batch: O.TokensPerBatchRange = None,
    seq_len: O.SeqLen = None,
    goodput: O.Goodput = True, failure_rate: O.FailureRate = None,
    planned_interruptions: O.PlannedInterruptions = None, restart_min: O.RestartMin = None,
    ckpt_mode: O.CkptMode = None, ckpt_bandwidth: O.CkptBandwidth = None, ckpt_interval: O.CkptInterval = None,
    slowdown: O.Slowdown = None,
    main_grads_dtype: O.MainGradsDtype = "", main_params_dtype: O.MainParamsDtype = "fp32",
    exp_avg_dtype: O.ExpAvgDtype = "fp32", exp_avg_sq_dtype: O.ExpAvgSqDtype = "fp32",
    fp8_param_gather: O.Fp8ParamGather = False, optimizer_offload_fraction: O.OptimizerOffloadFraction = 0.0,
    offload_modules: O.OffloadModules = None, reshard_after_forward: O.ReshardAfterForward = None,
    fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
    progress: O.ProgressBar = True,
    hardware_file: O.HardwareFile = [], wide: O.Wide = False,
    report: O.Report = None,
) -> None:
    """Smallest allocation (nodes of which GPU) that trains the tokens before the deadline, proved minimal; also
    the cheapest and the frontier (GPUs vs days vs USD). Times are expected values with failures, restarts and
    checkpoints (--no-goodput: a perfect run); the batch is chosen per plan from a range (--tokens-per-batch)."""
    if fmt not in FORMATS:
        raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        _check_report(report)
        res = size_allocation(**_api_flags(locals(), size_allocation))
    except PlannerError as exc:
        raise _err(str(exc)) from None
    size_out(res, fmt)
    if report is not None:
        # deferred: the report writer loads matplotlib
        from planner.reports.search_report import write_size_report

        _write_report(lambda: write_size_report(report, res.sizing, res.spec, res.tokens, res.deadline_s,
                                                res.hardwares, calibration=res.calibration))
    if res.sizing.interrupted:
        typer.echo("interrupted: the answer above is the best found before Ctrl-C, not proved minimal", err=True)
        raise typer.Exit(code=130)


def _api_flags(flags: dict, function) -> dict:
    """The command's flags (its ``locals()``) that ``function`` of the Python API takes, by name."""
    return {k: flags[k] for k in inspect.signature(function).parameters if k in flags}


def _resume_command() -> str:
    """This command line with --resume (what finishes an interrupted study)."""
    args = sys.argv[1:]
    return shlex.join(["planner", *args, *([] if "--resume" in args else ["--resume"])])


def _check_report(report: str | None) -> None:
    if report is not None:
        report_path(report)


def _write_report(write) -> None:
    """Run a report writer (returns planner.reports.ReportFiles); a PlannerError exits with code 2."""
    try:
        typer.echo(f"wrote {write().markdown}", err=True)
    except PlannerError as exc:
        raise _err(str(exc)) from None


