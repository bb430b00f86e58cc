"""`planner search`, `planner explain`, `planner compare`, `planner size`."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, fields, replace
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from costmodel.core.errors import Interrupted, PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from planner import cli_options as O
from planner.batch import parse_batch_range
from planner.calibrate import calibration_option
from planner.cli_options import DEFAULT_GPU, SIZE_DEFAULT_GPUS, etp_list
from planner.cli_options import bool_list as _bool_list
from planner.cli_options import int_list as _int_list
from planner.cli_options import str_list as _str_list
from planner.formats import FORMATS
from planner.reports.markdown import report_path
from planner.reports.results import compare_table, emit_records, explain_out, size_out
from planner.requests import PlanRequest


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """One `planner search` run: the model and per-plan settings, the allocation, the space, the optimiser."""

    model: str
    """Preset name or path to a config.json (as PlanRequest.model)."""
    gpu: tuple[str, ...] = ()
    """GPU keys to search (empty: DEFAULT_GPU, or the --cluster's GPU)."""
    gpus: int | None = None
    """Total GPUs of each GPU type (exactly one of gpus, nodes, nodes_range)."""
    nodes: int | None = None
    """Nodes of each GPU type."""
    nodes_range: str | None = None
    """Node counts to search: A:B doubling, A:B:STEP, or a list 4,8,16."""
    cluster: str | None = None
    """Node type (as PlanRequest.cluster)."""
    gpus_per_node: int | None = None
    """GPUs per node (as PlanRequest.gpus_per_node)."""
    space: str = "default"
    """Search-space preset (default, megatron, fsdp) or TOML file."""
    tp: str | None = None
    """TP degrees replacing the space's, e.g. "1,2,4,8"."""
    pp: str | None = None
    """PP degrees replacing the space's."""
    cp: str | None = None
    """CP degrees replacing the space's."""
    ep: str | None = None
    """EP degrees replacing the space's (MoE models), e.g. "1,8"."""
    etp: str | None = None
    """Expert TP choices replacing the space's (MoE models), e.g. "tp,1"."""
    vpp: str | None = None
    """Virtual pipeline chunks per stage replacing the space's."""
    mbs: str | None = None
    """Micro-batch sizes replacing the space's."""
    recompute: str | None = None
    """Recompute modes replacing the space's, e.g. "none,selective,full"."""
    zero: str | None = None
    """ZeRO stages replacing the space's, e.g. "1,3"."""
    sp: str | None = None
    """Sequence-parallelism values replacing the space's, e.g. "true,false"."""
    dtype: str | None = None
    """GEMM precisions replacing the space's, e.g. "bf16,fp8"."""
    framework: str | None = None
    """Training stacks replacing the space's, e.g. "megatron,fsdp" (compared on the same allocation)."""
    allow_tp_across_nodes: bool = False
    """Let TP groups span nodes."""
    headroom: float | None = None
    """HBM fraction kept free (None: the space's)."""
    gbs: int | None = None
    """Global batch size in sequences (as PlanRequest.gbs)."""
    tokens_per_batch: str | None = None
    """Global batch size in tokens, e.g. "4M" (as PlanRequest.tokens_per_batch; not with gbs)."""
    seq_len: int | None = None
    """Sequence length (as PlanRequest.seq_len)."""
    tokens: str | None = None
    """Training token budget, e.g. "1e12" or "2T" (for time and cost to train)."""
    price: tuple[str, ...] = ()
    """GPU=USD per GPU-hour overrides."""
    objective: str = "time"
    """time | cost | pareto."""
    trials: int = 200
    """Optuna trials to run (added to a resumed study)."""
    exhaustive: bool = False
    """Evaluate every valid plan instead of sampling (= mode exhaustive)."""
    mode: str = "auto"
    """auto (exhaustive when the space's valid plans fit the exhaustive budget, else Optuna) | exhaustive | optuna."""
    jobs: int = 0
    """Processes for exhaustive search (0 = one per CPU core, at most 4)."""
    seed: int | None = None
    """Sampler seed."""
    sampler: str = "tpe"
    """tpe | nsga2 | random."""
    storage: str | None = None
    """Optuna storage URL or journal file."""
    study_name: str | None = None
    """Optuna study to create or resume."""
    resume: bool = False
    """Finish the study's interrupted run instead of adding trials."""
    progress: bool = True
    """Show a progress bar on stderr (terminals only)."""
    top: int = 10
    """Plans printed."""
    hardware_file: tuple[str, ...] = ()
    """TOML/YAML files adding GPUs/clusters."""

    @classmethod
    def from_flags(cls, flags: dict) -> SearchRequest:
        """The request named by a command's parameters (e.g. its ``locals()``; other names are ignored)."""
        vals = {f.name: flags[f.name] for f in fields(cls) if f.name in flags}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in vals.items()})


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _space(r: SearchRequest):
    from planner.search.space import load_space  # deferred: the planner.search package loads only for search commands

    return load_space(r.space).override(
        tp=_int_list("--tp", r.tp), pp=_int_list("--pp", r.pp), cp=_int_list("--cp", r.cp),
        vpp=_int_list("--vpp", r.vpp), mbs=_int_list("--mbs", r.mbs), recompute=_str_list(r.recompute),
        zero=_int_list("--zero", r.zero), sequence_parallel=_bool_list(r.sp), dtype=_str_list(r.dtype),
        framework=_str_list(r.framework), ep=_int_list("--ep", r.ep), etp=etp_list(r.etp),
        allow_tp_across_nodes=True if r.allow_tp_across_nodes else None,
        memory_headroom=r.headroom)


