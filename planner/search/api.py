"""`planner search`, `planner size` and `planner compare` as Python functions: :func:`search`, :func:`size`,
:func:`compare` (exported as ``planner.search(...)``, ``planner.size(...)``, ``planner.compare(...)``).

Keyword names are the commands' flags with underscores, defaults are the CLI's, and the shipped default
calibration is applied as `planner predict` applies it; each returns a typed result whose ``to_dict()`` is the
command's ``--format json`` object, and bad input raises :class:`costmodel.core.errors.PlannerError`. The commands
(planner/cli_search.py) call these and print.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields

from costmodel.core.errors import Interrupted, PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.presets import resolve_model
from planner.batch import parse_batch_range
from planner.calibrate import calibration_option
from planner.requests import MEMORY_KEYS
from planner.search.engine import SearchResult
from planner.search.engine import search as run_engine
from planner.search.nofit import no_fit_message, search_notes
from planner.search.records import PlanRecord
from planner.search.sizing import CompareRow, SizingResult, parse_deadline, parse_prices, parse_tokens
from planner.search.sizing import compare as compare_gpus
from planner.search.sizing import size as size_allocation
from planner.search.space import build_problem, load_space, make_target

DEFAULT_GPU = "a100-80gb"
"""GPU `planner search` uses when --gpu is not given (the issue's reference case: llama-13b on 128 A100-80GB)."""
SIZE_DEFAULT_GPUS = ("a100-80gb", "h100-sxm")
"""GPU types `planner size` considers without --gpu (kept short: each type costs several searches)."""


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
    """Global batch size in tokens, one value ("16M") or a range MIN:MAX ("4M:16M") each plan takes its GBS from
    (planner.batch; not with gbs)."""
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
    main_grads_dtype: str = ""
    """Memory features every plan takes (planner.requests.MEMORY_KEYS, as PlanRequest's fields of the same names;
    :func:`plan_settings`)."""
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    fp8_param_gather: bool = False
    optimizer_offload_fraction: float = 0.0
    offload_modules: str | tuple[str, ...] | None = None
    """Fine-grained activation offloading, 'a,b' or a list (PlanRequest.offload_modules)."""
    reshard_after_forward: bool | None = None

    @classmethod
    def from_flags(cls, flags: dict) -> SearchRequest:
        """The request named by a command's parameters (e.g. its ``locals()``; other names are ignored)."""
        vals = {f.name: flags[f.name] for f in fields(cls) if f.name in flags}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in vals.items()})



# ------------------------------------------------------------------------ search dimensions (lists of choices)
def int_list(name: str, text: str | None) -> list[int] | None:
    """A search dimension flag as integers: '1,2,4' -> [1, 2, 4]; None stays None."""
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise PlannerError(f"{name} {text!r} must be comma-separated integers, e.g. 1,2,4,8.") from None
    if not vals:
        raise PlannerError(f"{name} needs at least one value.")
    return vals


def etp_list(text: str | None) -> list[int] | None:
    """--etp choices of a search: 'tp,1' -> [0, 1] (0 = ETP equal to TP); None stays None."""
    if text is None:
        return None
    vals = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not vals or not all(v == "tp" or v.isdigit() and int(v) > 0 for v in vals):
        raise PlannerError(f"--etp {text!r} must list 'tp' and/or positive integers, e.g. tp,1.")
    return [0 if v == "tp" else int(v) for v in vals]


def str_list(text: str | None) -> list[str] | None:
    """A search dimension flag as strings: 'megatron, fsdp' -> ['megatron', 'fsdp']; None stays None."""
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def bool_list(text: str | None) -> list[bool] | None:
    """--sp values: 'true,false' -> [True, False]; None stays None."""
    if text is None:
        return None
    table = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}
    out = []
    for x in str_list(text):
        if x.lower() not in table:
            raise PlannerError(f"--sp {text!r} must list true/false values, e.g. true,false.")
        out.append(table[x.lower()])
    return out


