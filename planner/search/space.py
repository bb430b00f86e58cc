"""The search space: which layouts `planner search` considers, as data.

A space preset (``search_spaces/search/<name>.toml``) lists the candidate values of every plan
dimension (TP, PP, CP, VPP, micro-batch, recompute, sequence parallelism, ZeRO stage, dtype). The
CLI overrides single dimensions (``--tp 1,2,4``). A :class:`SearchProblem` adds what the user fixes:
the model, the allocations (GPU type x GPU count), the global batch (a fixed GBS, or a range in tokens from which
each plan takes its own, planner.batch) and the sequence length.

Degrees are turned into valid factorizations *before* a study starts (:func:`factorizations`,
:func:`dimension_choices`), because Optuna's categorical choices cannot change between trials.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import search_spaces
from costmodel.core.errors import PlannerError
from costmodel.core.specs.framework import DEFAULT_FRAMEWORK, FRAMEWORKS
from costmodel.core.specs.hardware import GPUSpec, Hardware
from costmodel.core.specs.memory_features import FEATURE_DEFAULTS, offload_steps, value_problems
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import DTYPES, RECOMPUTE_MODES, ParallelPlan, uneven_split_problem
from costmodel.core.specs.presets import default_seq_len
from costmodel.cost import fp8_block
from costmodel.graph.moe import with_default_dispatcher
from costmodel.memory.per_gpu import DEFAULT_HEADROOM, first_fitting, fits_in_memory, memory_per_gpu
from planner.batch import ROUNDING, BatchRange, batch_range, batch_steps, tokens_text

INT_DIMS = ("tp", "pp", "cp", "vpp", "mbs")
"""Dimensions holding positive integers."""
DIMS = INT_DIMS + ("recompute", "sequence_parallel", "zero", "dtype", "framework")
"""Every plan dimension a space lists, in display order (DP is derived)."""
MOE_DIMS = ("ep", "etp")
"""Dimensions searched for mixture-of-experts models only (a dense model's EP is 1, ETP = TP)."""


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per plan dimension (each a non-empty tuple) plus search options."""

    name: str
    """Preset name or file the space came from."""
    tp: tuple[int, ...] = (1, 2, 4, 8)
    """Tensor-parallel degrees."""
    pp: tuple[int, ...] = (1, 2, 4, 8)
    """Pipeline-parallel degrees."""
    cp: tuple[int, ...] = (1,)
    """Context-parallel degrees."""
    vpp: tuple[int, ...] = (1,)
    """Virtual pipeline chunks per stage (used only when PP > 1)."""
    mbs: tuple[int, ...] = (1,)
    """Micro-batch sizes (sequences)."""
    recompute: tuple[str, ...] = ("selective",)
    """Activation recomputation modes: none, selective, full."""
    sequence_parallel: tuple[bool, ...] = (True,)
    """Megatron sequence parallelism on/off (meaningful only with TP > 1)."""
    zero: tuple[int, ...] = (1,)
    """ZeRO stages (1 = Megatron distributed optimizer, 3 = FSDP full shard)."""
    dtype: tuple[str, ...] = ("bf16",)
    """GEMM precisions."""
    framework: tuple[str, ...] = (DEFAULT_FRAMEWORK,)
    """Training stacks (costmodel.core.specs.framework): several compare them on the same allocation."""
    ep: tuple[int, ...] = ()
    """Expert-parallel degrees, MoE models only (dense: EP = 1); () = every divisor of the experts
    (:func:`moe_choices` keeps those Megatron's rules allow)."""
    etp: tuple[int, ...] = (0, 1)
    """Expert tensor-parallel degrees, MoE models only: 0 = TP (Megatron-Core's default), 1 = experts not split
    by TP (a common MoE choice, e.g. Megatron-LM's Mixtral/DeepSeek recipes with --expert-tensor-parallel-size 1)."""
    allow_tp_across_nodes: bool = False
    """Allow TP groups larger than a node (slow inter-node TP all-reduces)."""
    memory_headroom: float = DEFAULT_HEADROOM
    """Fraction of HBM kept free when checking that a plan fits (costmodel.memory.per_gpu.fits_in_memory)."""
    plan_settings: tuple[tuple[str, Any], ...] = ()
    """Memory features every candidate plan takes, as (ParallelPlan field, value) pairs
    (costmodel.core.specs.memory_features.FEATURE_DEFAULTS: e.g. main_grads_dtype bf16, offload_modules): fixed for
    the search, as `planner predict` takes them; a candidate they do not apply to is invalid (e.g. offloading with
    recompute=full)."""
    offload_auto: bool = False
    """A candidate that does not fit in memory takes the first set of Megatron-Core fine-grained activation
    offloading (costmodel.core.specs.memory_features.OFFLOAD_STEPS) under which it fits, where it can take one
    (framework megatron, no full recomputation, nothing offloaded yet): ``--offload-modules auto``. Offloading leaves
    the numerics alone, so the search may choose it; its records name the set in ``plan_settings``."""
    description: str = ""
    """What the preset is for."""

    def size(self) -> int:
        """Cartesian size of the listed values (before any validity check)."""
        return math.prod(len(getattr(self, d)) for d in DIMS)

    def override(self, **dims) -> "SearchSpace":
        """A copy with the given dimensions replaced (``None`` values are ignored), validated."""
        changes = {k: v for k, v in dims.items() if v is not None}
        unknown = sorted(set(changes) - set(DIMS) - set(MOE_DIMS) - {"allow_tp_across_nodes", "memory_headroom",
                                                                     "plan_settings", "offload_auto"})
        if unknown:
            raise PlannerError(f"unknown search dimension(s) {', '.join(unknown)}; use {', '.join(DIMS + MOE_DIMS)}.")
        for k, v in changes.items():
            if k in DIMS or k in MOE_DIMS:
                changes[k] = _check_dim(k, v, "the command line")
        settings = changes.get("plan_settings")
        if settings is not None:
            settings = dict(settings)
            problems = value_problems(settings)
            if problems:
                raise PlannerError(f"{problems[0]}.")
            changes["plan_settings"] = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                    for k, v in settings.items() if v != FEATURE_DEFAULTS[k]))
        h = changes.get("memory_headroom")
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1):
            raise PlannerError(f"--headroom must be a fraction in [0, 1) (e.g. 0.05), got {h!r}.")
        return dataclasses.replace(self, **changes)


