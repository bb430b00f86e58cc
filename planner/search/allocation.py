"""The allocation search of `planner size` for one GPU type: every node count between the limits, not a few.

A node (or an NVLink tray, where that is the allocation unit: the catalogue's GPUs per node) is the unit. The
search finds the smallest node count whose best plan trains the token budget before the deadline, proves it
(one node fewer, searched over every plan of the space, misses), and costs a frontier of larger allocations
(GPUs vs days vs USD) for the cheapest:

1. an exhaustive search at the count a plan at START_MFU would need (the anchor) gives the plan shapes (TP, PP,
   CP, VPP, MBS, recompute, ZeRO, ...) that train fastest there;
2. each shape is bisected over the node counts it divides (one prediction per step, assuming that more nodes
   never train a shape slower) for the smallest count at which it meets the deadline; the smallest over shapes
   is the candidate answer;
3. one node fewer is searched exhaustively: if some plan meets the deadline there, its shapes join and step 2
   repeats below it; else the answer is proved minimal (within the space and the cost model);
4. the frontier: node counts from the answer to the largest allowed, about FRONTIER_STEP apart, each costed with
   the shapes fastest at the answer, at every micro-batch size of the space (the best of them, not an exhaustive
   search).

Every allocation keeps the best plan found on it; ``exhaustive`` says whether that was the whole space's best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import RECOMPUTE_MODES
from costmodel.core.specs.presets import default_seq_len
from costmodel.schedule.flops import model_flops_per_iteration
from planner.search.objective import Evaluator
from planner.search.records import PlanRecord
from planner.search.space import Candidate, SearchProblem, SearchSpace, enumerate_candidates

START_MFU = 0.5
"""The anchor allocation of a GPU type is the one a plan at this model FLOPs utilisation would need. Large dense
runs publish 38-43 % (Llama 3 405B on 16,384 H100: Dubey et al. 2024, Table 4), so the anchor lies at or just below
the answer and most shape bisections start near it."""
SHAPES_TOP = 16
"""Plan shapes kept from each exhaustive search: its SHAPES_TOP fastest, every one within SHAPES_WITHIN of the
fastest, and the fastest per (TP, PP, CP, VPP)."""
SHAPES_WITHIN = 0.10
"""Plans this much slower than the best of an exhaustive search still give their shape to the bisection: a shape
whose time scales like the best one's can win at a node count the best shape does not divide (a search setting
checked by the brute-force scan of tests/test_sizing.py, not a model constant)."""
NEAR = 8
"""Node counts a shape bisection looks at around a count where the shape is invalid (a search setting)."""
FRONTIER_STEP = 1.5
"""Node counts of the frontier grow by about this factor (a display density, not a model constant)."""


@dataclass
class Point:
    """One allocation of a GPU type and the best plan found on it."""

    nodes: int
    gpus: int
    record: PlanRecord | None
    """Best plan found (None: no plan of the shapes tried, or of the space, is valid and fits)."""
    exhaustive: bool
    """record is the best of the whole space (an exhaustive search ran here), not of the shapes tried."""

    def meets(self, deadline_s: float) -> bool:
        t = self.record.time_to_train_s if self.record is not None else None
        return t is not None and t <= deadline_s

    @property
    def days(self) -> float | None:
        t = self.record.time_to_train_s if self.record is not None else None
        return None if t is None else t / 86400.0

    @property
    def cost_usd(self) -> float | None:
        return self.record.cost_to_train_usd if self.record is not None else None

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "gpus": self.gpus, "exhaustive": self.exhaustive, "days": self.days,
                "cost_usd": self.cost_usd, "plan": self.record.to_dict() if self.record is not None else None}


def dominated(points: list[Point]) -> set[int]:
    """Node counts among ``points`` (one GPU type's frontier) that a smaller allocation beats: it trains in no more
    days and costs no more (cost compared only where both are priced). The batch can cap DP, so more GPUs do not
    always train faster."""
    out = set()
    for p in points:
        for q in points:
            if (q.nodes < p.nodes and p.days is not None and q.days is not None and q.days <= p.days
                    and (p.cost_usd is None or q.cost_usd is None or q.cost_usd <= p.cost_usd)):
                out.add(p.nodes)
                break
    return out


@dataclass
class TypeSizing:
    """What the allocation search found for one GPU type."""

    gpu: str
    hardware: Hardware
    smallest: Point | None
    """Fewest nodes that meet the deadline (None: none up to the largest allowed)."""
    below: Point | None
    """One node fewer than ``smallest``, searched exhaustively (None: smallest is the lower limit)."""
    cheapest: Point | None
    """Lowest expected cost among the meeting allocations evaluated (None: no price, or none meets)."""
    frontier: list[Point] = field(default_factory=list)
    """Allocations costed for the frontier table and plot, by node count (meeting the deadline or not)."""
    fastest: Point | None = None
    """The largest allocation allowed, when none meets the deadline (how far it misses)."""
    min_nodes: int = 1
    max_nodes: int = 1
    exhaustive_searches: int = 0
    predictions: int = 0
    """Plans predicted (exhaustive searches included)."""
    evaluated: int = 0
    """Allocations (node counts) on which at least one plan was evaluated."""
    reason: str = ""
    """Why this type has no answer (no plan fits, misses the deadline at the largest allocation)."""
    batch_note: str = ""
    """How the batch limits scaling on the answer's allocation ('' when it does not)."""

    def to_dict(self) -> dict:
        beaten = dominated(self.frontier)
        return {"gpu": self.gpu, "cluster": self.hardware.cluster.name, "min_nodes": self.min_nodes,
                "max_nodes": self.max_nodes, "gpus_per_node": self.hardware.gpus_per_node,
                "smallest": self.smallest.to_dict() if self.smallest else None,
                "one_node_fewer": self.below.to_dict() if self.below else None,
                "cheapest": self.cheapest.to_dict() if self.cheapest else None,
                "fastest": self.fastest.to_dict() if self.fastest else None,
                "frontier": [{**p.to_dict(), "dominated": p.nodes in beaten} for p in self.frontier],
                "exhaustive_searches": self.exhaustive_searches,
                "predictions": self.predictions, "allocations_evaluated": self.evaluated, "reason": self.reason,
                "batch_note": self.batch_note}


def shape_of(rec: PlanRecord) -> Candidate:
    """The plan shape of a record: its candidate on a one-allocation problem (target 0)."""
    etp = rec.etp if rec.etp is not None and rec.etp != rec.tp else 0
    return Candidate(0, rec.tp, rec.pp, rec.cp, rec.vpp, rec.mbs, rec.recompute, rec.sequence_parallel, rec.zero,
                     rec.dtype, rec.framework, rec.ep, etp).canonical()


def shapes_of(records: list[PlanRecord], top: int = SHAPES_TOP, within: float = SHAPES_WITHIN,
              group_vpp: bool = True) -> list[Candidate]:
    """Shapes of ranked records: the ``top`` fastest, those within ``within`` of the fastest, and the fastest per
    (TP, PP, CP, VPP) (per (TP, PP, CP) without ``group_vpp``), in rank order."""
    out: dict[Candidate, None] = {}
    seen_groups: set = set()
    limit = time_key(records[0]) * (1.0 + within) if records else 0.0
    for i, r in enumerate(records):
        group = (r.tp, r.pp, r.cp, r.vpp if group_vpp else 0)
        if i < top or time_key(r) <= limit or group not in seen_groups:
            out.setdefault(shape_of(r), None)
        seen_groups.add(group)
    return list(out)


def mbs_variants(shapes: list[Candidate], mbs: tuple[int, ...]) -> list[Candidate]:
    """The shapes, then each with every other micro-batch size of the space: on a larger allocation the global
    batch, a multiple of MBS x DP within the batch range, may exist for a smaller MBS only (planner.batch)."""
    out = dict.fromkeys(shapes)
    for s in shapes:
        for m in sorted(mbs):
            out.setdefault(s._replace(mbs=m), None)
    return list(out)


def start_nodes(model: ModelSpec, tokens: float, deadline_s: float, hw: Hardware, space: SearchSpace,
                min_nodes: int = 1, max_nodes: int = 1 << 20) -> int:
    """Nodes a plan at START_MFU of the fastest peak of the space's dtypes would need (6 N D-style model FLOPs),
    within the limits, moved to the count within 20 % of it whose GPUs have the largest power-of-two factor (the
    most layouts divide it, so the anchor's search sees the most plan shapes)."""
    seq = default_seq_len(model)[0]
    flops = model_flops_per_iteration(model, 1, seq) / seq * tokens
    peak = max(hw.gpu.peak_flops(d) for d in space.dtype)
    est = min(max(min_nodes, math.ceil(min(flops / (START_MFU * peak * deadline_s) / hw.gpus_per_node, 2.0**60))),
              max_nodes)
    counts = range(max(min_nodes, math.floor(est * 0.8)), min(max_nodes, math.ceil(est * 1.2)) + 1)
    return max(counts, key=lambda n: (n * hw.gpus_per_node & -(n * hw.gpus_per_node), -abs(n - est)))


class TypeSizer:
    """Sizes one GPU type (module docstring). ``problem_at(nodes)`` builds the one-allocation search problem;
    ``on_progress(message)`` is called after each step; ``on_found(point)`` with every better meeting allocation."""

    def __init__(self, hw: Hardware, deadline_s: float, problem_at: Callable[[int], SearchProblem], cost_model,
                 min_nodes: int, max_nodes: int, on_progress=None, on_found=None):
        self.hw, self.deadline_s, self.problem_at, self.cost_model = hw, deadline_s, problem_at, cost_model
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.on_progress, self.on_found = on_progress, on_found
        self.points: dict[int, Point] = {}
        self.evaluators: dict[int, Evaluator] = {}
        self.shape_records: dict[tuple[int, Candidate], PlanRecord | None] = {}
        self.shapes: list[Candidate] = []
        self.exhaustive_searches = 0
        self.predictions = 0
        self.best: Point | None = None

    # ------------------------------------------------------------------------------------ evaluation
    def _evaluator(self, nodes: int) -> Evaluator:
        ev = self.evaluators.get(nodes)
        if ev is None:
            ev = self.evaluators[nodes] = Evaluator(self.problem_at(nodes), self.cost_model, light=True)
        return ev

    def shape_record(self, nodes: int, shape: Candidate) -> PlanRecord | None:
        """The record of one shape at ``nodes`` (None: invalid there, or out of memory)."""
        key = (nodes, shape)
        if key not in self.shape_records:
            ev = self._evaluator(nodes)
            before = ev.counts.get("ok", 0)
            self.shape_records[key] = ev.evaluate(shape).record
            self.predictions += ev.counts.get("ok", 0) - before
        return self.shape_records[key]

    def _note(self, point: Point) -> Point:
        """Keep the faster record per node count (and whether an exhaustive search ran there); track the smallest
        meeting allocation."""
        old = self.points.get(point.nodes)
        if old is not None:
            rec = point.record if _better(point.record, old.record) else old.record
            point = replace(point, record=rec, exhaustive=point.exhaustive or old.exhaustive)
        self.points[point.nodes] = point
        if point.meets(self.deadline_s) and (self.best is None or point.nodes <= self.best.nodes):
            smaller = self.best is None or point.nodes < self.best.nodes
            self.best = point
            if smaller and self.on_found is not None:
                self.on_found(point)
        if self.on_progress is not None:
            self.on_progress(self)
        return point

    def shapes_point(self, nodes: int, shapes: list[Candidate] | None = None) -> Point:
        """Best of ``shapes`` (default: all known) at ``nodes``."""
        recs = [self.shape_record(nodes, s) for s in (self.shapes if shapes is None else shapes)]
        best = min((r for r in recs if r is not None), key=time_key, default=None)
        return self._note(Point(nodes, nodes * self.hw.gpus_per_node, best, False))

    def full_point(self, nodes: int) -> Point:
        """The best plan of the whole space at ``nodes`` (:func:`best_plan_search`); its fastest shapes join the
        known ones."""
        old = self.points.get(nodes)
        if old is not None and old.exhaustive:
            return old
        ev = self._evaluator(nodes)
        before = ev.counts.get("ok", 0)
        records = best_plan_search(ev)
        self.exhaustive_searches += 1
        self.predictions += ev.counts.get("ok", 0) - before
        for s in shapes_of(records):
            if s not in self.shapes:
                self.shapes.append(s)
        best = ev.detailed(records[0]) if records else None
        return self._note(Point(nodes, nodes * self.hw.gpus_per_node, best, True))

    def divides(self, nodes: int, shape: Candidate) -> bool:
        """The shape's TP x PP x CP divides the allocation's GPUs (the rest is checked when it is evaluated)."""
        world = nodes * self.hw.gpus_per_node
        return world % (shape.tp * shape.pp * shape.cp) == 0

    def shape_meets(self, nodes: int, shape: Candidate) -> bool:
        rec = self.shape_record(nodes, shape)
        ok = rec is not None and rec.time_to_train_s is not None and rec.time_to_train_s <= self.deadline_s
        if ok:
            self._note(Point(nodes, nodes * self.hw.gpus_per_node, rec, False))
        return ok


    # -------------------------------------------------------------------------------------- the search
    def run(self, start: int, exhaustive_answer: bool = True) -> TypeSizing:
        """The search of the module docstring from the anchor count ``start``; ``exhaustive_answer``: search the
        answer's allocation exhaustively too (its plan is then the space's best there)."""
        anchor = self._anchor(min(max(start, self.min_nodes), self.max_nodes))
        if anchor is None:
            return self._result(None, None, "no plan of the space is valid and fits in memory on up to "
                                f"{self.max_nodes * self.hw.gpus_per_node} GPUs")
        hi = self._upper(anchor)
        if hi is None:
            fastest = self.full_point(self.max_nodes)
            out = self._result(None, None, "misses the deadline even on the largest allocation allowed")
            out.fastest = fastest
            return out
        lo = self.min_nodes if anchor.meets(self.deadline_s) else anchor.nodes + 1
        n = self._descend(lo)
        below = None
        while n - 1 >= self.min_nodes:
            below = self.full_point(n - 1)
            if not below.meets(self.deadline_s):
                break
            n = self._descend(lo)
            below = None
        smallest = self.full_point(n) if exhaustive_answer else self.points[n]
        return self._result(smallest, below, "")

    def _anchor(self, start: int) -> Point | None:
        """The exhaustive search at ``start``, doubling while no plan fits (None: none fits up to the limit)."""
        n = start
        while True:
            p = self.full_point(n)
            if p.record is not None:
                return p
            if n >= self.max_nodes:
                return None
            n = min(self.max_nodes, 2 * n)

    def _upper(self, anchor: Point) -> int | None:
        """A node count that meets the deadline, stepping up from the anchor by the time it misses by (shapes
        first, the exhaustive search at the largest count last); None when even that misses."""
        p = anchor
        while not p.meets(self.deadline_s):
            if p.nodes >= self.max_nodes:
                return None if p.exhaustive else (self.max_nodes if self.full_point(self.max_nodes).meets(
                    self.deadline_s) else None)
            ratio = p.days * 86400.0 / self.deadline_s if p.days is not None else 2.0
            n = min(self.max_nodes, max(p.nodes + 1, math.ceil(p.nodes * max(1.05, 1.02 * ratio))))
            p = self.shapes_point(n)
        return p.nodes

    def _descend(self, lo: int) -> int:
        """Bisect every known shape over the counts below the smallest meeting one that it divides (assuming more
        nodes never train a shape slower); returns the smallest meeting count found. A count where the shape is
        invalid (e.g. an interleaved schedule the micro-batch count does not allow) is replaced by the nearest valid
        one in the interval (cheap checks, no prediction); none near counts as a miss (a shape that does not fit in
        memory there fits at no smaller count either)."""
        for shape in list(self.shapes):
            cands = [n for n in range(lo, self.best.nodes) if self.divides(n, shape)]
            b = self._valid_near(cands, len(cands) - 1, 0, len(cands) - 1, shape)
            if b is None or not self.shape_meets(cands[b], shape):
                continue
            a = 0
            while a < b:
                mid = (a + b) // 2
                j = self._valid_near(cands, mid, a, b - 1, shape)
                if j is not None and self.shape_meets(cands[j], shape):
                    b = j
                else:  # misses, or no valid count near: out of memory there, as at every smaller count
                    a = (mid if j is None else j) + 1
        return self.best.nodes

    def _valid_near(self, cands: list[int], i: int, a: int, b: int, shape: Candidate) -> int | None:
        """The index in [a, b] nearest ``i``, at most NEAR steps away, whose count the shape is valid on and fits
        (None: none)."""
        for d in range(0, min(NEAR, max(i - a, b - i)) + 1):
            for j in (i - d, i + d):
                if a <= j <= b and self._evaluator(cands[j]).feasible(shape):
                    return j
        return None

    def frontier(self, smallest: int) -> list[Point]:
        """Allocations from ``smallest`` to the largest allowed, about FRONTIER_STEP apart, costed with the shapes
        that were fastest at ``smallest``, plus every allocation searched exhaustively."""
        counts, n = [], smallest
        while n < self.max_nodes:
            counts.append(n)
            n = max(n + 1, round(n * FRONTIER_STEP))
        counts.append(self.max_nodes)
        ranked = sorted((r for r in (self.shape_record(smallest, s) for s in self.shapes) if r is not None),
                        key=time_key)
        shapes = mbs_variants(shapes_of(ranked, top=6, within=0.0, group_vpp=False) or self.shapes,
                              self._evaluator(smallest).problem.space.mbs)
        for c in counts:
            if not self.points.get(c, Point(c, 0, None, False)).exhaustive:
                self.shapes_point(c, shapes)
        return sorted((p for p in self.points.values() if p.record is not None and (
            p.exhaustive or p.nodes in counts)), key=lambda p: p.nodes)

    def _result(self, smallest: Point | None, below: Point | None, reason: str) -> TypeSizing:
        frontier = self.frontier(smallest.nodes) if smallest is not None else sorted(
            (p for p in self.points.values() if p.exhaustive and p.record is not None), key=lambda p: p.nodes)
        meeting = [p for p in frontier if p.meets(self.deadline_s) and p.cost_usd is not None]
        cheapest = min(meeting, key=lambda p: (p.cost_usd, p.nodes), default=None)
        return TypeSizing(self.hw.gpu.name, self.hw, smallest, below, cheapest, frontier, None, self.min_nodes,
                          self.max_nodes, self.exhaustive_searches, self.predictions, len(self.points), reason)


def _slower_or_equal(a: Candidate, b: Candidate) -> bool:
    """``a`` (same layout as ``b`` but for recompute and ZeRO) recomputes at least as much and shards at least as
    much as ``b`` (ZeRO 1 < 2 < 3; ZeRO-0 only compares with itself), so it never trains faster."""
    same_zero = a.zero == b.zero or (a.zero > 0 and b.zero > 0 and a.zero >= b.zero)
    return same_zero and RECOMPUTE_MODES.index(a.recompute) >= RECOMPUTE_MODES.index(b.recompute)


def best_plan_search(ev: Evaluator) -> list[PlanRecord]:
    """The fastest plans of the evaluator's space, ranked by time to train: an exhaustive search for the best plan
    that, among plans differing only in recomputation and ZeRO stage, predicts only those no fitting plan
    dominates: more recomputation or a higher ZeRO stage (1 to 3) never trains faster (the cost model only adds
    recomputed operators and parameter gathers; checked over every layout of several allocations in
    tests/test_sizing.py), so the best plan is the full exhaustive search's."""
    groups: dict[Candidate, list[Candidate]] = {}
    for c in enumerate_candidates(ev.problem):
        groups.setdefault(c._replace(recompute="", zero=-1), []).append(c)
    records = []
    for cands in groups.values():
        kept: list[Candidate] = []
        for c in sorted(cands, key=lambda c: (RECOMPUTE_MODES.index(c.recompute), c.zero)):
            if any(_slower_or_equal(c, k) for k in kept):
                continue
            e = ev.evaluate(c)
            if e.record is not None:
                kept.append(c)
                records.append(e.record)
    return sorted(records, key=time_key)


def time_key(r: PlanRecord) -> float:
    """Time to train of a record, inf when it trains nothing (no token budget, or a goodput of 0)."""
    return r.time_to_train_s if r.time_to_train_s is not None else math.inf


def _better(a: PlanRecord | None, b: PlanRecord | None) -> bool:
    """``a`` trains faster than ``b`` (a missing record is never better)."""
    if a is None:
        return False
    return b is None or time_key(a) < time_key(b)
