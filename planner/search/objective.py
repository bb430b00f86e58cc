"""Evaluating one candidate: cheap rejection first (divisibility, then memory), then the prediction.

The order keeps searches fast: ``ParallelPlan.problems`` and ``costmodel.memory.per_gpu.memory_per_gpu`` cost
microseconds; :func:`costmodel.estimate.estimate` (operator graph + cost model + 1F1B timeline) is only
run for plans that are valid and fit in memory. Results are cached per canonical candidate, so a
sampler that proposes the same plan twice costs one prediction.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

from costmodel.cost.base import OperatorCostModel
from costmodel.estimate import default_cost_model, estimate
from costmodel.memory.per_gpu import fits_in_memory, memory_per_gpu
from planner.batch import tokens_text
from planner.prediction import predict
from planner.search.records import PlanRecord, expected_usd_per_mtoken, make_record, seconds_per_token
from planner.search.space import LIMITED_DTYPES, Candidate, SearchProblem, candidate_plan, offloaded_fit

GIB = 1024**3
OBJECTIVES = ("time", "cost", "pareto")
"""time: time per token (= time to train a token budget, same ranking; the iteration time where plans share the
batch); cost: USD per million tokens; pareto: both (multi-objective, Pareto front)."""


@dataclass(frozen=True)
class Evaluation:
    """Outcome of one candidate."""

    status: str
    """'ok' (valid and fits), 'invalid' (divisibility / layout rule) or 'memory' (does not fit)."""
    reason: str
    """Why it was rejected ('' when ok): the first rule broken, or the memory needed vs available."""
    violation: float
    """Optuna constraint value: <= 0 feasible; memory: needed / usable - 1; invalid: 1 + rules broken."""
    record: PlanRecord | None = None
    """The ranked-plan record when status == 'ok'."""


def batch_cap_problem(problem: SearchProblem, c: Candidate) -> str | None:
    """Why the batch range holds no GBS for candidate ``c`` (its MBS x DP exceeds the batch), or None."""
    if problem.gbs is not None:
        return None
    t = problem.targets[c.target]
    mp = c.tp * c.pp * c.cp
    if not mp or t.gpus % mp:
        return None
    unit = c.mbs * (t.gpus // mp)
    if problem.gbs_for(unit):
        return None
    return (f"the batch caps DP: MBS x DP = {unit} sequences ({tokens_text(unit * problem.seq_len)} tokens) exceeds "
            f"the batch range {problem.batch.text()} tokens")


def _reason_kind(problem: str) -> str:
    """A short, count-friendly form of a ParallelPlan.problems() message: values after '=' and standalone numbers
    removed (digits inside a word stay: fp8, bf16)."""
    return " ".join(re.sub(r"\s*=\s*[\w.*]+(\s*\*\s*\w+)*|\(\d+\)|\b\d+(?:\.\d+)?\b", "", problem).split())


class Evaluator:
    """Evaluate candidates of one problem, with counts of every outcome and a cache."""

    def __init__(self, problem: SearchProblem, cost_model: OperatorCostModel | None = None, light: bool = False):
        self.problem = problem
        self._cost_model = cost_model
        self.light = light
        """Records from :func:`quick_prediction` (:func:`costmodel.estimate.estimate` in mode time: iteration time,
        throughput, MFU, memory; no breakdown, interval or bottleneck): about half the time of a full prediction;
        :meth:`detailed` completes one."""
        self.cache: dict[Candidate, Evaluation] = {}
        self.counts: Counter = Counter()
        """status -> number of distinct candidates."""
        self.reasons: Counter = Counter()
        """Rejection reason (numbers stripped) -> number of distinct candidates."""

    @property
    def cost_model(self) -> OperatorCostModel:
        """The operator cost model (the default one, loaded on first use: counting plans needs none)."""
        if self._cost_model is None:
            self._cost_model = default_cost_model()
        return self._cost_model

    def evaluate(self, cand: Candidate) -> Evaluation:
        cand = cand.canonical()
        hit = self.cache.get(cand)
        if hit is not None:
            return hit
        ev = self._evaluate(cand)
        self.cache[cand] = ev
        self.counts[ev.status] += 1
        if ev.status != "ok":
            self.reasons[ev.reason if ev.status == "memory" else _reason_kind(ev.reason)] += 1
        return ev

    def _reject(self, cand: Candidate):
        """(Evaluation of a rejected candidate, None) or (None, plan) when it is valid and fits."""
        p = self.problem
        target = p.targets[cand.target]
        plan = candidate_plan(p, cand)
        capped = batch_cap_problem(p, cand)
        problems = ([capped] if capped else []) + plan.problems(p.model)
        if cand.tp > target.nvlink_domain and not p.space.allow_tp_across_nodes:
            problems.append(f"TP={cand.tp} exceeds the {target.nvlink_domain} GPUs of an NVLink domain "
                            "(pass --allow-tp-across-nodes to allow it)")
        limited = LIMITED_DTYPES.get(cand.dtype)
        if limited is not None and not limited[0](target.hardware.gpu):
            problems.append(f"{cand.dtype} on {target.hardware.gpu.name}, which has {limited[1]}")
        if problems:
            return Evaluation("invalid", problems[0], 1.0 + len(problems)), None
        gpu = target.hardware.gpu
        mem = memory_per_gpu(p.model, plan, gpu)
        if not fits_in_memory(mem, gpu, p.space.memory_headroom):
            offloaded = offloaded_fit(p, plan, gpu)
            if offloaded is not None:
                return None, offloaded
            usable = gpu.hbm_bytes * (1.0 - p.space.memory_headroom)
            return Evaluation("memory", f"needs more than {usable / GIB:.1f} GiB usable per GPU",
                              mem.total / usable - 1.0), None
        return None, plan

    def feasible(self, cand: Candidate) -> bool:
        """Valid and fits in memory (the cheap checks only; nothing counted, no prediction)."""
        cand = cand.canonical()
        hit = self.cache.get(cand)
        if hit is not None:
            return hit.status == "ok"
        return self._reject(cand)[0] is None

    def _evaluate(self, cand: Candidate) -> Evaluation:
        rejected, plan = self._reject(cand)
        if rejected is not None:
            return rejected
        p = self.problem
        target = p.targets[cand.target]
        pred = (quick_prediction if self.light else predict)(p.model, plan, target.hardware, self.cost_model,
                                                             calibration=p.calibration)
        if pred.layer_split is not None and plan.layer_split is None:
            # the split predict chose (PP x VPP does not divide the layers): check memory with it
            plan = dataclasses.replace(plan, layer_split=tuple(pred.layer_split))
            gpu = target.hardware.gpu
            mem = memory_per_gpu(p.model, plan, gpu)
            if not fits_in_memory(mem, gpu, p.space.memory_headroom):
                usable = gpu.hbm_bytes * (1.0 - p.space.memory_headroom)
                return Evaluation("memory", f"needs more than {usable / GIB:.1f} GiB usable per GPU",
                                  mem.total / usable - 1.0)
        rec = make_record(p, target, plan, pred, p.price(target.hardware))
        return Evaluation("ok", "", 0.0, rec)

    def detailed(self, rec: PlanRecord) -> PlanRecord:
        """``rec`` with the full prediction (breakdown, bottleneck, interval, cost sources), ranking kept."""
        if not rec.quick:
            return rec
        p = self.problem
        target = next(t for t in p.targets if t.hardware.gpu.name == rec.gpu and t.hardware.cluster.name == rec.cluster
                      and t.gpus == rec.gpus)
        plan = rec.to_plan()
        full = make_record(p, target, plan, predict(p.model, plan, target.hardware, self.cost_model,
                                                    calibration=p.calibration), p.price(target.hardware))
        return dataclasses.replace(full, rank=rec.rank, pareto=rec.pareto, trial=rec.trial, equivalent=rec.equivalent)

    @property
    def evaluated(self) -> int:
        return sum(self.counts.values())


def objective_values(rec: PlanRecord, objective: str) -> tuple[float, ...]:
    """The value(s) a search minimises for one feasible record: expected seconds per million tokens (the iteration
    time where every plan runs the same batch, planner.search.records.seconds_per_token) and/or expected USD per
    million tokens."""
    per_mtoken = seconds_per_token(rec) * 1e6
    if objective == "time":
        return (per_mtoken,)
    if objective == "cost":
        return (expected_usd_per_mtoken(rec),)
    return (per_mtoken, expected_usd_per_mtoken(rec))


@dataclass
class QuickPrediction:
    """What :func:`planner.search.records.make_record` reads of a Prediction, from the iteration time alone."""

    iteration_time_s: float
    tokens_per_s: float
    mfu: float
    model_tflops_per_gpu: float
    memory_gib_per_gpu: float
    cost_model: str
    layer_split: list | None
    iteration_time_low_s: float | None = None
    iteration_time_high_s: float | None = None
    bottleneck: str = ""
    bubble_fraction: float = 0.0
    cost_sources: dict = dataclasses.field(default_factory=dict)
    quick: bool = True


def quick_prediction(model, plan, hardware, cost_model: OperatorCostModel, calibration=None) -> QuickPrediction:
    """The iteration time of :func:`planner.prediction.predict` (:func:`costmodel.estimate.estimate` in mode time:
    the same number, tests/test_search_modes.py) without the breakdown, interval and warnings, plus the metrics
    derived from it."""
    est = estimate(model, plan, hardware, cost_model=cost_model, calibration=calibration, mode="time")
    met, split = est.metrics, est.plan.layer_split
    return QuickPrediction(est.iteration_time_s, met.tokens_per_s, met.mfu, met.model_tflops_per_gpu,
                           met.memory.total / GIB, est.cost_model, list(split) if split is not None else None)