def _check_dim(dim: str, values, where: str) -> tuple:
    if isinstance(values, (str, int, bool)):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise PlannerError(f"{where}: {dim} must be a non-empty list of values.")
    out = []
    for v in values:
        ok = True
        if dim in INT_DIMS or dim in MOE_DIMS:
            ok = isinstance(v, int) and not isinstance(v, bool) and (v > 0 or (dim == "etp" and v == 0))
        elif dim == "zero":
            ok = isinstance(v, int) and not isinstance(v, bool) and v in (0, 1, 2, 3)
        elif dim == "recompute":
            ok = v in RECOMPUTE_MODES
        elif dim == "dtype":
            v = fp8_block.canonical(v) if isinstance(v, str) else v
            ok = v in DTYPES
        elif dim == "sequence_parallel":
            ok = isinstance(v, bool)
        elif dim == "framework":
            ok = v in FRAMEWORKS
        if not ok:
            allowed = {"zero": "0, 1, 2 or 3", "recompute": ", ".join(RECOMPUTE_MODES),
                       "dtype": ", ".join(DTYPES), "sequence_parallel": "true or false",
                       "framework": ", ".join(FRAMEWORKS), "etp": "positive integers or 0 (= TP)"}.get(
                           dim, "positive integers")
            raise PlannerError(f"{where}: {dim} value {v!r} is invalid; use {allowed}.")
        if v not in out:
            out.append(v)
    return tuple(out)


def spaces_dir() -> Path:
    """Folder of the shipped space presets (``search_spaces/search``)."""
    for base in search_spaces.__path__:
        if (Path(base) / "search" / "default.toml").is_file():
            return Path(base) / "search"
    raise PlannerError("the search-space presets (search_spaces/search/*.toml) are missing; reinstall planner.")


def space_names() -> list[str]:
    return sorted(p.stem for p in spaces_dir().glob("*.toml"))


