"""`planner compare` (best plan per GPU type) and `planner size` (smallest / cheapest allocation
that trains a token budget before a deadline). Both run the exhaustive search per allocation."""

from __future__ import annotations

import multiprocessing as mp
import re
from dataclasses import dataclass, field

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.cost.base import OperatorCostModel
from costmodel.estimate import default_cost_model
from costmodel.flops import model_flops_per_iteration
from planner.requests import suffixed_number
from planner.search.engine import SearchResult, exhaustive_search
from planner.search.nofit import no_fit_message
from planner.search.records import PlanRecord
from planner.search.space import SearchSpace, build_problem, make_target
from planner.search.study import ignore_sigint

_UNITS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_deadline(text: str) -> float:
    """Seconds from '30d', '72h', '3w' or '1.5d'."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([hdw])\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise PlannerError(f"--deadline {text!r} is not a positive duration; write e.g. 72h, 30d or 3w.")
    return float(m.group(1)) * _UNITS[m.group(2)]


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """Token count from '1e12', '2T', '300B', '2000000000000'."""
    try:
        v = suffixed_number(text, _SUFFIX)
    except ValueError:
        raise PlannerError(f"--tokens {text!r} is not a number; write e.g. 1e12, 2T or 300B.") from None
    if not v > 0 or v == float("inf"):
        raise PlannerError(f"--tokens {text!r} must be a positive number of tokens.")
    return v


def parse_prices(items: list[str], known: list[str]) -> dict[str, float]:
    """{gpu: USD per GPU-hour} from ['gh200=2.1', ...]."""
    out = {}
    for item in items:
        gpu, sep, value = str(item).partition("=")
        gpu = gpu.strip().lower().replace("_", "-")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not sep or not gpu or not price > 0 or price == float("inf"):
            raise PlannerError(f"--price {item!r} is malformed; write GPU=USD_PER_GPU_HOUR, e.g. gh200=2.1.")
        if gpu not in known:
            raise PlannerError(f"--price {item!r} names an unknown GPU {gpu!r}; choose one of: {', '.join(known)}.")
        out[gpu] = price
    return out


# ------------------------------------------------------------------------------------ compare
@dataclass
class CompareRow:
    """Best plan of one GPU type in a comparison."""

    gpu: str
    """GPU key."""
    hardware: Hardware
    """GPU and node type."""
    result: SearchResult
    """The exhaustive search on this GPU type."""
    best: PlanRecord | None
    """Fastest feasible plan (None = nothing fits)."""
    message: str = ""
    """Why nothing fits, when best is None."""

    def to_dict(self) -> dict:
        g = self.hardware.gpu
        return {"gpu": self.gpu, "cluster": self.hardware.cluster.name,
                "price_date": g.price_date, "price_source": g.price_source,
                "best": self.best.to_dict() if self.best else None, "message": self.message,
                "search": self.result.summary()}


def compare(model: ModelSpec, hardwares: list[Hardware], space: SearchSpace, *, gpus: int | None = None,
            nodes: int | None = None, gbs: int | None = None, seq_len: int | None = None,
            tokens: float | None = None, prices: dict | None = None,
            cost_model: OperatorCostModel | None = None, tokens_per_batch: int | None = None,
            calibration: object = None) -> list[CompareRow]:
    """Best plan per GPU type on ``gpus`` GPUs (or ``nodes`` nodes of each type), by iteration time, predicted
    with ``calibration`` (planner.calibrate.Calibration; None = uncalibrated)."""
    rows = []
    for hw in hardwares:
        world = gpus if gpus is not None else nodes * hw.gpus_per_node
        problem = build_problem(model, [make_target(hw, world)], space, gbs=gbs, seq_len=seq_len, tokens=tokens,
                                prices=prices, tokens_per_batch=tokens_per_batch, calibration=calibration)
        res = exhaustive_search(problem, "time", cost_model)
        msg = "" if res.best else no_fit_message(res, gbs is not None)
        rows.append(CompareRow(hw.gpu.name, hw, res, res.best, msg))
    return rows


# --------------------------------------------------------------------------------------- size
@dataclass
class Allocation:
    """One allocation that meets the deadline."""

    record: PlanRecord
    """Best plan on it (time_to_train_s and cost_to_train_usd are set)."""
    gpu_hours: float
    node_hours: float
    cost_usd: float | None

    def to_dict(self) -> dict:
        return {"gpu": self.record.gpu, "nodes": self.record.nodes, "gpus_per_node": self.record.gpus_per_node,
                "gpus": self.record.gpus, "time_to_train_s": self.record.time_to_train_s,
                "gpu_hours": self.gpu_hours, "node_hours": self.node_hours, "cost_usd": self.cost_usd,
                "plan": self.record.to_dict()}


@dataclass
class SizingResult:
    """Answer of `planner size`."""

    smallest: Allocation
    """Fewest GPUs that meet the deadline (ties: cheaper)."""
    cheapest: Allocation | None
    """Lowest cost that meets the deadline (None when no price is known)."""
    per_gpu: list[Allocation] = field(default_factory=list)
    """Smallest allocation per GPU type that meets the deadline."""
    searched: int = 0
    """Allocations searched."""

    def to_dict(self) -> dict:
        return {"smallest": self.smallest.to_dict(), "cheapest": self.cheapest.to_dict() if self.cheapest else None,
                "per_gpu": [a.to_dict() for a in self.per_gpu], "allocations_searched": self.searched}


def node_counts(max_nodes: int) -> list[int]:
    """Allocation sizes tried: 1, 2, 3, 4, 6, 8, 12, 16, ... (2^k and 3 x 2^k nodes) up to max_nodes."""
    out, k = set(), 1
    while k <= max_nodes:
        out.add(k)
        if 3 * k // 2 <= max_nodes and k >= 2:
            out.add(3 * k // 2)
        k *= 2
    return sorted(out)


def _allocation(rec: PlanRecord) -> Allocation:
    hours = rec.time_to_train_s / 3600.0
    return Allocation(rec, hours * rec.gpus, hours * rec.nodes, rec.cost_to_train_usd)


START_MFU = 0.5
"""`planner size` starts each GPU type's search at the allocation a plan would need at this model FLOPs
utilisation, then steps through the node counts down (while the deadline is met) or up (until it is). Large
dense runs publish 38-43 % (Llama 3 405B on 16,384 H100: Dubey et al. 2024, Table 4), so the start is at or
just below the answer and two or three allocations are searched per GPU type instead of a bisection from
the largest allocation."""


def _start_gpus(model: ModelSpec, tokens: float, deadline_s: float, hw: Hardware, space: SearchSpace) -> float:
    """GPUs needed at START_MFU of the fastest peak of the space's dtypes (6 N D-style model FLOPs)."""
    flops = model_flops_per_iteration(model, 1, model.max_seq_len) / model.max_seq_len * tokens
    peak = max(hw.gpu.peak_flops(d) for d in space.dtype)
    return flops / (START_MFU * peak * deadline_s)


