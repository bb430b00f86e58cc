"""`planner compare` (best plan per GPU type) and `planner size` (smallest / cheapest allocation
that trains a token budget before a deadline). Both run the exhaustive search per allocation."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.cost.base import OperatorCostModel
from planner.search.engine import SearchResult, exhaustive_search, no_fit_message
from planner.search.records import PlanRecord
from planner.search.space import SearchSpace, build_problem, make_target

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
    s = str(text).strip().lower().replace("_", "")
    mult = 1.0
    if s and s[-1] in _SUFFIX:
        s, mult = s[:-1], _SUFFIX[s[-1]]
    try:
        v = float(s) * mult
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
            cost_model: OperatorCostModel | None = None, tokens_per_batch: int | None = None) -> list[CompareRow]:
    """Best plan per GPU type on ``gpus`` GPUs (or ``nodes`` nodes of each type), by iteration time."""
    rows = []
    for hw in hardwares:
        world = gpus if gpus is not None else nodes * hw.gpus_per_node
        problem = build_problem(model, [make_target(hw, world)], space, gbs=gbs, seq_len=seq_len, tokens=tokens,
                                prices=prices, tokens_per_batch=tokens_per_batch)
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


def size(model: ModelSpec, tokens: float, deadline_s: float, hardwares: list[Hardware], space: SearchSpace, *,
         max_gpus: int = 16384, budget_usd: float | None = None, gbs: int | None = None,
         seq_len: int | None = None, prices: dict | None = None,
         cost_model: OperatorCostModel | None = None, tokens_per_batch: int | None = None) -> SizingResult:
    """Smallest allocation (and cheapest, if different) that trains ``tokens`` within ``deadline_s``.

    Per GPU type, node counts 2^k and 3 x 2^k are searched by bisection (assuming more nodes never
    train slower), each with the exhaustive search; the cheapest is looked for among each type's
    smallest meeting allocation and the next two sizes up.
    """
    searched = [0]
    cache: dict = {}

    def best_at(hw: Hardware, n_nodes: int) -> PlanRecord | None:
        key = (hw.gpu.name, hw.cluster.name, n_nodes)
        if key not in cache:
            problem = build_problem(model, [make_target(hw, n_nodes * hw.gpus_per_node)], space, gbs=gbs,
                                    seq_len=seq_len, tokens=tokens, prices=prices, tokens_per_batch=tokens_per_batch)
            cache[key] = exhaustive_search(problem, "time", cost_model).best
            searched[0] += 1
        return cache[key]

    def meets(rec: PlanRecord | None) -> bool:
        return rec is not None and rec.time_to_train_s <= deadline_s

    per_gpu, candidates, fastest = [], [], []
    for hw in hardwares:
        counts = [n for n in node_counts(max(1, max_gpus // hw.gpus_per_node))]
        if not counts or counts[-1] * hw.gpus_per_node > max_gpus:
            continue
        top = best_at(hw, counts[-1])
        if top is not None:
            fastest.append(top)
        if not meets(top):
            continue
        lo, hi = 0, len(counts) - 1  # counts[hi] meets the deadline
        while lo < hi:
            mid = (lo + hi) // 2
            if meets(best_at(hw, counts[mid])):
                hi = mid
            else:
                lo = mid + 1
        alloc = _allocation(best_at(hw, counts[hi]))
        per_gpu.append(alloc)
        candidates.append(alloc)
        for j in (hi + 1, hi + 2):
            if j < len(counts):
                rec = best_at(hw, counts[j])
                if meets(rec):
                    candidates.append(_allocation(rec))
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
    return SizingResult(smallest, cheapest, per_gpu, searched[0])