def load_space(name_or_path: str = "default") -> SearchSpace:
    """A space preset by name (``default``, ``megatron``, ``fsdp``) or from a TOML file path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.is_file()):
        path = spaces_dir() / f"{name_or_path}.toml"
        if not path.is_file():
            raise PlannerError(f"unknown search space {name_or_path!r}; choose one of {', '.join(space_names())} "
                               "or give the path of a TOML file.")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise PlannerError(f"search space {path} is not valid TOML ({exc}); fix the syntax.") from None
    allowed = set(DIMS) | set(MOE_DIMS) | {"allow_tp_across_nodes", "memory_headroom", "description"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise PlannerError(f"search space {path}: unknown key(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(sorted(allowed))}.")
    kw: dict = {d: _check_dim(d, data[d], f"search space {path}") for d in DIMS + MOE_DIMS if d in data}
    if "allow_tp_across_nodes" in data:
        if not isinstance(data["allow_tp_across_nodes"], bool):
            raise PlannerError(f"search space {path}: allow_tp_across_nodes must be true or false.")
        kw["allow_tp_across_nodes"] = data["allow_tp_across_nodes"]
    if "memory_headroom" in data:
        h = data["memory_headroom"]
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1:
            raise PlannerError(f"search space {path}: memory_headroom must be a fraction in [0, 1).")
        kw["memory_headroom"] = float(h)
    kw["description"] = str(data.get("description", ""))
    return SearchSpace(name=path.stem, **kw)


# ------------------------------------------------------------------------------------- problem
@dataclass(frozen=True)
class Target:
    """One allocation the search may use: a GPU/node type and a GPU count."""

    hardware: Hardware
    """GPU and node type."""
    gpus: int
    """Total GPUs."""

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node as the plan sees it (a job smaller than a node uses part of one)."""
        return min(self.hardware.gpus_per_node, self.gpus)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def nvlink_domain(self) -> int:
        """GPUs per NVLink domain as the plan sees it (Hardware.domain_for: e.g. 64 for 128 GPUs of NVL72)."""
        return self.hardware.domain_for(self.gpus)

    def label(self) -> str:
        return f"{self.gpus} x {self.hardware.gpu.name}"


def make_target(hardware: Hardware, gpus: int) -> Target:
    """A target, checking that the GPU count fills whole nodes."""
    gpn = hardware.gpus_per_node
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise PlannerError(f"the GPU count must be a positive integer, got {gpus!r}.")
    if gpus > gpn and gpus % gpn != 0:
        raise PlannerError(f"{gpus} GPUs is not a multiple of {gpn} GPUs per node of {hardware.cluster.name} "
                           f"({hardware.gpu.name}); pass a multiple of {gpn} or use --nodes.")
    return Target(hardware, gpus)


@dataclass(frozen=True)
class SearchProblem:
    """Everything that defines one search: model, allocations, batch, space, budget and prices."""

    model: ModelSpec
    """The model to train."""
    targets: tuple[Target, ...]
    """Allocations to choose from (GPU type x GPU count); one categorical dimension when > 1."""
    space: SearchSpace
    """Candidate values per plan dimension."""
    gbs: int | None
    """Sequences per optimizer step when fixed (--gbs); None = each plan's own from ``batch`` (planner.batch:
    plans then compare by time per token, not per iteration)."""
    seq_len: int
    """Tokens per sequence."""
    tokens: float | None = None
    """Training token budget; time-to-train and cost-to-train are reported when given."""
    prices: dict = field(default_factory=dict)
    """GPU key -> USD per GPU-hour overrides (--price); others come from the catalogue."""
    notes: tuple[str, ...] = ()
    """What build_problem changed in the space and why (e.g. fp8 dropped on a GPU without fp8)."""
    calibration: object = None
    """Calibration every prediction of the search applies (planner.calibrate.Calibration, as `planner predict`
    applies it); None = uncalibrated."""
    batch: BatchRange | None = None
    """Batch range in tokens each plan's GBS is taken from (planner.batch.batch_steps) when gbs is
    None."""
    failures: object = None
    """costmodel.schedule.goodput.FailureModel of time and cost to train (None: a perfect run, goodput not reported)."""

    def gbs_for(self, unit: int) -> int:
        """GBS of a plan whose MBS x DP is ``unit``: the fixed one, else from the batch range (0: the range holds no
        multiple of ``unit``, the batch caps DP)."""
        fixed = self.gbs
        return fixed if fixed is not None else unit * batch_steps(self.seq_len, unit, self.batch)

    def batch_text(self) -> str:
        """The batch as titles state it, e.g. 'GBS 512 (4.19M tokens)' or 'batch 4.19M-16.8M tokens, GBS per plan'."""
        fixed = self.gbs
        return f"GBS {fixed} ({tokens_text(fixed * self.seq_len)} tokens)" if fixed is not None else \
            f"batch {self.batch.text()} tokens, GBS per plan"

    def batch_note(self) -> str | None:
        """Where the batch range came from and how a plan's GBS is rounded (None for a fixed GBS)."""
        return None if self.batch is None else f"batch {self.batch.text()} tokens: {self.batch.source}; {ROUNDING}"

    def fits(self, plan: ParallelPlan, gpu: GPUSpec) -> bool:
        """``plan`` fits in ``gpu``'s memory with the space's headroom (costmodel.memory.per_gpu.fits_in_memory)."""
        return fits_in_memory(memory_per_gpu(self.model, plan, gpu), gpu, self.space.memory_headroom)

    def price(self, hardware: Hardware) -> float | None:
        """USD per GPU-hour of a GPU: --price override, else the catalogue's (None = unknown)."""
        return self.prices.get(hardware.gpu.name, hardware.price_usd_per_gpu_hour)

    def describe(self) -> dict:
        """JSON-ready identity of the problem (stored with an Optuna study to detect mismatches)."""
        sp = dataclasses.asdict(self.space)
        sp.pop("description", None)
        sp.pop("name", None)
        for key in ("plan_settings", "offload_auto"):  # no memory features: the identity of studies stored before
            if not sp[key]:
                sp.pop(key)
        if not self.model.is_moe:  # dense: no expert dimensions (the identity of studies stored before them)
            sp.pop("ep"), sp.pop("etp")
        return {"model": self.model.name, "targets": [[t.hardware.gpu.name, t.hardware.cluster.name,
                                                        t.gpus_per_node, t.gpus] for t in self.targets],
                "gbs": self.gbs if self.gbs is not None else self.batch.to_dict(),
                "seq_len": self.seq_len,
                "space": {k: list(v) if isinstance(v, tuple) else v for k, v in sp.items()}}