def plan_settings(offload_modules: str | tuple | list | None = None, **features) -> dict:
    """The memory features a search, comparison or sizing applies to every plan: the keywords and flags of
    `planner predict` of the same names (planner.requests.MEMORY_KEYS), as SearchSpace.plan_settings takes them; the
    space checks the names and values. ``offload_modules`` may be 'a,b' or a list; 'auto' is not a setting but
    SearchSpace.offload_auto (:func:`space_with_settings`)."""
    if offload_modules == "auto":
        offload_modules = None
    mods = tuple(str_list(offload_modules)) if isinstance(offload_modules, str) else tuple(offload_modules or ())
    return {**features, "offload_modules": mods}


def space_with_settings(space, **features):
    """``space`` (a SearchSpace) with the memory features of :func:`plan_settings`, and with
    SearchSpace.offload_auto where ``offload_modules`` is 'auto'."""
    return space.override(plan_settings=plan_settings(**features),
                          offload_auto=features.get("offload_modules") == "auto")


def _space(r: SearchRequest):
    return space_with_settings(load_space(r.space), **{k: getattr(r, k) for k in MEMORY_KEYS}).override(
        tp=int_list("--tp", r.tp), pp=int_list("--pp", r.pp), cp=int_list("--cp", r.cp),
        vpp=int_list("--vpp", r.vpp), mbs=int_list("--mbs", r.mbs), recompute=str_list(r.recompute),
        zero=int_list("--zero", r.zero), sequence_parallel=bool_list(r.sp), dtype=str_list(r.dtype),
        framework=str_list(r.framework), ep=int_list("--ep", r.ep), etp=etp_list(r.etp),
        allow_tp_across_nodes=True if r.allow_tp_across_nodes else None,
        memory_headroom=r.headroom)


def _hardwares(gpu, cluster: str | None, gpus_per_node: int | None, hardware_file, node_types=()):
    """The catalogue and the Hardware of each GPU asked for; ``node_types`` (compare, size: ``--cluster``
    GPU=NODE_TYPE or NODE_TYPE, :func:`parse_node_types`) picks each GPU's node type."""
    cat = load_catalogue(tuple(hardware_file))
    names = gpu or ([None] if cluster else [DEFAULT_GPU])
    keys = [None if g is None else cat.gpu(g).name for g in names]
    chosen = parse_node_types(list(node_types), [k for k in keys if k is not None], cat)
    return cat, [cat.resolve(g, chosen.get(k, cluster), gpus_per_node) for g, k in zip(names, keys)]


def parse_node_types(texts: list[str], gpus: list[str], cat) -> dict[str, str]:
    """``--cluster`` of compare and size -> {GPU key: node type}: 'GPU=NODE_TYPE', or 'NODE_TYPE' for the GPU it is
    built with; each for one of the GPUs ``gpus`` compared, at most once per GPU."""
    out: dict[str, str] = {}
    for text in texts:
        if "=" in text:
            g_text, node = (part.strip() for part in text.split("=", 1))
            g = cat.gpu(g_text).name
        else:
            node = text.strip()
            g = cat.cluster(node).gpu
        node = cat.cluster(node).name
        if g not in gpus:
            raise PlannerError(f"--cluster {text} is for {g}, which is not among the GPU types asked for "
                               f"({', '.join(gpus)}); add --gpu {g} or write GPU=NODE_TYPE for one of them.")
        if g in out and out[g] != node:
            raise PlannerError(f"--cluster gives {g} two node types ({out[g]} and {node}); pass one per GPU type.")
        out[g] = node
    return out


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
    # deferred: rich's progress display loads only when a search shows one
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update



def _delayed_bar(description: str):
    """A rich progress bar on stderr that appears once the work has run for a second (terminals only), and the
    callback feeding it: update(done_types, total_types, predictions, best_so_far)."""
    # deferred: rich's progress display loads only when sizing or comparing shows one
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


def jobs_or_default(jobs: int) -> int:
    """--jobs: 0 = one process per CPU core, at most 4."""
    if jobs < 0:
        raise PlannerError(f"--jobs must be >= 0, got {jobs}.")
    return jobs or max(1, min(4, os.cpu_count() or 1))


