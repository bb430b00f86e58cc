"""`planner compare` (best plan per GPU type) and `planner size` (smallest / cheapest allocation that trains a
token budget before a deadline, planner.search.allocation per GPU type). Both cost time and cost to train with
the goodput model (costmodel.schedule.goodput) when given one, and take each plan's batch from a range
(planner.batch)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import queue as queue_mod
import re
import time
from dataclasses import dataclass, field, replace

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.presets import default_seq_len
from costmodel.cost.base import OperatorCostModel
from planner.batch import ROUNDING, BatchRange, tokens_text
from planner.prediction import KernelRate, gpu_scale_note, kernel_rate
from planner.requests import suffixed_number
from planner.search.allocation import Point, TypeSizer, TypeSizing, best_plan_search, start_nodes, time_key
from planner.search.engine import SearchResult, exhaustive_search
from planner.search.nofit import no_fit_message
from planner.search.objective import Evaluator
from planner.search.records import PlanRecord
from planner.search.space import SearchProblem, SearchSpace, build_problem, make_target, settings_note
from planner.search.study import InterruptFlag, ignore_sigint

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
    kernel_rate: KernelRate | None = None
    """The best plan costed without a calibration constant that measured node types of this GPU do not need
    (planner.prediction.kernel_rate; e.g. the GH200 on TACC Vista's nodes); None when none acts on it."""

    def to_dict(self) -> dict:
        g = self.hardware.gpu
        return {"gpu": self.gpu, "cluster": self.hardware.cluster.name,
                "price_date": g.price_date, "price_source": g.price_source,
                "best": self.best.to_dict() if self.best else None, "message": self.message,
                "kernel_rate": self.kernel_rate.to_dict() if self.kernel_rate else None,
                "search": self.result.summary()}

    def kernel_rate_note(self) -> str | None:
        """The line `planner compare` prints for :attr:`kernel_rate` (None without one)."""
        if self.kernel_rate is None or self.best is None:
            return None
        return self.kernel_rate.note(self.gpu, self.hardware.cluster.name, self.best.iteration_time_s,
                                     self.best.mfu)


def compare(model: ModelSpec, hardwares: list[Hardware], space: SearchSpace, *, gpus: int | None = None,
            nodes: int | None = None, gbs: int | None = None, seq_len: int | None = None,
            tokens: float | None = None, prices: dict | None = None,
            cost_model: OperatorCostModel | None = None, tokens_per_batch=None,
            calibration: object = None, failures: object = None, jobs: int = 1, progress=None) -> list[CompareRow]:
    """Best plan per GPU type on ``gpus`` GPUs (or ``nodes`` nodes of each type), by time per token, predicted
    with ``calibration`` (planner.calibrate.Calibration; None = uncalibrated); ``failures``
    (costmodel.schedule.goodput.FailureModel) makes time and cost to train expected values; ``jobs`` > 1 searches that
    many GPU types at once in forked processes (one type: splits its search's candidates over them);
    ``progress(done, total, predictions, '')`` is called as GPU types finish. Ctrl-C stops the search: the rows
    returned are those finished (fewer than ``hardwares``), in the order given."""
    global _FORK_COMPARE
    args = [(model, hw, space, gpus, nodes, gbs, seq_len, tokens, prices, cost_model, tokens_per_batch, calibration,
             failures, jobs if len(hardwares) == 1 else 1) for hw in hardwares]
    done: dict[int, CompareRow] = {}

    def tick() -> None:
        if progress is not None:
            progress(len(done), len(args), sum(r.result.counts.get("ok", 0) for r in done.values()), "")

    with InterruptFlag() as stop:
        if jobs > 1 and len(args) > 1 and "fork" in mp.get_all_start_methods():
            _FORK_COMPARE = tuple(args)
            pool = mp.get_context("fork").Pool(min(jobs, len(args)), initializer=ignore_sigint)
            try:
                for k, row in pool.imap_unordered(_compare_forked, range(len(args))):
                    done[k] = row
                    tick()
                    if stop.hit:
                        break
            finally:
                pool.terminate()
                pool.join()
                _FORK_COMPARE = None
        else:
            for k, a in enumerate(args):
                if stop.hit:
                    break
                done[k] = _compare_one(*a)
                tick()
    return [done[k] for k in sorted(done)]


_FORK_COMPARE: tuple | None = None
"""Arguments of :func:`_compare_one` per GPU type, handed to the forked workers of :func:`compare`."""


def _compare_forked(k: int) -> tuple[int, CompareRow]:
    return k, _compare_one(*_FORK_COMPARE[k])


def _compare_one(model, hw, space, gpus, nodes, gbs, seq_len, tokens, prices, cost_model, tokens_per_batch,
                 calibration, failures, jobs) -> CompareRow:
    """One GPU type of :func:`compare`."""
    world = gpus if gpus is not None else nodes * hw.gpus_per_node
    problem = build_problem(model, [make_target(hw, world)], space, gbs=gbs, seq_len=seq_len, tokens=tokens,
                            prices=prices, tokens_per_batch=tokens_per_batch, calibration=calibration,
                            failures=failures)
    res = exhaustive_search(problem, "time", cost_model, jobs=jobs)
    msg = "" if res.best else no_fit_message(res, gbs is not None)
    rate = (kernel_rate(model, res.best.to_plan(), problem.targets[0].hardware, calibration, cost_model)
            if res.best is not None else None)
    return CompareRow(hw.gpu.name, hw, res, res.best, msg, rate)


# --------------------------------------------------------------------------------------- size
@dataclass
class Allocation:
    """One allocation that meets the deadline, with its best plan found."""

    record: PlanRecord
    """Best plan on it (time_to_train_s and cost_to_train_usd are set: expected values with a goodput model)."""
    gpu_hours: float
    node_hours: float
    cost_usd: float | None
    exhaustive: bool = True
    """The plan is the best of the whole space on this allocation (else of the plan shapes tried)."""

    @classmethod
    def of(cls, point: Point) -> "Allocation":
        rec = point.record
        hours = rec.time_to_train_s / 3600.0
        return cls(rec, hours * rec.gpus, hours * rec.nodes, rec.cost_to_train_usd, point.exhaustive)

    def to_dict(self) -> dict:
        return {"gpu": self.record.gpu, "nodes": self.record.nodes, "gpus_per_node": self.record.gpus_per_node,
                "gpus": self.record.gpus, "time_to_train_s": self.record.time_to_train_s,
                "gpu_hours": self.gpu_hours, "node_hours": self.node_hours, "cost_usd": self.cost_usd,
                "exhaustive": self.exhaustive, "plan": self.record.to_dict()}


@dataclass
class SizingResult:
    """Answer of `planner size`."""

    smallest: Allocation | None
    """Fewest GPUs that meet the deadline over all GPU types (ties: cheaper)."""
    cheapest: Allocation | None
    """Lowest expected cost among the meeting allocations evaluated (None when no price is known)."""
    per_gpu: list[Allocation] = field(default_factory=list)
    """Smallest allocation per GPU type that meets the deadline."""
    types: list[TypeSizing] = field(default_factory=list)
    """Each GPU type's search: smallest, one node fewer, cheapest, frontier."""
    left_out: list[tuple[str, str]] = field(default_factory=list)
    """(GPU, why) for every GPU type without an answer."""
    notes: list[str] = field(default_factory=list)
    """What the answer depends on: batch, prices, goodput model, batch limits."""
    batch: object = None
    """planner.batch.BatchRange the plans took their GBS from (None with a fixed --gbs)."""
    failures: object = None
    """costmodel.schedule.goodput.FailureModel used (None: a perfect run)."""
    interrupted: bool = False
    """Ctrl-C stopped the search: the answer is the best found so far, not proved minimal."""

    @property
    def searched(self) -> int:
        """Allocations (node counts of a GPU type) evaluated over all GPU types."""
        return sum(max(t.evaluated, len(t.frontier)) for t in self.types)

    def to_dict(self) -> dict:
        return {"smallest": self.smallest.to_dict() if self.smallest else None,
                "cheapest": self.cheapest.to_dict() if self.cheapest else None,
                "per_gpu": [a.to_dict() for a in self.per_gpu], "types": [t.to_dict() for t in self.types],
                "left_out": [{"gpu": g, "why": w} for g, w in self.left_out], "notes": self.notes,
                "batch": self.batch.to_dict() if self.batch is not None else None,
                "failure_model": dataclasses.asdict(self.failures) if self.failures is not None else None,
                "allocations_searched": self.searched,
                "exhaustive_searches": sum(t.exhaustive_searches for t in self.types),
                "predictions": sum(t.predictions for t in self.types), "interrupted": self.interrupted}


@dataclass(frozen=True)
class SizeRequest:
    """Everything `planner size` needs besides the GPU types (shared by the per-type searches)."""

    model: ModelSpec
    tokens: float
    deadline_s: float
    space: SearchSpace
    min_gpus: int = 1
    max_gpus: int = 16384
    gbs: int | None = None
    seq_len: int | None = None
    prices: dict | None = None
    batch: object = None
    """planner.batch.BatchRange (None with gbs)."""
    calibration: object = None
    failures: object = None
    """costmodel.schedule.goodput.FailureModel (None: a perfect run)."""

    def problem_at(self, hw: Hardware, nodes: int) -> SearchProblem:
        return build_problem(self.model, [make_target(hw, nodes * hw.gpus_per_node)], self.space, gbs=self.gbs,
                             seq_len=self.seq_len, tokens=self.tokens, prices=self.prices,
                             tokens_per_batch=self.batch, calibration=self.calibration, failures=self.failures)

    def node_limits(self, hw: Hardware) -> tuple[int, int]:
        gpn = hw.gpus_per_node
        return max(1, -(-self.min_gpus // gpn)), self.max_gpus // gpn


def size_type(req: SizeRequest, hw: Hardware, cost_model, on_progress=None, on_found=None) -> TypeSizing:
    """The allocation search of one GPU type (planner.search.allocation)."""
    lo, hi = req.node_limits(hw)
    if hi < lo:
        return TypeSizing(hw.gpu.name, hw, None, None, None, min_nodes=lo, max_nodes=hi,
                          reason=f"no whole node of {hw.gpus_per_node} GPUs lies between --min-gpus {req.min_gpus} "
                                 f"and --max-gpus {req.max_gpus}")
    sizer = TypeSizer(hw, req.deadline_s, lambda n: req.problem_at(hw, n), cost_model, lo, hi, on_progress, on_found)
    out = sizer.run(start_nodes(req.model, req.tokens, req.deadline_s, hw, req.space, lo, hi))
    out.batch_note = batch_probe(req, sizer, out)
    return out


BATCH_GAIN = 0.05
"""`planner size` says the batch limits scaling when twice the batch trains the same allocation at least this much
faster per token (a reporting threshold, not a model constant)."""


def batch_probe(req: SizeRequest, sizer: TypeSizer, out: TypeSizing) -> str:
    """Whether the batch limits scaling on the answer's allocation (or the largest one, when none meets): the
    known plan shapes evaluated with the batch range's top doubled; when the deadline is missed, every plan of the
    space (a larger batch admits layouts with more DP) with the top x2, x4 and x8. Returns the sentence to print
    ('' when the batch does not limit)."""
    if req.batch is None:
        return ""
    point = out.smallest or out.fastest
    if point is None or point.record is None or point.record.time_to_train_s is None:
        return ""  # nothing trains there (no plan, or a goodput of 0)
    base = point.record
    for factor in (2, 4, 8):
        low = req.batch.min_tokens * (factor if req.batch.single else 1)
        bigger = BatchRange(low, req.batch.max_tokens * factor, req.batch.source)
        ev = Evaluator(replace(req, batch=bigger).problem_at(sizer.hw, point.nodes), sizer.cost_model, light=True)
        if out.smallest is None:
            recs = best_plan_search(ev)
        else:
            recs = [e.record for e in (ev.evaluate(s) for s in sizer.shapes) if e.record is not None]
        best = min(recs, key=time_key, default=None)
        if best is None or time_key(best) > base.time_to_train_s / (1.0 + BATCH_GAIN):
            return ""
        meets = best.time_to_train_s <= req.deadline_s
        if out.smallest is not None or meets or factor == 8:
            gain = base.time_to_train_s / best.time_to_train_s - 1.0
            why = _batch_limit_reason(base, req)
            flag = bigger.text().replace("-", ":")
            return (f"the batch limits scaling on {point.gpus} x {sizer.hw.gpu.name} ({why}): a batch of "
                    f"{'up to ' if not bigger.single else ''}{tokens_text(bigger.max_tokens)} tokens "
                    f"(--tokens-per-batch {flag}) trains it {100 * gain:.0f} % faster"
                    + (f", in {best.time_to_train_s / 86400.0:.1f} d" + (" (meets the deadline)" if meets else "")
                       if out.smallest is None else ""))
    return ""


def _batch_limit_reason(r: PlanRecord, req: SizeRequest) -> str:
    """'DP capped by the batch' or 'm micro-batches per pipeline of PP stages' for the plan the batch limits."""
    unit_tokens = r.mbs * r.dp * r.seq_len
    if r.gbs == r.mbs * r.dp and 2 * unit_tokens > req.batch.max_tokens:
        return f"DP {r.dp} is capped by the batch: one micro-batch per DP rank already fills it"
    if r.pp == 1:
        return f"{r.num_microbatches} accumulation steps per DP rank, GBS {r.gbs}"
    return f"{r.num_microbatches} micro-batches per pipeline of {r.pp} stages, GBS {r.gbs}"


class Stop(Exception):
    """Raised inside a per-type search when Ctrl-C asked to stop (the search keeps what it found)."""


_FORK: tuple | None = None
"""(request, hardwares, cost model, queue) handed to the forked workers of :func:`size`."""


def _size_forked(k: int) -> TypeSizing:
    req, hws, cost_model, q = _FORK
    hw = hws[k]

    def progress(sizer):
        q.put(("tick", k, sizer.predictions))

    def found(point):
        q.put(("found", k, point))

    return size_type(req, hw, cost_model, progress, found)


def size(model: ModelSpec, tokens: float, deadline_s: float, hardwares: list[Hardware], space: SearchSpace, *,
         max_gpus: int = 16384, min_gpus: int = 1, budget_usd: float | None = None, gbs: int | None = None,
         seq_len: int | None = None, prices: dict | None = None, cost_model: OperatorCostModel | None = None,
         tokens_per_batch=None, jobs: int = 1, calibration: object = None, failures: object = None,
         progress=None) -> SizingResult:
    """Smallest and cheapest allocation that trains ``tokens`` within ``deadline_s``, per GPU type and overall
    (planner.search.allocation: every node count from ``min_gpus`` to ``max_gpus``). ``tokens_per_batch``: a number
    or planner.batch.BatchRange (default: planner.batch.default_batch_range); ``failures``: the goodput model
    (costmodel.schedule.goodput.FailureModel; None = a perfect run); ``jobs`` > 1 sizes that many GPU types at once in
    forked processes; ``progress(done_types, total_types, predictions, best_text)`` is called as work goes on.
    Ctrl-C returns the best answer found so far (``interrupted`` set)."""
    from costmodel.estimate import default_cost_model  # deferred: loads the cost model
    from planner.batch import default_batch_range  # deferred: the cost model's FLOPs load with it

    if gbs is None and not isinstance(tokens_per_batch, BatchRange):
        tokens_per_batch = (default_batch_range(model, seq_len or default_seq_len(model)[0], tokens)
                            if tokens_per_batch is None else BatchRange(float(tokens_per_batch),
                                                                        float(tokens_per_batch)))
    req = SizeRequest(model, tokens, deadline_s, space, min_gpus, max_gpus, gbs, seq_len, prices,
                      None if gbs is not None else tokens_per_batch, calibration, failures)
    req.problem_at(hardwares[0], max(1, req.node_limits(hardwares[0])[0]))  # bad flags fail before any search
    cost_model = cost_model or default_cost_model()
    found: dict[int, Point] = {}
    with InterruptFlag() as stop:
        if jobs > 1 and len(hardwares) > 1 and "fork" in mp.get_all_start_methods():
            types = _size_parallel(req, hardwares, cost_model, jobs, found, stop, progress)
        else:
            types = _size_serial(req, hardwares, cost_model, found, stop, progress)
    return assemble(req, hardwares, types, found, budget_usd, interrupted=stop.hit)


def _size_serial(req: SizeRequest, hardwares: list[Hardware], cost_model, found: dict, stop,
                 progress) -> list[TypeSizing | None]:
    """Each GPU type in turn; Ctrl-C (``stop.hit``) ends the type being searched and skips the rest."""
    types: list[TypeSizing | None] = [None] * len(hardwares)
    for k, hw in enumerate(hardwares):
        def tick(sizer, k=k):
            if progress is not None:
                progress(k, len(hardwares), sizer.predictions, _best_text(found))
            if stop.hit:
                raise Stop

        def on_found(point, k=k):
            found[k] = point

        try:
            types[k] = size_type(req, hw, cost_model, tick, on_found)
        except Stop:
            break
    return types


def _size_parallel(req: SizeRequest, hardwares: list[Hardware], cost_model, jobs: int, found: dict, stop,
                   progress) -> list[TypeSizing | None]:
    """The GPU types in forked processes; their progress and every better allocation come back on a queue, so
    Ctrl-C (``stop.hit``) can end the pool and keep what was found."""
    global _FORK
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    _FORK = (req, hardwares, cost_model, q)
    types: list[TypeSizing | None] = [None] * len(hardwares)
    predictions = [0] * len(hardwares)
    pool = ctx.Pool(min(jobs, len(hardwares)), initializer=ignore_sigint)
    try:
        pending = {k: pool.apply_async(_size_forked, (k,)) for k in range(len(hardwares))}
        while pending and not stop.hit:
            _drain(q, found, predictions, 0.05)
            for k in [k for k, a in pending.items() if a.ready()]:
                types[k] = pending.pop(k).get()
            if progress is not None:
                progress(sum(t is not None for t in types), len(hardwares), sum(predictions), _best_text(found))
        _drain(q, found, predictions, 0.0)
    finally:
        pool.terminate()
        pool.join()
        _FORK = None
    return types


def _drain(q, found: dict, predictions: list, timeout: float) -> None:
    """Read the workers' messages: ('tick', type, predictions) and ('found', type, Point)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kind, k, value = q.get(timeout=max(0.0, deadline - time.monotonic())) if timeout else q.get_nowait()
        except (queue_mod.Empty, OSError, EOFError):
            return
        if kind == "found" and (k not in found or value.nodes <= found[k].nodes):
            found[k] = value
        elif kind == "tick":
            predictions[k] = value


def _best_text(found: dict) -> str:
    """'768 x h100-sxm' for the smallest meeting allocation found so far ('' when none)."""
    if not found:
        return ""
    p = min(found.values(), key=lambda p: p.gpus)
    return f"{p.gpus} x {p.record.gpu}"


def assemble(req: SizeRequest, hardwares: list[Hardware], types: list, found: dict, budget_usd: float | None,
             interrupted: bool = False) -> SizingResult:
    """The answer from the per-type searches: budget applied, every GPU type without an answer listed with why,
    the overall smallest and cheapest, and the notes the answer depends on."""
    done, left = [], []
    for k, hw in enumerate(hardwares):
        t = types[k]
        if t is None and k in found:  # interrupted while searching this type: the best found, not proved minimal
            t = TypeSizing(hw.gpu.name, hw, found[k], None, None, [found[k]], reason="")
        if t is None:
            left.append((hw.gpu.name, "not searched: interrupted"))
            continue
        done.append(t)
        why = _left_out_reason(t, req, budget_usd)
        if why:
            left.append((t.gpu, why))
    answers = [t for t in done if not any(g == t.gpu for g, _ in left)]
    per_gpu = [_within_budget(t, req.deadline_s, budget_usd) for t in answers]
    per_gpu = [a for a in per_gpu if a is not None]
    if not per_gpu:
        if interrupted:
            from costmodel.core.errors import Interrupted  # deferred: only an interrupted search needs it

            raise Interrupted("no allocation meeting the deadline was found before Ctrl-C")
        raise PlannerError(_no_answer_message(req, left))
    smallest = min(per_gpu, key=lambda a: (a.record.gpus, a.cost_usd if a.cost_usd is not None else float("inf")))
    priced = [Allocation.of(t.cheapest) for t in answers if t.cheapest is not None
              and (budget_usd is None or t.cheapest.cost_usd <= budget_usd)]
    cheapest = min(priced, key=lambda a: (a.cost_usd, a.record.gpus), default=None)
    notes = size_notes(req, done, hardwares, interrupted)
    return SizingResult(smallest, cheapest, per_gpu, done, left, notes, req.batch, req.failures, interrupted)


def _left_out_reason(t: TypeSizing, req: SizeRequest, budget_usd: float | None) -> str:
    """Why a GPU type has no answer ('' when it has one)."""
    if t.smallest is None:
        why = t.reason
        if t.fastest is not None and t.fastest.days is not None:
            why += f" ({t.fastest.gpus} GPUs need {t.fastest.days:.1f} d)"
        elif t.fastest is not None and t.fastest.record is not None and t.fastest.record.goodput == 0:
            why += (" (goodput 0: with this failure model the job is interrupted more often than it can restart "
                    "and save; see --restart-min, --ckpt-interval, --failure-rate)")
        return why + (f"; {t.batch_note}" if t.batch_note else "")
    if budget_usd is not None:
        if t.smallest.record.price_usd_per_gpu_hour is None:
            return f"no price: pass --price {t.gpu}=USD_PER_GPU_HOUR to check it against --budget"
        if t.cheapest is None or t.cheapest.cost_usd > budget_usd:
            cost = t.cheapest.cost_usd if t.cheapest is not None else t.smallest.cost_usd
            return f"over budget: the cheapest allocation meeting the deadline costs ${cost:,.0f} > ${budget_usd:,.0f}"
    return ""


def _within_budget(t: TypeSizing, deadline_s: float, budget_usd: float | None) -> Allocation | None:
    """The type's smallest meeting allocation whose cost is within the budget."""
    if budget_usd is None or (t.smallest.cost_usd is not None and t.smallest.cost_usd <= budget_usd):
        return Allocation.of(t.smallest)
    ok = [p for p in t.frontier if p.meets(deadline_s) and p.cost_usd is not None and p.cost_usd <= budget_usd]
    return Allocation.of(min(ok, key=lambda p: p.nodes)) if ok else None


def _no_answer_message(req: SizeRequest, left: list[tuple[str, str]]) -> str:
    days = req.deadline_s / 86400.0
    reasons = "; ".join(f"{g}: {w}" for g, w in left)
    hint = "extend --deadline, raise --max-gpus or --budget"
    if any("the batch limits scaling" in w for _, w in left):
        hint = "raise the batch (--tokens-per-batch, as above), extend --deadline or raise --max-gpus"
    return (f"no allocation of {req.min_gpus} to {req.max_gpus} GPUs trains {req.tokens:.3g} tokens of "
            f"{req.model.name} in {days:.3g} days: {reasons}. {hint[0].upper() + hint[1:]}.")


def size_notes(req: SizeRequest, types: list[TypeSizing], hardwares: list[Hardware], interrupted: bool) -> list[str]:
    """What the answer rests on: the batch, the minimality proof per type, batch limits, the goodput model and
    its limits, the prices and their sources."""
    notes = []
    if req.batch is not None:
        notes.append(f"batch {req.batch.text()} tokens ({req.batch.source}); {ROUNDING}")
    for t in types:
        notes.append(_proof_note(t, req, interrupted))
        if scoped := gpu_scale_note(req.calibration, t.gpu, req.model.is_moe, t.hardware.cluster.name):
            notes.append(f"{t.gpu}: {scoped}")
        if t.batch_note and t.smallest is not None:
            notes.append(f"{t.gpu}: {t.batch_note}")
        if t.smallest is not None and len(t.frontier) > 1:
            notes.append(f"{t.gpu}: frontier allocations above the smallest are costed with the plan shapes fastest "
                         "on the smallest, at every MBS of the space (not searched exhaustively)")
    if req.failures is None:
        notes.append("goodput: a perfect run is assumed (no failures, restarts or checkpoint stalls)")
    else:
        notes.append(f"goodput: {req.failures.describe()}")
    if note := settings_note(req.space, req.model.is_moe):
        notes.append(note)
    notes += price_notes(types, req.prices or {})
    return notes


def _proof_note(t: TypeSizing, req: SizeRequest, interrupted: bool) -> str:
    s = t.smallest
    if s is None:
        return f"{t.gpu}: no allocation meets the deadline"
    what = f"{t.gpu}: {s.nodes} x {t.hardware.gpus_per_node} GPUs is the smallest allocation"
    if t.below is not None:
        days = f", {t.below.days:.2f} d" if t.below.days is not None else ", no plan fits"
        return (f"{what}: {t.below.nodes} nodes miss the deadline with every plan of the space{days} "
                f"({t.exhaustive_searches} allocations searched exhaustively, {t.predictions:,} plans predicted)")
    if s.nodes == t.min_nodes:
        return f"{what}: it is the lower limit (--min-gpus {req.min_gpus})"
    return f"{what} found before Ctrl-C: not proved minimal" if interrupted else what


def price_notes(types: list[TypeSizing], overrides: dict) -> list[str]:
    """One dated source per GPU type's price, a warning when they differ, and the types that have no price."""
    rows, missing = {}, []
    for t in types:
        hw = t.hardware
        if t.gpu in overrides:
            rows[t.gpu] = (overrides[t.gpu], "--price", "")
        elif hw.price_usd_per_gpu_hour is None:
            missing.append(t.gpu)
        else:
            src = hw.cluster if hw.cluster.price_usd_per_gpu_hour is not None else hw.gpu
            basis = getattr(src, "price_basis", "") or hw.gpu.price_basis
            rows[t.gpu] = (hw.price_usd_per_gpu_hour, src.price_source or "catalogue",
                           f"{basis + ', ' if basis else ''}{src.price_date or 'undated'}")
    out = []
    if rows:
        out.append("prices [USD/GPU-h]: " + "; ".join(f"{g} {p:.2f} ({s}{': ' + d if d else ''})"
                                                     for g, (p, s, d) in rows.items()))
        if len({s for _, s, _ in rows.values()}) > 1:
            out.append("warning: the prices come from different sources (" + ", ".join(sorted(
                {s for _, s, _ in rows.values()})) + "): costs across GPU types are not like for like; pass --price "
                "GPU=USD_PER_GPU_HOUR for each from one provider")
    out += [f"{g}: no price in the catalogue (no per-GPU-hour price in the catalogue's sources); pass --price "
            f"{g}=USD_PER_GPU_HOUR for its cost" for g in missing]
    return out