def build_problem(model: ModelSpec, targets: list[Target], space: SearchSpace, *, gbs: int | None = None,
                  seq_len: int | None = None, tokens: float | None = None, prices: dict | None = None,
                  tokens_per_batch: int | BatchRange | None = None, calibration: object = None,
                  failures: object = None) -> SearchProblem:
    """Validate and assemble a :class:`SearchProblem` (defaults: the model's default sequence length
    (costmodel.core.specs.presets.default_seq_len); the batch: ``gbs`` sequences,
    else ``tokens_per_batch`` tokens (a number or a planner.batch.BatchRange), else the default range
    planner.batch.default_batch_range; ``failures``: the goodput model of time and cost to train)."""
    if not targets:
        raise PlannerError("no GPU type given; pass --gpu (see `planner gpus`).")
    seq = seq_len or default_seq_len(model)[0]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
        raise PlannerError(f"--seq-len must be a positive integer, got {seq!r}.")
    if gbs is not None and tokens_per_batch is not None:
        raise PlannerError("--gbs and --tokens-per-batch both give the batch; pass only one.")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        raise PlannerError(f"--tokens must be a positive number, got {tokens!r}.")
    if gbs is not None and (isinstance(gbs, bool) or not isinstance(gbs, int) or gbs <= 0):
        raise PlannerError(f"--gbs must be a positive integer, got {gbs!r}.")
    batch = batch_range(model, seq, tokens, tokens_per_batch) if gbs is None else None
    notes: tuple[str, ...] = ()
    for dtype in LIMITED_DTYPES:
        space, more = _dtype_space(space, targets, dtype)
        notes += more
    if note := settings_note(space, model.is_moe):
        notes += (note,)
    if seq_len is None:  # the default length is a choice: say which and why (planner.advice.seq_len_note)
        notes += (f"seq {seq} is the default for {model.name}: {default_seq_len(model)[1]}; pass --seq-len to "
                  "search at another length",)
    out = SearchProblem(model, tuple(targets), space, gbs, seq, tokens, dict(prices or {}), notes, calibration,
                        batch, failures)
    return out if batch is None else dataclasses.replace(out, notes=notes + (out.batch_note(),))


def settings_note(space: SearchSpace, moe: bool = False) -> str:
    """The note that says which memory features every plan of a search takes, and whether a plan that does not fit
    may offload activations, with the sets tried for a mixture-of-experts model when ``moe`` ("" when neither)."""
    parts = []
    if space.plan_settings:
        text = ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in space.plan_settings)
        parts.append(f"every plan takes {text} (as `planner predict` flags of the same names); a plan they do not "
                     "apply to is invalid (costmodel.core.specs.memory_features)")
    if space.offload_auto:
        parts.append("--offload-modules auto: a Megatron plan that does not fit takes the first of "
                     + "; ".join(",".join(m) for m in offload_steps(moe))
                     + " under which it fits (its plan_settings name it)")
    return "; ".join(parts)