def failure_model(goodput: bool = True, failure_rate: float | None = None, planned_interruptions: float | None = None,
                  restart_min: float | None = None, ckpt_mode: str | None = None,
                  ckpt_bandwidth: float | None = None, ckpt_interval: float | None = None,
                  slowdown: float | None = None):
    """The costmodel.schedule.goodput.FailureModel named by the goodput flags (None with goodput=False, a perfect run);
    a bad value raises PlannerError."""
    from costmodel.schedule.goodput import FailureModel  # deferred: only the sizing commands need it

    if not goodput:
        return None
    given = {"failure_rate": failure_rate, "planned_per_day": planned_interruptions,
             "restart_s": None if restart_min is None else 60.0 * restart_min, "ckpt_mode": ckpt_mode,
             "storage_gbs": ckpt_bandwidth, "interval_s": None if ckpt_interval is None else 60.0 * ckpt_interval,
             "slowdown": slowdown}
    return FailureModel(**{k: v for k, v in given.items() if v is not None})


# ------------------------------------------------------------------------------------------ search
@dataclass
class RankedPlans:
    """What `planner search` prints: the best plans of a search, ranked."""

    model: str
    """Model name."""
    search: dict
    """How the search went (SearchResult.summary(): method, candidates evaluated, feasible, elapsed, batch)."""
    plans: list[PlanRecord]
    """The ``top`` best plans, best first."""
    result: SearchResult = field(repr=False)
    """Every feasible plan found (``result.records``) and the problem searched (``result.problem``)."""
    notes: tuple[str, ...] = ()
    """What the answer rests on besides the plans: the problem's notes, the batch where it limits scaling, the
    goodput model (planner.search.nofit.search_notes)."""

    @property
    def best(self) -> PlanRecord:
        return self.plans[0]

    def to_dict(self) -> dict:
        """The `planner search --format json` object."""
        return {"model": self.model, "search": self.search, "plans": [r.to_dict() for r in self.plans]}


def run_search(r: SearchRequest) -> RankedPlans:
    """Build the search problem of ``r`` and run it (with a progress bar when asked); PlannerError when no plan is
    feasible."""
    from costmodel.schedule.goodput import FailureModel  # deferred: only searches with a token budget or a cost need it

    if r.resume and (r.exhaustive or r.mode == "exhaustive"):
        raise PlannerError("--resume applies to Optuna studies; --exhaustive has nothing to resume (drop one).")
    if r.resume and not r.study_name:
        raise PlannerError("--resume needs --study-name (and the --storage) of the interrupted search.")
    if r.top <= 0:
        raise PlannerError(f"--top must be a positive integer, got {r.top}")
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
        result = run_engine(problem, r.objective, exhaustive=r.exhaustive, n_trials=r.trials, seed=r.seed,
                            sampler=r.sampler, storage=r.storage, study_name=r.study_name, progress=update,
                            jobs=jobs_or_default(r.jobs), resume=r.resume, mode=r.mode, detail=r.top)
    finally:
        if bar is not None:
            bar.stop()
    if not result.records:
        raise PlannerError(no_fit_message(result, r.gbs is not None))
    return RankedPlans(m.name, result.summary(), result.top(r.top), result,
                       tuple(problem.notes) + tuple(search_notes(result)))


def search(**flags) -> RankedPlans:
    """`planner search` (keywords: the fields of :class:`SearchRequest`, e.g. ``model='llama-13b', gpus=128``)."""
    unknown = sorted(set(flags) - {f.name for f in fields(SearchRequest)})
    if "model" not in flags:
        raise PlannerError("missing required key model, e.g. planner.search(model='llama-13b', gpus=128)")
    if unknown:
        raise PlannerError(f"unknown search option(s) {', '.join(unknown)}; allowed: "
                           + ", ".join(f.name for f in fields(SearchRequest)))
    return run_search(SearchRequest.from_flags(flags))


