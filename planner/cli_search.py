"""`planner search`, `planner explain`, `planner compare`, `planner size`."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from costmodel.core.errors import PlannerError

DEFAULT_GPU = "a100-80gb"
"""GPU used when --gpu is not given (the issue's reference case: llama-13b on 128 A100-80GB)."""


def _err(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _int_list(name: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise PlannerError(f"{name} {text!r} must be comma-separated integers, e.g. 1,2,4,8.") from None
    if not vals:
        raise PlannerError(f"{name} needs at least one value.")
    return vals


def _str_list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _bool_list(text: str | None) -> list[bool] | None:
    if text is None:
        return None
    table = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}
    out = []
    for x in _str_list(text):
        if x.lower() not in table:
            raise PlannerError(f"--sp {text!r} must list true/false values, e.g. true,false.")
        out.append(table[x.lower()])
    return out


def _space(name: str, tp, pp, cp, vpp, mbs, recompute, zero, sp, dtype, allow_tp_across_nodes: bool,
           headroom: float | None):
    from planner.search.space import load_space

    space = load_space(name)
    return space.override(tp=_int_list("--tp", tp), pp=_int_list("--pp", pp), cp=_int_list("--cp", cp),
                          vpp=_int_list("--vpp", vpp), mbs=_int_list("--mbs", mbs), recompute=_str_list(recompute),
                          zero=_int_list("--zero", zero), sequence_parallel=_bool_list(sp), dtype=_str_list(dtype),
                          allow_tp_across_nodes=True if allow_tp_across_nodes else None,
                          memory_headroom=headroom)


def _hardwares(gpu: list[str], cluster: str | None, gpus_per_node: int | None, hardware_file: list[str]):
    from costmodel.core.specs.catalogue import load_catalogue

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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


def _emit(records, fmt: str, model, meta: dict, title: str) -> None:
    from planner.search.records import rich_table, to_csv, to_json, to_markdown

    if fmt == "json":
        typer.echo(to_json(records, meta))
    elif fmt == "csv":
        sys.stdout.write(to_csv(records, model))
    elif fmt == "md":
        sys.stdout.write(to_markdown(records))
    else:
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 200).print(rich_table(records, title))


OPT = {
    "model": typer.Option(..., "--model", "-m", help="Preset name (see `planner models`) or path to a config.json."),
    "gpu": typer.Option([], "--gpu", help=f"GPU key (repeat for several; default {DEFAULT_GPU}; see `planner gpus`)."),
    "cluster": typer.Option(None, "--cluster", help="Node type (see `planner gpus`)."),
    "gpn": typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the node type's)."),
    "gbs": typer.Option(None, "--gbs", help="Global batch size in sequences (default ~4M tokens)."),
    "seq": typer.Option(None, "--seq-len", help="Sequence length (default: the model's max)."),
    "tokens": typer.Option(None, "--tokens", help="Training token budget, e.g. 1e12 or 2T."),
    "price": typer.Option([], "--price", help="GPU=USD per GPU-hour, e.g. gh200=2.1 (repeatable)."),
    "space": typer.Option("default", "--space", help="Search-space preset (default, megatron, fsdp) or TOML file."),
    "hw": typer.Option([], "--hardware-file", help="TOML/YAML file adding GPUs/clusters."),
    "report": typer.Option(None, "--report", help="Also write a Markdown report with PNG plots, e.g. reports/NAME.md."),
}


def register(app: typer.Typer) -> None:
    @app.command()
    def search(
        model: str = OPT["model"],
        gpu: list[str] = OPT["gpu"],
        gpus: Optional[int] = typer.Option(None, "--gpus", help="Total GPUs (a multiple of GPUs per node)."),
        nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes of each GPU type."),
        nodes_range: Optional[str] = typer.Option(None, "--nodes-range", help="Node counts: A:B doubling, A:B:STEP, or 4,8,16."),
        cluster: Optional[str] = OPT["cluster"],
        gpus_per_node: Optional[int] = OPT["gpn"],
        space: str = OPT["space"],
        tp: Optional[str] = typer.Option(None, "--tp", help="TP degrees, e.g. 1,2,4,8."),
        pp: Optional[str] = typer.Option(None, "--pp", help="PP degrees."),
        cp: Optional[str] = typer.Option(None, "--cp", help="CP degrees."),
        vpp: Optional[str] = typer.Option(None, "--vpp", help="Virtual pipeline chunks per stage."),
        mbs: Optional[str] = typer.Option(None, "--mbs", help="Micro-batch sizes."),
        recompute: Optional[str] = typer.Option(None, "--recompute", help="Recompute modes: none,selective,full."),
        zero: Optional[str] = typer.Option(None, "--zero", help="ZeRO stages, e.g. 1,3."),
        sp: Optional[str] = typer.Option(None, "--sp", help="Sequence parallelism values: true,false."),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="GEMM precisions: bf16,fp8."),
        allow_tp_across_nodes: bool = typer.Option(False, "--allow-tp-across-nodes", help="Let TP groups span nodes."),
        headroom: Optional[float] = typer.Option(None, "--headroom", help="HBM fraction kept free (default 0.05)."),
        gbs: Optional[int] = OPT["gbs"],
        seq_len: Optional[int] = OPT["seq"],
        tokens: Optional[str] = OPT["tokens"],
        price: list[str] = OPT["price"],
        objective: str = typer.Option("time", "--objective", help="time | cost | pareto (time and $/Mtoken)."),
        trials: int = typer.Option(200, "--trials", help="Optuna trials to run (added to a resumed study)."),
        exhaustive: bool = typer.Option(False, "--exhaustive", help="Evaluate every valid plan instead of sampling."),
        jobs: int = typer.Option(0, "--jobs", help="Processes for --exhaustive (0 = one per CPU core, at most 4)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed (reproducible runs)."),
        sampler: str = typer.Option("tpe", "--sampler", help="tpe | nsga2 | random."),
        storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage: sqlite:///F.db, journal:FILE, RDB URL."),
        study_name: Optional[str] = typer.Option(None, "--study-name", help="Study to create or resume (default storage sqlite:///planner.db)."),
        resume: bool = typer.Option(False, "--resume", help="Finish the study's interrupted run (its remaining trials, same seed) instead of adding --trials."),
        top: int = typer.Option(10, "--top", "-k", help="Plans to print."),
        fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
        explain: Optional[int] = typer.Option(None, "--explain", help="Also explain the plan ranked N."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr (terminals only)."),
        hardware_file: list[str] = OPT["hw"],
        report: Optional[str] = OPT["report"],
    ) -> None:
        """Search parallel layouts (Optuna or exhaustive) and print the ranked plans."""
        from planner.search.records import FORMATS

        if fmt not in FORMATS:
            raise _err(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        if top <= 0:
            raise _err(f"--top must be a positive integer, got {top}")
        try:
            _check_report(report)
            result, problem = _run_search(model, gpu, gpus, nodes, nodes_range, cluster, gpus_per_node, space, tp, pp,
                                          cp, vpp, mbs, recompute, zero, sp, dtype, allow_tp_across_nodes, headroom,
                                          gbs, seq_len, tokens, price, objective, trials, exhaustive, seed, sampler,
                                          storage, study_name, progress, hardware_file, jobs, resume)
            if not result.records:
                from planner.search.engine import no_fit_message

                raise PlannerError(no_fit_message(result, gbs is not None))
            recs = result.top(top)
            meta = {"model": problem.model.name, "search": result.summary()}
            s = result.summary()
            title = (f"{problem.model.name}: top {len(recs)} of {s['feasible']} feasible plans "
                     f"(GBS {problem.global_batch_size}, seq {problem.seq_len}, {result.method}, objective {objective})")
            _emit(recs, fmt, problem.model, meta, title)
            if fmt == "table":
                typer.echo(f"{s['evaluated']} distinct candidates evaluated of a space of {s['space_size']}: "
                           f"{s['feasible']} feasible, {s['out_of_memory']} out of memory, {s['invalid']} invalid; "
                           f"{s['elapsed_s']:.2f} s" + (f"; study {result.study_name!r} has {result.study_trials} "
                                                         "trials" if result.study_name else "")
                           + ("; * = on the time/cost Pareto front" if objective == "pareto" else ""))
            if explain is not None:
                if not 1 <= explain <= len(result.records):
                    raise PlannerError(f"--explain {explain} is not a rank between 1 and {len(result.records)}.")
                rec = result.records[explain - 1]
                hw = next(t.hardware for t in problem.targets if t.hardware.gpu.name == rec.gpu
                          and t.world_size == rec.gpus)
                _explain_out(problem.model, rec.to_plan(), hw, "json" if fmt == "json" else "table")
            if report is not None:
                from planner.reports.search_report import write_search_report

                _write_report(lambda: write_search_report(report, result, top=top))
        except PlannerError as exc:
            raise _err(str(exc))

    @app.command("explain")
    def explain_cmd(
        model: str = OPT["model"],
        gpu: str = typer.Option(DEFAULT_GPU, "--gpu", help="GPU key (see `planner gpus`)."),
        gpus: int = typer.Option(..., "--gpus", help="Total GPUs."),
        cluster: Optional[str] = OPT["cluster"],
        gpus_per_node: Optional[int] = OPT["gpn"],
        tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"), cp: int = typer.Option(1, "--cp"),
        vpp: int = typer.Option(1, "--vpp"), mbs: int = typer.Option(1, "--mbs"),
        gbs: Optional[int] = OPT["gbs"], seq_len: Optional[int] = OPT["seq"],
        recompute: str = typer.Option("selective", "--recompute"),
        sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel"),
        zero: int = typer.Option(1, "--zero"), dtype: str = typer.Option("bf16", "--dtype"),
        fmt: str = typer.Option("table", "--format", help="table | json."),
        top: int = typer.Option(15, "--top", help="Operators per table."),
        hardware_file: list[str] = OPT["hw"],
    ) -> None:
        """Operator breakdown of one plan by pipeline stage and phase."""
        from planner.requests import build_request

        if fmt not in ("table", "json"):
            raise _err(f"--format {fmt!r} is not one of table, json")
        raw = {"model": model, "gpu": gpu, "gpus": gpus, "cluster": cluster, "gpus_per_node": gpus_per_node,
               "tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "mbs": mbs, "gbs": gbs, "seq_len": seq_len,
               "recompute": recompute, "sequence_parallel": sequence_parallel, "zero": zero, "dtype": dtype}
        try:
            req = build_request(raw, tuple(hardware_file))
            _explain_out(req.model, req.plan, req.hardware, fmt, top)
        except PlannerError as exc:
            raise _err(str(exc))

    @app.command()
    def compare(
        model: str = OPT["model"],
        gpu: list[str] = typer.Option([], "--gpu", help="GPU keys to compare (repeat; at least two are useful)."),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="Total GPUs of each type."),
        nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes of each type instead of --gpus."),
        tokens: Optional[str] = OPT["tokens"],
        price: list[str] = OPT["price"],
        space: str = OPT["space"],
        gbs: Optional[int] = OPT["gbs"], seq_len: Optional[int] = OPT["seq"],
        fmt: str = typer.Option("table", "--format", help="table | json | csv | md."),
        hardware_file: list[str] = OPT["hw"],
        report: Optional[str] = OPT["report"],
    ) -> None:
        """Best plan per GPU type: time/iteration, tokens/s, $ per Mtoken, time and cost to train."""
        from planner.search.records import FORMATS, rank
        from planner.search.sizing import compare as run_compare, parse_prices, parse_tokens
        from planner.search.space import load_space
        from costmodel.core.specs.presets import resolve_model

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
            rows = run_compare(m, hws, load_space(space), gpus=gpus, nodes=nodes, gbs=gbs, seq_len=seq_len,
                               tokens=tok, prices=prices)
        except PlannerError as exc:
            raise _err(str(exc))
        best = [r.best for r in rows if r.best is not None]
        if fmt == "json":
            typer.echo(json.dumps({"model": m.name, "tokens": tok, "rows": [r.to_dict() for r in rows]}, indent=2))
        elif fmt in ("csv", "md"):
            _emit(rank(best, "time", None), fmt, m, {}, "")
        else:
            _compare_table(m, rows, tok)
        if report is not None and best:
            from planner.reports.search_report import write_compare_report

            _write_report(lambda: write_compare_report(report, rows, m, tokens=tok))
        if not best:
            raise _err(rows[0].message)

    @app.command("size")
    def size_cmd(
        model: str = OPT["model"],
        tokens: str = typer.Option(..., "--tokens", help="Training token budget, e.g. 2e12 or 2T."),
        deadline: str = typer.Option(..., "--deadline", help="Wall-clock limit: 72h, 30d, 3w."),
        gpu: list[str] = typer.Option([], "--gpu", help="GPU types to consider (repeat; default: a100-80gb, h100-sxm)."),
        max_gpus: int = typer.Option(16384, "--max-gpus", help="Largest allocation considered."),
        budget: Optional[float] = typer.Option(None, "--budget", help="Largest cost in USD."),
        price: list[str] = OPT["price"],
        space: str = OPT["space"],
        gbs: Optional[int] = OPT["gbs"], seq_len: Optional[int] = OPT["seq"],
        fmt: str = typer.Option("table", "--format", help="table | json."),
        hardware_file: list[str] = OPT["hw"],
        report: Optional[str] = OPT["report"],
    ) -> None:
        """Smallest allocation (nodes of which GPU) that trains the tokens before the deadline; also the cheapest."""
        from planner.search.sizing import parse_deadline, parse_prices, parse_tokens, size as run_size
        from planner.search.space import load_space
        from costmodel.core.specs.presets import resolve_model

        if fmt not in ("table", "json"):
            raise _err(f"--format {fmt!r} is not one of table, json")
        try:
            _check_report(report)
            seconds = parse_deadline(deadline)
            tok = parse_tokens(tokens)
            if max_gpus <= 0:
                raise PlannerError(f"--max-gpus must be a positive integer, got {max_gpus}.")
            if budget is not None and not budget > 0:
                raise PlannerError(f"--budget must be a positive amount of USD, got {budget}.")
            cat, hws = _hardwares(gpu or list(SIZE_DEFAULT_GPUS), None, None, hardware_file)
            prices = parse_prices(price, list(cat.gpus))
            m = resolve_model(model)
            res = run_size(m, tok, seconds, hws, load_space(space), max_gpus=max_gpus, budget_usd=budget, gbs=gbs,
                           seq_len=seq_len, prices=prices)
        except PlannerError as exc:
            raise _err(str(exc))
        if fmt == "json":
            typer.echo(json.dumps({"model": m.name, "tokens": tok, "deadline_s": seconds, **res.to_dict()}, indent=2))
        else:
            _size_table(m, tok, seconds, res)
        if report is not None:
            from planner.reports.search_report import write_size_report

            _write_report(lambda: write_size_report(report, res, m, tok, seconds, hws))


SIZE_DEFAULT_GPUS = ("a100-80gb", "h100-sxm")
"""GPU types `planner size` considers without --gpu (kept short: each type costs several searches)."""


def _run_search(model, gpu, gpus, nodes, nodes_range, cluster, gpus_per_node, space, tp, pp, cp, vpp, mbs, recompute,
                zero, sp, dtype, allow_tp_across_nodes, headroom, gbs, seq_len, tokens, price, objective, trials,
                exhaustive, seed, sampler, storage, study_name, progress, hardware_file, jobs=0, resume=False):
    from planner.search.engine import search as run
    from planner.search.sizing import parse_prices, parse_tokens
    from planner.search.space import build_problem
    from costmodel.core.specs.presets import resolve_model

    if resume and exhaustive:
        raise PlannerError("--resume applies to Optuna studies; --exhaustive has nothing to resume (drop one).")
    if resume and not study_name:
        raise PlannerError("--resume needs --study-name (and the --storage) of the interrupted search.")
    sp_ = _space(space, tp, pp, cp, vpp, mbs, recompute, zero, sp, dtype, allow_tp_across_nodes, headroom)
    cat, hws = _hardwares(gpu, cluster, gpus_per_node, hardware_file)
    prices = parse_prices(price, list(cat.gpus))
    m = resolve_model(model)
    problem = build_problem(m, _targets(hws, gpus, nodes, nodes_range), sp_, gbs=gbs, seq_len=seq_len,
                            tokens=parse_tokens(tokens) if tokens is not None else None, prices=prices)
    bar, update = _progress_bar("exhaustive" if exhaustive else "optuna") if progress else (None, None)
    if bar is not None:
        bar.start()
    try:
        result = run(problem, objective, exhaustive=exhaustive, n_trials=trials, seed=seed, sampler=sampler,
                     storage=storage, study_name=study_name, progress=update, jobs=_jobs(jobs), resume=resume)
    finally:
        if bar is not None:
            bar.stop()
    return result, problem


def _check_report(report: str | None) -> None:
    if report is not None:
        from planner.reports.markdown import report_path

        report_path(report)


def _write_report(write) -> None:
    """Run a report writer (returns planner.reports.ReportFiles); a PlannerError exits with code 2."""
    try:
        typer.echo(f"wrote {write().markdown}", err=True)
    except PlannerError as exc:
        raise _err(str(exc))


def _jobs(jobs: int) -> int:
    import os

    if jobs < 0:
        raise PlannerError(f"--jobs must be >= 0, got {jobs}.")
    return jobs or max(1, min(4, os.cpu_count() or 1))


def _explain_out(model, plan, hw, fmt: str, top: int = 15) -> None:
    from rich.console import Console

    from planner.search.explain import explain_plan, render_explanation

    ex = explain_plan(model, plan, hw)
    if fmt == "json":
        typer.echo(json.dumps(ex, indent=2))
    else:
        render_explanation(ex, Console(width=None if sys.stdout.isatty() else 200), top)


def _compare_table(m, rows, tokens) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from planner.search.records import human_duration

    t = Table(title=f"{m.name}: best plan per GPU type" + (f", {tokens:.3g} tokens" if tokens else ""))
    head = ["GPU", "nodes x GPUs/node", "plan", "iter time [s]", "tokens/s", "MFU %", "$/GPU-h (date, source)",
            "$/Mtoken"] + (["time to train", "cost to train [$]"] if tokens else [])
    for h in head:
        t.add_column(escape(h), justify="left" if h in ("GPU", "plan") else "right")
    for r in rows:
        b = r.best
        if b is None:
            t.add_row(r.gpu, "-", escape(r.message), *["-"] * (len(head) - 3))
            continue
        g = r.hardware.gpu
        src = f"{b.price_usd_per_gpu_hour:.2f} ({g.price_date or 'undated'}, {g.price_source or '--price'})" \
            if b.price_usd_per_gpu_hour is not None else "-"
        if b.price_usd_per_gpu_hour is not None and b.price_usd_per_gpu_hour != g.price_usd_per_gpu_hour:
            src = f"{b.price_usd_per_gpu_hour:.2f} (--price)"
        plan = (f"TP{b.tp} PP{b.pp} DP{b.dp} CP{b.cp} VPP{b.vpp} MBS{b.mbs} {b.recompute} ZeRO{b.zero}")
        row = [b.gpu, f"{b.nodes} x {b.gpus_per_node}", plan, f"{b.iteration_time_s:.3f}", f"{b.tokens_per_s:,.0f}",
               f"{100 * b.mfu:.1f}", src, "-" if b.usd_per_mtoken is None else f"{b.usd_per_mtoken:.3f}"]
        if tokens:
            row += [human_duration(b.time_to_train_s),
                    "-" if b.cost_to_train_usd is None else f"{b.cost_to_train_usd:,.0f}"]
        t.add_row(*[escape(c) for c in row])
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def _size_table(m, tokens, deadline_s, res) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from planner.search.records import human_duration

    con = Console(width=None if sys.stdout.isatty() else 200)
    con.print(f"[bold]{m.name}[/]: {tokens:.3g} tokens within {human_duration(deadline_s)} "
              f"({res.searched} allocations searched)")
    t = Table(title="Allocations that meet the deadline")
    for h in ("", "GPU", "nodes x GPUs/node", "GPUs", "plan", "time to train", "GPU-hours", "node-hours", "cost [$]"):
        t.add_column(escape(h), justify="left" if h in ("", "GPU", "plan") else "right")
    rows = [("smallest", res.smallest)]
    if res.cheapest is not None and res.cheapest is not res.smallest \
            and res.cheapest.record.key() != res.smallest.record.key():
        rows.append(("cheapest", res.cheapest))
    elif res.cheapest is not None:
        rows[0] = ("smallest & cheapest", res.smallest)
    rows += [(f"smallest {a.record.gpu}", a) for a in res.per_gpu
             if a.record.key() not in {x.record.key() for _, x in rows}]
    for label, a in rows:
        b = a.record
        plan = f"TP{b.tp} PP{b.pp} DP{b.dp} CP{b.cp} VPP{b.vpp} MBS{b.mbs} {b.recompute} ZeRO{b.zero}"
        t.add_row(escape(label), b.gpu, f"{b.nodes} x {b.gpus_per_node}", str(b.gpus), escape(plan),
                  human_duration(b.time_to_train_s), f"{a.gpu_hours:,.0f}", f"{a.node_hours:,.0f}",
                  "-" if a.cost_usd is None else f"{a.cost_usd:,.0f}")
    con.print(t)