def _hardwares(gpu, cluster: str | None, gpus_per_node: int | None, hardware_file):
    cat = load_catalogue(tuple(hardware_file))
    names = gpu or ([None] if cluster else [DEFAULT_GPU])
    return cat, [cat.resolve(g, cluster, gpus_per_node) for g in names]


def _node_range(text: str) -> list[int]:
    """'4:32' -> 4, 8, 16, 32 (doubling); '4:32:4' -> 4, 8, ..., 32 (step); '8,16,64' -> as listed."""
    try:
        if ":" in text:
            parts = [int(x) for x in text.split(":")]
            if len(parts) not in (2, 3) or parts[0] <= 0 or parts[1] < parts[0] or (len(parts) == 3 and parts[2] <= 0):
                raise ValueError
            if len(parts) == 3:
                return list(range(parts[0], parts[1] + 1, parts[2]))
            out, n = [], parts[0]
            while n <= parts[1]:
                out.append(n)
                n *= 2
            return out
        vals = [int(x) for x in text.split(",")]
        if not vals or min(vals) <= 0:
            raise ValueError
        return sorted(set(vals))
    except ValueError:
        raise PlannerError(f"--nodes-range {text!r} must be A:B (doubling), A:B:STEP or a list like 4,8,16.") from None


def _targets(hws, gpus: int | None, nodes: int | None, nodes_range: str | None):
    # deferred: the planner.search package (engine, samplers) loads only for search commands
    from planner.search.space import make_target

    given = [x is not None for x in (gpus, nodes, nodes_range)]
    if sum(given) == 0:
        raise PlannerError("pass the allocation: --gpus N, --nodes N or --nodes-range A:B.")
    if sum(given) > 1:
        raise PlannerError("pass only one of --gpus, --nodes and --nodes-range.")
    out = []
    for hw in hws:
        if gpus is not None:
            out.append(make_target(hw, gpus))
        elif nodes is not None:
            if nodes <= 0:
                raise PlannerError(f"--nodes must be a positive integer, got {nodes}.")
            out.append(make_target(hw, nodes * hw.gpus_per_node))
        else:
            out += [make_target(hw, n * hw.gpus_per_node) for n in _node_range(nodes_range)]
    return out