# ------------------------------------------------------------------------------------------ compare
@dataclass
class CompareResult:
    """What `planner compare` prints: the best plan per GPU type."""

    model: str
    tokens: float | None
    """Training token budget (None: not given)."""
    rows: list[CompareRow]
    """One per GPU type compared, in the order asked (fewer than asked after Ctrl-C: ``interrupted``)."""
    spec: ModelSpec = field(repr=False)
    """The model compared."""
    types_asked: int = 0
    """GPU types asked for."""

    @property
    def interrupted(self) -> bool:
        """Ctrl-C stopped the comparison before every GPU type was compared."""
        return len(self.rows) < self.types_asked

    @property
    def best(self) -> list[PlanRecord]:
        """The best plan of each GPU type where one fits."""
        return [r.best for r in self.rows if r.best is not None]

    def to_dict(self) -> dict:
        """The `planner compare --format json` object."""
        return {"model": self.model, "tokens": self.tokens, "rows": [r.to_dict() for r in self.rows]}


def compare(*, model: str, gpu: list[str] | tuple[str, ...] = (), gpus: int | None = None, nodes: int | None = None,
            tokens: str | float | None = None, price: list[str] | tuple[str, ...] = (), space: str = "default",
            gbs: int | None = None, tokens_per_batch: str | int | None = None, seq_len: int | None = None,
            goodput: bool = True, failure_rate: float | None = None,
            planned_interruptions: float | None = None, restart_min: float | None = None, ckpt_mode: str | None = None,
            ckpt_bandwidth: float | None = None, ckpt_interval: float | None = None, slowdown: float | None = None,
            hardware_file: list[str] | tuple[str, ...] = (), cluster: list[str] | tuple[str, ...] = (),
            main_grads_dtype: str = "", main_params_dtype: str = "fp32", exp_avg_dtype: str = "fp32",
            exp_avg_sq_dtype: str = "fp32", fp8_param_gather: bool = False, optimizer_offload_fraction: float = 0.0,
            offload_modules: str | tuple | list | None = None, reshard_after_forward: bool | None = None
            ) -> CompareResult:
    """`planner compare`: the best plan per GPU type on ``gpus`` GPUs or ``nodes`` nodes of each, with the expected
    time and cost to train under the goodput keywords (:func:`failure_model`); ``cluster``: node types per GPU
    (:func:`parse_node_types`; default each GPU's own); the memory-feature keywords (:func:`plan_settings`) apply to
    every plan."""
    if (gpus is None) == (nodes is None):
        raise PlannerError("pass exactly one of --gpus N and --nodes N.")
    failures = failure_model(goodput, failure_rate, planned_interruptions, restart_min, ckpt_mode, ckpt_bandwidth,
                             ckpt_interval, slowdown)
    cat, hws = _hardwares(list(gpu), None, None, hardware_file, cluster)
    prices = parse_prices(list(price), list(cat.gpus))
    tok = _tokens(tokens) if tokens is not None else None
    m = resolve_model(model)
    # the memory-feature keywords, by name (the comprehension's iterable, locals(), is this function's)
    sp = space_with_settings(load_space(space), **{k: v for k, v in locals().items() if k in MEMORY_KEYS})
    bar, update = _delayed_bar(f"comparing {m.name} on {', '.join(h.gpu.name for h in hws)}")
    try:
        rows = compare_gpus(m, hws, sp, gpus=gpus, nodes=nodes, gbs=gbs, seq_len=seq_len, tokens=tok,
                            prices=prices, tokens_per_batch=parse_batch_range(tokens_per_batch),
                            calibration=calibration_option(None),  # as `planner predict` applies it
                            failures=failures, jobs=jobs_or_default(0), progress=update)
    finally:
        bar.stop()
    if not rows:
        raise Interrupted("no GPU type was compared before Ctrl-C")
    return CompareResult(m.name, tok, rows, m, len(hws))


def _tokens(tokens: str | float) -> float:
    return parse_tokens(tokens) if isinstance(tokens, str) else float(tokens)