def _size_one(model: ModelSpec, tokens: float, deadline_s: float, hw: Hardware, space: SearchSpace, max_gpus: int,
              problem_at, cost_model) -> tuple[list[Allocation], PlanRecord | None, Allocation | None, int]:
    """One GPU type: (meeting allocations for the cheapest: the smallest and the next size up, and the one after
    while the cost still falls; the fastest plan seen, the smallest meeting allocation or None, allocations
    searched)."""
    counts = node_counts(max(1, max_gpus // hw.gpus_per_node))
    if not counts or counts[-1] * hw.gpus_per_node > max_gpus:
        return [], None, None, 0
    cache: dict[int, PlanRecord | None] = {}

    def best(i: int) -> PlanRecord | None:
        if i not in cache:
            cache[i] = exhaustive_search(problem_at(hw, counts[i]), "time", cost_model, detail=1).best
        return cache[i]

    def meets(i: int) -> bool:
        rec = best(i)
        return rec is not None and rec.time_to_train_s <= deadline_s

    start = _start_gpus(model, tokens, deadline_s, hw, space) / hw.gpus_per_node
    i = next((k for k, n in enumerate(counts) if n >= start), len(counts) - 1)
    if meets(i):  # more nodes never train slower (assumed, as the bisection did): step down while it holds
        while i > 0 and meets(i - 1):
            i -= 1
    else:
        while i < len(counts) - 1 and not meets(i):
            i += 1
        if not meets(i):
            seen = [r for r in cache.values() if r is not None]
            return [], min(seen, key=lambda r: r.time_to_train_s) if seen else None, None, len(cache)
    smallest = _allocation(best(i))
    found = [smallest]
    for j in (i + 1, i + 2):  # larger allocations, while each is cheaper than the one before (cost falling)
        if j >= len(counts) or not meets(j):
            break
        found.append(_allocation(best(j)))
        if found[-1].cost_usd is None or found[-2].cost_usd is None or found[-1].cost_usd >= found[-2].cost_usd:
            break
    return found, best(i), smallest, len(cache)


_FORK_SIZE: tuple | None = None
"""Arguments of :func:`_size_one` per GPU type, handed to forked workers of :func:`size`."""


def _size_forked(k: int):
    args = _FORK_SIZE[k]
    return _size_one(*args)


def size(model: ModelSpec, tokens: float, deadline_s: float, hardwares: list[Hardware], space: SearchSpace, *,
         max_gpus: int = 16384, budget_usd: float | None = None, gbs: int | None = None,
         seq_len: int | None = None, prices: dict | None = None,
         cost_model: OperatorCostModel | None = None, tokens_per_batch: int | None = None,
         jobs: int = 1, calibration: object = None) -> SizingResult:
    """Smallest allocation (and cheapest, if different) that trains ``tokens`` within ``deadline_s``.

    Per GPU type, node counts 2^k and 3 x 2^k are searched from the count a START_MFU plan would need, down
    while the deadline is met or up until it is (assuming more nodes never train slower), each with the
    exhaustive search; the cheapest is looked for among each type's smallest meeting allocation and the
    next size up, and the one after that when the next was cheaper still. ``jobs`` > 1 searches that many
    GPU types at once in forked processes.
    """
    global _FORK_SIZE

    def problem_at(hw: Hardware, n_nodes: int):
        return build_problem(model, [make_target(hw, n_nodes * hw.gpus_per_node)], space, gbs=gbs, seq_len=seq_len,
                             tokens=tokens, prices=prices, tokens_per_batch=tokens_per_batch, calibration=calibration)

    if cost_model is None:
        cost_model = default_cost_model()
    args = [(model, tokens, deadline_s, hw, space, max_gpus, problem_at, cost_model) for hw in hardwares]
    outs = None
    if jobs > 1 and len(args) > 1 and "fork" in mp.get_all_start_methods():
        _FORK_SIZE = tuple(args)
        try:
            with mp.get_context("fork").Pool(min(jobs, len(args)), initializer=ignore_sigint) as pool:
                outs = pool.map(_size_forked, range(len(args)))
        finally:
            _FORK_SIZE = None
    if outs is None:
        outs = [_size_one(*a) for a in args]
    per_gpu = [o[2] for o in outs if o[2] is not None]
    candidates = [a for o in outs for a in o[0]]
    fastest = [o[1] for o in outs if o[1] is not None]
    searched = sum(o[3] for o in outs)
    if not per_gpu:
        days = deadline_s / 86400.0
        if not fastest:
            raise PlannerError(f"{model.name} fits on none of the GPU types given with up to {max_gpus} GPUs; "
                               "raise --max-gpus or add recompute/ZeRO options to the space.")
        f = min(fastest, key=lambda r: r.time_to_train_s)
        raise PlannerError(f"no allocation of up to {max_gpus} GPUs trains {tokens:.3g} tokens of {model.name} in "
                           f"{days:.3g} days; the fastest ({f.gpus} x {f.gpu}) needs "
                           f"{f.time_to_train_s / 86400.0:.1f} days - extend --deadline or raise --max-gpus.")
    if budget_usd is not None:
        within = [a for a in candidates if a.cost_usd is not None and a.cost_usd <= budget_usd]
        if not within:
            priced = [a.cost_usd for a in candidates if a.cost_usd is not None]
            cheapest = f"; the cheapest meeting the deadline costs ${min(priced):,.0f}" if priced else \
                " (no price known for these GPUs; pass --price)"
            raise PlannerError(f"no allocation meets the deadline within --budget ${budget_usd:,.0f}{cheapest}.")
        candidates = within
        per_gpu = [a for a in per_gpu if a in within] or within
    smallest = min(candidates, key=lambda a: (a.record.gpus, a.cost_usd if a.cost_usd is not None else float("inf")))
    priced = [a for a in candidates if a.cost_usd is not None]
    cheapest = min(priced, key=lambda a: (a.cost_usd, a.record.gpus)) if priced else None
    return SizingResult(smallest, cheapest, per_gpu, searched)