def _progress_bar(description: str):
    """A rich progress bar on stderr (shown only on a terminal) and the callback feeding it."""
    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def register(app: typer.Typer) -> None:
    @app.command()
    def search(
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
        hardware_file: O.HardwareFile = [],
        report: O.Report = None, models: O.ModelsDir = None,
    ) -> None:
        """Search parallel layouts (every valid plan when the space is small enough, else Optuna) and print the
        ranked plans."""
        if fmt not in FORMATS:
            raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        if top <= 0:
            raise _err(f"--top must be a positive integer, got {top}")
        try:
            _check_report(report)
            result, problem = _run_search(SearchRequest.from_flags(locals()))
            if not result.records:
                # deferred: the planner.search package (engine, samplers) loads only for search commands
                from planner.search.nofit import no_fit_message

                raise PlannerError(no_fit_message(result, gbs is not None))
            recs = result.top(top)
            meta = {"model": problem.model.name, "search": result.summary()}
            s = result.summary()
            title = (f"{problem.model.name}: top {len(recs)} of {len(result.records)} distinct feasible plans "
                     f"({problem.batch_text()}, seq {problem.seq_len}, "
                     f"{result.method}, objective {objective})")
            emit_records(recs, fmt, problem.model, meta, title)
            if fmt == "table":
                typer.echo(f"search: {result.method} ({result.mode_note}); "
                           f"{s['evaluated']} distinct candidates evaluated of a space of {s['space_size']}: "
                           f"{s['feasible']} feasible, {s['out_of_memory']} out of memory, {s['invalid']} invalid; "
                           f"{s['elapsed_s']:.2f} s" + (f"; study {result.study_name!r} has {result.study_trials} "
                                                         "trials" if result.study_name else "")
                           + ("; * = on the time/cost Pareto front" if objective == "pareto" else ""))
                for note in problem.notes:
                    typer.echo(f"note: {note}")
                same = [f"#{r.rank} = {', '.join(r.equivalent)}" for r in recs if r.equivalent]
                if same:
                    typer.echo("equivalent plans folded into one row (same predicted time and cost, memory within "
                               f"0.1 GiB; the row keeps the least memory): {'; '.join(same)}")
            if explain is not None:
                if not 1 <= explain <= len(result.records):
                    raise PlannerError(f"--explain {explain} is not a rank between 1 and {len(result.records)}.")
                rec = result.records[explain - 1]
                hw = next(t.hardware for t in problem.targets if t.hardware.gpu.name == rec.gpu
                          and t.world_size == rec.gpus)
                explain_out(problem.model, rec.to_plan(), hw, "json" if fmt == "json" else "table")
            if report is not None:
                # deferred: the report writer loads matplotlib
                from planner.reports.search_report import write_search_report

                _write_report(lambda: write_search_report(report, result, top=top))
        except PlannerError as exc:
            raise _err(str(exc)) from None
        except Interrupted as exc:  # a study keeps the trials that finished: say how to finish it
            raise (Interrupted(f"resume with {_resume_command()}", True) if exc.resumable else exc) from None

    @app.command("explain")
    def explain_cmd(
        model: O.Model = ...,
        gpu: O.Gpu = DEFAULT_GPU,
        gpus: O.Gpus = ...,
        cluster: O.Cluster = None,
        gpus_per_node: O.GpusPerNode = None,
        tp: O.Tp = PlanRequest.tp,
        pp: O.Pp = PlanRequest.pp,
        cp: O.Cp = PlanRequest.cp,
        vpp: O.Vpp = PlanRequest.vpp,
        mbs: O.Mbs = PlanRequest.mbs,
        gbs: O.Gbs = None,
        tokens_per_batch: O.TokensPerBatch = None,
        seq_len: O.SeqLen = None,
        recompute: O.Recompute = PlanRequest.recompute,
        sequence_parallel: O.SequenceParallel = PlanRequest.sequence_parallel,
        zero: O.Zero = PlanRequest.zero,
        dtype: O.Dtype = PlanRequest.dtype,
        framework: O.Framework = PlanRequest.framework,
        attention: O.Attention = PlanRequest.attention,
        ep: O.Ep = PlanRequest.ep,
        etp: O.Etp = None,
        moe_dispatcher: O.MoeDispatcher = PlanRequest.moe_dispatcher,
        moe_imbalance: O.MoeImbalance = None,
        moe_overlap_comm: O.MoeOverlapComm = PlanRequest.moe_overlap_comm,
        moe_grouped_gemm: O.MoeGroupedGemm = PlanRequest.moe_grouped_gemm,
        main_grads_dtype: O.MainGradsDtype = PlanRequest.main_grads_dtype,
        main_params_dtype: O.MainParamsDtype = PlanRequest.main_params_dtype,
        exp_avg_dtype: O.ExpAvgDtype = PlanRequest.exp_avg_dtype,
        exp_avg_sq_dtype: O.ExpAvgSqDtype = PlanRequest.exp_avg_sq_dtype,
        fp8_param_gather: O.Fp8ParamGather = PlanRequest.fp8_param_gather,
        optimizer_offload_fraction: O.OptimizerOffload = PlanRequest.optimizer_offload_fraction,
        offload_modules: O.OffloadModules = None,
        reshard_after_forward: O.ReshardAfterForward = None,
        layer_split: O.LayerSplit = None,
        fmt: str = typer.Option("table", "--format", help="table | json | csv | md (csv, md: every operator)."),
        top: int = typer.Option(15, "--top", help="Operators per table."),
        hardware_file: O.HardwareFile = [], models: O.ModelsDir = None,
    ) -> None:
        """Operator breakdown of one plan by pipeline stage and phase."""
        if fmt not in FORMATS:
            raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        try:
            req = O.plan_request(locals(), "planner explain --model llama-13b --gpus 128 --tp 2 --pp 4")
            res = req.resolve(tuple(hardware_file))
            explain_out(res.model, res.plan, res.hardware, fmt, top)
        except PlannerError as exc:
            raise _err(str(exc)) from None

    @app.command()
    def compare(
        model: O.Model,
        gpu: O.CompareGpuList = [],
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
        fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
        hardware_file: O.HardwareFile = [],
        report: O.Report = None,
    ) -> None:
        """Best plan per GPU type: time/iteration, tokens/s, $ per Mtoken, time and cost to train (expected, with
        the goodput of each allocation)."""
        # deferred: the planner.search package (engine, samplers) loads only for search commands
        from planner.search.records import rank
        from planner.search.sizing import compare as run_compare
        from planner.search.sizing import parse_prices, parse_tokens
        from planner.search.space import load_space

        if fmt not in FORMATS:
            raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        try:
            _check_report(report)
            if (gpus is None) == (nodes is None):
                raise PlannerError("pass exactly one of --gpus N and --nodes N.")
            cat, hws = _hardwares(gpu, None, None, hardware_file)
            prices = parse_prices(price, list(cat.gpus))
            tok = parse_tokens(tokens) if tokens is not None else None
            m = resolve_model(model)
            bar, update = _delayed_bar(f"comparing {m.name} on {', '.join(h.gpu.name for h in hws)}")
            try:
                rows = run_compare(m, hws, load_space(space), gpus=gpus, nodes=nodes, gbs=gbs, seq_len=seq_len,
                                   tokens=tok, prices=prices, tokens_per_batch=parse_batch_range(tokens_per_batch),
                                   calibration=calibration_option(None),  # as `planner predict` applies it
                                   failures=O.failure_model(locals()), jobs=_jobs(0), progress=update)
            finally:
                bar.stop()
            if not rows:
                raise Interrupted("no GPU type was compared before Ctrl-C")
        except PlannerError as exc:
            raise _err(str(exc)) from None
        best = [r.best for r in rows if r.best is not None]
        if fmt == "json":
            typer.echo(json.dumps({"model": m.name, "tokens": tok, "rows": [r.to_dict() for r in rows]}, indent=2))
        elif fmt in ("csv", "md"):
            emit_records(rank(best, "time", None), fmt, m, {}, "")
        else:
            compare_table(m, rows, tok)
        if report is not None and best:
            # deferred: the report writer loads matplotlib
            from planner.reports.search_report import write_compare_report

            _write_report(lambda: write_compare_report(report, rows, m, tokens=tok))
        if len(rows) < len(hws):
            typer.echo(f"interrupted: {len(rows)} of {len(hws)} GPU types compared before Ctrl-C", err=True)
            raise typer.Exit(code=130)
        if not best:
            raise _err(rows[0].message)

    @app.command("size")
    def size_cmd(
        model: O.Model,
        tokens: O.TokenBudget,
        deadline: str = typer.Option(..., "--deadline", help="Wall-clock limit: 72h, 30d, 3w."),
        gpu: O.SizeGpuList = [],
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
        fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
        progress: O.ProgressBar = True,
        hardware_file: O.HardwareFile = [],
        report: O.Report = None,
    ) -> None:
        """Smallest allocation (nodes of which GPU) that trains the tokens before the deadline, proved minimal; also
        the cheapest and the frontier (GPUs vs days vs USD). Times are expected values with failures, restarts and
        checkpoints (--no-goodput: a perfect run); the batch is chosen per plan from a range (--tokens-per-batch)."""
        if fmt not in FORMATS:
            raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        try:
            _check_report(report)
            m, tok, seconds, hws, res = _run_size(locals())
        except PlannerError as exc:
            raise _err(str(exc)) from None
        size_out(m, tok, seconds, res, fmt)
        if report is not None:
            # deferred: the report writer loads matplotlib
            from planner.reports.search_report import write_size_report

            _write_report(lambda: write_size_report(report, res, m, tok, seconds, hws))
        if res.interrupted:
            typer.echo("interrupted: the answer above is the best found before Ctrl-C, not proved minimal", err=True)
            raise typer.Exit(code=130)