def _refuse_fp8(names: str, first: str) -> None:
    raise PlannerError(f"--dtype fp8: {names} has no fp8 tensor cores (no fp8 peak in the catalogue); use "
                       "--dtype bf16, or a GPU with fp8 (see `planner gpus`).")


LIMITED_DTYPES: dict = {
    "fp8": (lambda gpu: gpu.has_fp8, "no fp8 tensor cores", _refuse_fp8),
    fp8_block.DTYPE: (fp8_block.supported, "no block-scaled FP8 measurements",
                      lambda names, first: fp8_block.check_gpu(first)),
}
"""Precisions only some GPUs run -> (supported(GPUSpec), what a GPU without it lacks, refusal(names, first GPU)
when it is all that was asked): fp8 needs fp8 tensor cores (an fp8 peak in the catalogue), fp8-block also the
block-scaled FP8 GEMM measurements of costmodel.cost.fp8_block. The search and its evaluator (planner.search.objective)
both read it."""


def _dtype_space(space: SearchSpace, targets: list[Target], dtype: str) -> tuple[SearchSpace, tuple[str, ...]]:
    """``dtype`` (a key of :data:`LIMITED_DTYPES`) only where the GPU supports it: skipped per target when some
    target does, refused when none does and it is all that was asked, else dropped from the space with a note."""
    supported, lacks, refuse = LIMITED_DTYPES[dtype]
    if dtype not in space.dtype:
        return space, ()
    without = list(dict.fromkeys(t.hardware.gpu.name for t in targets if not supported(t.hardware.gpu)))
    if not without:
        return space, ()
    names = ", ".join(without)
    if len(without) < len({t.hardware.gpu.name for t in targets}):
        return space, (f"{dtype} plans are skipped on {names} ({lacks})",)
    if set(space.dtype) == {dtype}:
        refuse(names, without[0])
    kept = tuple(d for d in space.dtype if d != dtype)
    return dataclasses.replace(space, dtype=kept), (f"{dtype} dropped from --dtype: {names} has {lacks}; "
                                                    f"searching {', '.join(kept)}",)


# -------------------------------------------------------------------------------- enumeration
class Candidate(NamedTuple):
    """One point of the space: a target index plus every plan dimension."""

    target: int
    tp: int
    pp: int
    cp: int
    vpp: int
    mbs: int
    recompute: str
    sequence_parallel: bool
    zero: int
    dtype: str
    framework: str = DEFAULT_FRAMEWORK
    ep: int = 1
    """Expert-parallel degree (1 for dense models)."""
    etp: int = 0
    """Expert tensor-parallel degree; 0 = TP."""

    def canonical(self) -> "Candidate":
        """The same plan with no-op settings normalised (VPP without PP, SP without TP, ETP equal to TP)."""
        c = self
        if c.etp == c.tp:
            c = c._replace(etp=0)
        if c.pp == 1 and c.vpp != 1:
            c = c._replace(vpp=1)
        if c.tp == 1 and c.sequence_parallel:
            c = c._replace(sequence_parallel=False)
        return c


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    """Heads, KV heads and FFN width split over TP (the model part of ParallelPlan.problems)."""
    return (model.num_heads % tp == 0 and (model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0)
            and model.ffn_hidden_size % tp == 0)


def _vpp_ok(model: ModelSpec, pp: int, vpp: int) -> bool:
    """VPP chunks per stage that a (possibly uneven) Megatron split of the layers over PP stages allows."""
    return uneven_split_problem(model.num_layers, pp, vpp) is None


def factorizations(model: ModelSpec, target: Target, space: SearchSpace) -> list[tuple[int, int, int]]:
    """Valid (TP, PP, CP) degrees for one target: TP*PP*CP divides the GPU count, TP splits the heads
    and stays within a node (unless allowed), PP is at most the layer count (a PP that does not divide the
    layers gets an uneven Megatron split, chosen when the plan is predicted)."""
    world, gpn = target.gpus, target.nvlink_domain   # TP stays within the NVLink domain
    out = []
    for tp, pp, cp in itertools.product(space.tp, space.pp, space.cp):
        mp = tp * pp * cp
        if world % mp or not _tp_ok(model, tp) or pp > model.num_layers:
            continue
        if tp > gpn and not space.allow_tp_across_nodes:
            continue
        out.append((tp, pp, cp))
    return out