# ------------------------------------------------------------------------------------------ size
@dataclass
class SizeResult:
    """What `planner size` prints: the smallest (and cheapest) allocation that meets the deadline."""

    model: str
    tokens: float
    """Training token budget."""
    deadline_s: float
    """Wall-clock limit in seconds."""
    sizing: SizingResult
    """The allocations found (``sizing.interrupted``: Ctrl-C stopped the search, the best found is not proved
    minimal)."""
    spec: ModelSpec = field(repr=False)
    """The model sized."""
    hardwares: list = field(default_factory=list, repr=False)
    """The GPU types considered (catalogue Hardware)."""
    calibration: object = field(default=None, repr=False)
    """The calibration the plans were predicted with (planner.calibrate.Calibration; None = uncalibrated)."""

    def to_dict(self) -> dict:
        """The `planner size --format json` object."""
        return {"model": self.model, "tokens": self.tokens, "deadline_s": self.deadline_s, **self.sizing.to_dict()}


def size(*, model: str, tokens: str | float, deadline: str, gpu: list[str] | tuple[str, ...] = (), min_gpus: int = 1,
         max_gpus: int = 16384, budget: float | None = None, price: list[str] | tuple[str, ...] = (),
         space: str = "default", gbs: int | None = None, tokens_per_batch: str | int | None = None,
         seq_len: int | None = None, goodput: bool = True, failure_rate: float | None = None,
         planned_interruptions: float | None = None, restart_min: float | None = None, ckpt_mode: str | None = None,
         ckpt_bandwidth: float | None = None, ckpt_interval: float | None = None, slowdown: float | None = None,
         progress: bool = True, hardware_file: list[str] | tuple[str, ...] = (), jobs: int = 0,
         cluster: list[str] | tuple[str, ...] = (), main_grads_dtype: str = "", main_params_dtype: str = "fp32",
         exp_avg_dtype: str = "fp32", exp_avg_sq_dtype: str = "fp32", fp8_param_gather: bool = False,
         optimizer_offload_fraction: float = 0.0, offload_modules: str | tuple | list | None = None,
         reshard_after_forward: bool | None = None) -> SizeResult:
    """`planner size`: the smallest allocation (nodes of which GPU type, of ``gpu`` or SIZE_DEFAULT_GPUS, from
    ``min_gpus`` to ``max_gpus``) that trains ``tokens`` before ``deadline`` (e.g. '30d'), proved minimal, the
    cheapest and the frontier; times are expected values under the goodput keywords (:func:`failure_model`);
    ``jobs`` GPU types at once (0 = per CPU core); ``cluster``: node types per GPU (:func:`parse_node_types`); the
    memory-feature keywords (:func:`plan_settings`) apply to every plan."""
    seconds = parse_deadline(deadline)
    tok = _tokens(tokens)
    if max_gpus <= 0 or min_gpus <= 0 or min_gpus > max_gpus:
        raise PlannerError(f"--min-gpus {min_gpus} and --max-gpus {max_gpus} must be positive with "
                           "--min-gpus <= --max-gpus.")
    if budget is not None and not (budget > 0 and budget < float("inf")):
        raise PlannerError(f"--budget must be a positive amount of USD, got {budget}.")
    failures = failure_model(goodput, failure_rate, planned_interruptions, restart_min, ckpt_mode, ckpt_bandwidth,
                             ckpt_interval, slowdown)
    cat, hws = _hardwares(list(gpu) or list(SIZE_DEFAULT_GPUS), None, None, hardware_file, cluster)
    prices = parse_prices(list(price), list(cat.gpus))
    m = resolve_model(model)
    cal = calibration_option(None)  # as `planner predict` applies it
    # the memory-feature keywords, by name (the comprehension's iterable, locals(), is this function's)
    sp = space_with_settings(load_space(space), **{k: v for k, v in locals().items() if k in MEMORY_KEYS})
    bar, update = _delayed_bar(f"sizing {m.name} on {', '.join(h.gpu.name for h in hws)}") if progress \
        else (None, None)
    try:
        res = size_allocation(m, tok, seconds, hws, sp, min_gpus=min_gpus, max_gpus=max_gpus,
                              budget_usd=budget, gbs=gbs, seq_len=seq_len, prices=prices,
                              tokens_per_batch=parse_batch_range(tokens_per_batch), jobs=jobs_or_default(jobs),
                              calibration=cal, failures=failures, progress=update)
    finally:
        if bar is not None:
            bar.stop()
    return SizeResult(m.name, tok, seconds, res, m, hws, cal)