def _run_size(f: dict):
    """Parse `planner size` flags and run it with a progress bar (shown after a second of work, terminals only);
    returns (model, tokens, deadline s, hardwares, SizingResult)."""
    # deferred: the planner.search package (engine, samplers) loads only for search commands
    from planner.search.sizing import parse_deadline, parse_prices, parse_tokens
    from planner.search.sizing import size as run_size
    from planner.search.space import load_space

    seconds = parse_deadline(f["deadline"])
    tok = parse_tokens(f["tokens"])
    if f["max_gpus"] <= 0 or f["min_gpus"] <= 0 or f["min_gpus"] > f["max_gpus"]:
        raise PlannerError(f"--min-gpus {f['min_gpus']} and --max-gpus {f['max_gpus']} must be positive with "
                           "--min-gpus <= --max-gpus.")
    if f["budget"] is not None and not (f["budget"] > 0 and f["budget"] < float("inf")):
        raise PlannerError(f"--budget must be a positive amount of USD, got {f['budget']}.")
    cat, hws = _hardwares(f["gpu"] or list(SIZE_DEFAULT_GPUS), None, None, f["hardware_file"])
    prices = parse_prices(f["price"], list(cat.gpus))
    m = resolve_model(f["model"])
    bar, update = _delayed_bar(f"sizing {m.name} on {', '.join(h.gpu.name for h in hws)}") if f["progress"] \
        else (None, None)
    try:
        res = run_size(m, tok, seconds, hws, load_space(f["space"]), min_gpus=f["min_gpus"], max_gpus=f["max_gpus"],
                       budget_usd=f["budget"], gbs=f["gbs"], seq_len=f["seq_len"], prices=prices,
                       tokens_per_batch=parse_batch_range(f["tokens_per_batch"]), jobs=_jobs(0),
                       calibration=calibration_option(None), failures=O.failure_model(f), progress=update)
    finally:
        if bar is not None:
            bar.stop()
    return m, tok, seconds, hws, res