def factorization_problem(model: ModelSpec, target: Target, space: SearchSpace) -> str:
    """Why no (TP, PP, CP) of the space is valid for a target: each rule with the degrees it rules out."""
    world, gpn = target.gpus, target.nvlink_domain
    rules = {"TP*PP*CP must divide the GPU count": [], f"TP must split the {model.num_heads} heads, "
             f"{model.num_kv_heads} KV heads and FFN width": [],
             f"TP must stay within an NVLink domain of {gpn} GPUs (--allow-tp-across-nodes)": [],
             f"PP must be at most the {model.num_layers} layers": []}
    names = list(rules)
    for tp, pp, cp in itertools.product(space.tp, space.pp, space.cp):
        for name, bad in zip(names, (world % (tp * pp * cp) != 0, not _tp_ok(model, tp),
                                     tp > gpn and not space.allow_tp_across_nodes, pp > model.num_layers)):
            if bad:
                rules[name].append(f"{tp}x{pp}x{cp}")
    broken = [f"{name} (rules out TPxPPxCP {', '.join(v[:4])}{' ...' if len(v) > 4 else ''})"
              for name, v in rules.items() if v]
    return f"no valid factorization of {world} GPUs: " + "; ".join(broken)


def moe_choices(model: ModelSpec, space: SearchSpace, world: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(EP degrees, ETP choices) searched for ``model``: (1,), (0,) for a dense model; for an MoE model the
    space's EP degrees (default: every divisor of the experts up to ``world`` GPUs when given) that divide the
    experts (Megatron-LM arguments.py: "num_experts must be divisible by expert_model_parallel_size"), and its
    ETP choices (0 = TP)."""
    if not model.is_moe:
        return (1,), (0,)
    eps = space.ep or tuple(e for e in range(1, model.num_experts + 1)
                            if model.num_experts % e == 0 and (not world or e <= world))
    return tuple(e for e in eps if model.num_experts % e == 0), space.etp


def _expert_grid_ok(model: ModelSpec, world: int, tp: int, pp: int, seqp: bool, ep: int, etp: int) -> bool:
    """The expert rules of ParallelPlan.problems (Megatron-Core): ETP x EP x PP divides the GPUs, ETP splits
    the expert FFN, EP > 1 with TP > 1 needs sequence parallelism."""
    etp = etp or tp
    return (world % (etp * ep * pp) == 0 and model.expert_ffn % etp == 0
            and not (ep > 1 and tp > 1 and not seqp))


def enumerate_candidates(problem: SearchProblem) -> Iterator[Candidate]:
    """Every canonical candidate of the space whose degrees are a valid factorization (the exhaustive
    search's loop). Batch divisibility and memory are checked when a candidate is evaluated."""
    sp = problem.space
    rest = list(itertools.product(sp.mbs, sp.recompute, sp.sequence_parallel, sp.zero, sp.dtype, sp.framework))
    model = problem.model
    for ti, target in enumerate(problem.targets):
        eps, etps = moe_choices(model, sp, target.gpus)
        for tp, pp, cp in factorizations(model, target, sp):
            vpps = [v for v in sp.vpp if v == 1 or (pp > 1 and _vpp_ok(model, pp, v))]
            experts = [(e, t) for e in eps for t in dict.fromkeys(0 if t in (0, tp) else t for t in etps)
                       if not model.is_moe or _expert_grid_ok(model, target.gpus, tp, pp, True, e, t)]
            for vpp in vpps:
                for mbs, rc, seqp, zero, dt, fw in rest:
                    if tp == 1 and seqp and False in sp.sequence_parallel:
                        continue  # SP is a no-op at TP=1: keep one of the two equal plans
                    for ep, etp in experts:
                        if ep > 1 and tp > 1 and not seqp:
                            continue  # Megatron: EP with TP needs sequence parallelism
                        yield Candidate(ti, tp, pp, cp, vpp, mbs, rc, seqp and tp > 1, zero, dt, fw, ep, etp)


def dimension_choices(problem: SearchProblem) -> dict[str, list]:
    """Fixed categorical choices per dimension for Optuna: TP, PP and CP values that occur in at least
    one valid factorization, the space's other dimensions as listed. VPP is conditional on PP: one
    dimension ``vpp@pp<P>`` per PP > 1 holding the chunk counts that divide that stage's layers (define-
    by-run, so PP = 1 trials spend nothing on VPP). Empty when no factorization is valid."""
    # (chunk counts: every stage must hold a multiple of VPP layers, costmodel.core.specs.plan)
    sp = problem.space
    facts = [(ti, f) for ti, t in enumerate(problem.targets) for f in factorizations(problem.model, t, sp)]
    if not facts:
        return {}
    used = {d: sorted({f[i] for _, f in facts}) for i, d in enumerate(("tp", "pp", "cp"))}
    out: dict[str, list] = {"target": sorted({ti for ti, _ in facts}), **used}
    for p in used["pp"]:
        if p > 1:
            out[f"vpp@pp{p}"] = sorted(v for v in sp.vpp if v == 1 or _vpp_ok(problem.model, p, v)) or [1]
    out.update({"mbs": sorted(sp.mbs), "recompute": [r for r in RECOMPUTE_MODES if r in sp.recompute],
                "sequence_parallel": list(sp.sequence_parallel), "zero": sorted(sp.zero), "dtype": list(sp.dtype),
                "framework": list(sp.framework)})
    if problem.model.is_moe:  # dense models: no EP/ETP dimension (the same Optuna parameters as before)
        world = max(t.gpus for t in problem.targets)
        eps, etps = moe_choices(problem.model, sp, world)
        out.update({"ep": sorted(eps) or [1], "etp": sorted(set(etps))})
    return out


def suggest_candidate(trial, choices: dict[str, list]) -> Candidate:
    """Draw one candidate with an Optuna trial: one categorical per dimension of ``choices`` (one-value
    dimensions are not suggested)."""
    def pick(name: str, ch: list):
        return trial.suggest_categorical(name, ch) if len(ch) > 1 else ch[0]

    tgt = pick("target", choices["target"])
    tp, pp, cp = (pick(d, choices[d]) for d in ("tp", "pp", "cp"))
    vpp = pick(f"vpp@pp{pp}", choices[f"vpp@pp{pp}"]) if pp > 1 else 1
    mbs, rc = pick("mbs", choices["mbs"]), pick("recompute", choices["recompute"])
    seqp = pick("sequence_parallel", choices["sequence_parallel"]) if tp > 1 else False
    c = Candidate(tgt, tp, pp, cp, vpp, mbs, rc, seqp, pick("zero", choices["zero"]),
                  pick("dtype", choices["dtype"]), pick("framework", choices["framework"]))
    if "ep" in choices:
        c = c._replace(ep=pick("ep", choices["ep"]), etp=pick("etp", choices["etp"]) if tp > 1 else 0)
    return c


def candidate_params(c: Candidate, choices: dict[str, list]) -> dict:
    """The trial parameters :func:`suggest_candidate` would have drawn for ``c`` (for enqueue_trial)."""
    out = {}

    def put(name: str, ch: list, value) -> None:
        if len(ch) > 1:
            out[name] = value

    put("target", choices["target"], c.target)
    for d in ("tp", "pp", "cp"):
        put(d, choices[d], getattr(c, d))
    if c.pp > 1:
        put(f"vpp@pp{c.pp}", choices[f"vpp@pp{c.pp}"], c.vpp)
    put("mbs", choices["mbs"], c.mbs)
    put("recompute", choices["recompute"], c.recompute)
    if c.tp > 1:
        put("sequence_parallel", choices["sequence_parallel"], c.sequence_parallel)
    put("zero", choices["zero"], c.zero)
    put("dtype", choices["dtype"], c.dtype)
    put("framework", choices["framework"], c.framework)
    if "ep" in choices:
        put("ep", choices["ep"], c.ep)
        if c.tp > 1:
            put("etp", choices["etp"], c.etp)
    return out


def candidate_from_params(params: dict, choices: dict[str, list]) -> Candidate:
    """Inverse of :func:`candidate_params` (the candidate a finished trial evaluated)."""
    import optuna  # deferred: Optuna takes about half a second to import

    return suggest_candidate(optuna.trial.FixedTrial(params), choices)


_MOVES = (("tp", 1, None, 0), ("tp", -1, None, 0), ("pp", 1, None, 0), ("pp", -1, None, 0), ("cp", 1, None, 0),
          ("cp", -1, None, 0), ("vpp", 1, None, 0), ("vpp", -1, None, 0), ("mbs", 1, None, 0), ("mbs", -1, None, 0),
          ("recompute", 1, None, 0), ("recompute", -1, None, 0), ("zero", 1, None, 0), ("zero", -1, None, 0),
          ("tp", 1, "pp", -1), ("tp", -1, "pp", 1), ("tp", 1, "cp", -1), ("tp", -1, "cp", 1), ("pp", 1, "cp", -1),
          ("pp", -1, "cp", 1), ("cp", 1, "mbs", -1), ("cp", -1, "mbs", 1), ("pp", 1, "vpp", -1), ("pp", -1, "vpp", 1))
"""Local moves for :func:`neighbours`: one ordered dimension one step up/down, or two at once in
opposite directions (trading TP for PP keeps the model-parallel size; CP for MBS keeps the tokens
per micro-batch)."""


def neighbours(c: Candidate, choices: dict[str, list]) -> list[Candidate]:
    """Candidates one local move away from ``c`` within the fixed choices (canonical, distinct)."""
    def vpp_choices(pp: int) -> list:
        return choices.get(f"vpp@pp{pp}", [1]) if pp > 1 else [1]

    def step(cand: Candidate, dim: str, delta: int) -> Candidate | None:
        ch = vpp_choices(cand.pp) if dim == "vpp" else choices[dim]
        value = getattr(cand, dim)
        if value not in ch:
            return None
        i = ch.index(value) + delta
        if not 0 <= i < len(ch):
            return None
        new = cand._replace(**{dim: ch[i]})
        if dim == "pp" and new.vpp not in vpp_choices(new.pp):
            new = new._replace(vpp=1)
        return new

    out: list[Candidate] = []
    seen = {c.canonical()}
    for d1, s1, d2, s2 in _MOVES:
        n = step(c, d1, s1)
        if n is not None and d2 is not None:
            n = step(n, d2, s2)
        if n is not None and n.canonical() not in seen:
            seen.add(n.canonical())
            out.append(n.canonical())
    if "ep" in choices:  # MoE: EP one step up/down
        for delta in (1, -1):
            n = step(c, "ep", delta)
            if n is not None and n.canonical() not in seen:
                seen.add(n.canonical())
                out.append(n.canonical())
    for dim in ("target", "sequence_parallel", "dtype", "framework") + (("etp",) if "etp" in choices else ()):
        for v in choices[dim]:
            n = c._replace(**{dim: v})
            if dim in ("sequence_parallel", "etp") and c.tp == 1:
                continue
            if n.canonical() not in seen:
                seen.add(n.canonical())
                out.append(n.canonical())
    return out


def offloaded_fit(problem: SearchProblem, plan: ParallelPlan, gpu: GPUSpec) -> ParallelPlan | None:
    """With ``--offload-modules auto`` (SearchSpace.offload_auto), ``plan`` with the first activation-offloading set
    (costmodel.core.specs.memory_features.offload_steps of the model) that the plan can take and under which it fits
    in ``gpu`` with the space's headroom (costmodel.memory.per_gpu.first_fitting), where it can take one at all
    (framework megatron, no full recomputation, nothing offloaded); None otherwise."""
    if not problem.space.offload_auto or plan.offload_modules or plan.framework != "megatron" \
            or plan.recompute == "full":
        return None
    return first_fitting(problem.model, (dataclasses.replace(plan, offload_modules=mods)
                                         for mods in offload_steps(problem.model.is_moe)),
                         gpu, problem.space.memory_headroom)


def candidate_plan(problem: SearchProblem, c: Candidate) -> ParallelPlan:
    """The ParallelPlan of a candidate (not validated). Its GBS is SearchProblem.gbs_for(MBS x DP); where the batch
    range holds no multiple of MBS x DP the plan gets one micro-batch per DP rank (and the evaluator refuses it)."""
    t, mp = problem.targets[c.target], c.tp * c.pp * c.cp
    unit = c.mbs * (t.gpus // mp if mp and t.gpus % mp == 0 else 1)
    # the MoE token dispatcher of the framework's recipes for the EP group's placement (costmodel.graph.moe)
    return with_default_dispatcher(ParallelPlan(
        gpus=t.gpus, gpus_per_node=t.gpus_per_node, gbs=problem.gbs_for(unit) or unit,
        seq_len=problem.seq_len, tp=c.tp, pp=c.pp, cp=c.cp, vpp=c.vpp, mbs=c.mbs, recompute=c.recompute,
        sequence_parallel=c.sequence_parallel, zero=c.zero, dtype=c.dtype, nvlink_domain=t.nvlink_domain,
        framework=c.framework, ep=c.ep, etp=c.etp or None, **dict(problem.space.plan_settings)))