def _delayed_bar(description: str):
    """A rich progress bar on stderr that appears once the work has run for a second (terminals only), and the
    callback feeding it: update(done_types, total_types, predictions, best_so_far)."""
    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=True,
                   disable=not console.is_terminal)
    task = bar.add_task(description, total=None, info="")
    t0, shown = time.monotonic(), [False]

    def update(done: int, total: int, predictions: int, best: str) -> None:
        if not shown[0] and time.monotonic() - t0 > 1.0:
            bar.start()
            shown[0] = True
        info = f"GPU types; {predictions:,} plans predicted" + (f"; best so far {best}" if best else "")
        bar.update(task, completed=done, total=total, info=info)

    return bar, update


def _run_search(r: SearchRequest):
    """Build the search problem of ``r`` and run it (with a progress bar when asked); returns (result, problem)."""
    # deferred: the planner.search package (engine, samplers) loads only for search commands
    from costmodel.goodput import FailureModel
    from planner.calibrate import calibration_option
    from planner.search.engine import search as run
    from planner.search.nofit import search_notes
    from planner.search.sizing import parse_prices, parse_tokens
    from planner.search.space import build_problem

    if r.resume and (r.exhaustive or r.mode == "exhaustive"):
        raise PlannerError("--resume applies to Optuna studies; --exhaustive has nothing to resume (drop one).")
    if r.resume and not r.study_name:
        raise PlannerError("--resume needs --study-name (and the --storage) of the interrupted search.")
    space = _space(r)
    cat, hws = _hardwares(list(r.gpu), r.cluster, r.gpus_per_node, r.hardware_file)
    prices = parse_prices(list(r.price), list(cat.gpus))
    m = resolve_model(r.model)
    # time and cost to train (--tokens) and the cost ranking are expected values under the default goodput model
    failures = FailureModel() if r.tokens is not None or r.objective in ("cost", "pareto") else None
    problem = build_problem(m, _targets(hws, r.gpus, r.nodes, r.nodes_range), space, gbs=r.gbs, seq_len=r.seq_len,
                            tokens=parse_tokens(r.tokens) if r.tokens is not None else None, prices=prices,
                            tokens_per_batch=parse_batch_range(r.tokens_per_batch), failures=failures,
                            calibration=calibration_option(None))  # as `planner predict` applies it
    bar, update = _progress_bar("searching") if r.progress else (None, None)
    if bar is not None:
        bar.start()
    try:
        result = run(problem, r.objective, exhaustive=r.exhaustive, n_trials=r.trials, seed=r.seed, sampler=r.sampler,
                     storage=r.storage, study_name=r.study_name, progress=update, jobs=_jobs(r.jobs),
                     resume=r.resume, mode=r.mode, detail=r.top)
    finally:
        if bar is not None:
            bar.stop()
    return result, replace(problem, notes=problem.notes + tuple(search_notes(result)))


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


def _jobs(jobs: int) -> int:
    if jobs < 0:
        raise PlannerError(f"--jobs must be >= 0, got {jobs}.")
    return jobs or max(1, min(4, os.cpu_count() or 1))
