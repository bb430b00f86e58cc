"""What the Optuna search already knows: each distinct plan's trial outcome, and which valid plans are left.

Optuna's samplers propose the same categorical combination again and again (a 3,000-trial TPE study of
llama-13b on 128 A100 proposed 887 distinct plans), and a study resumed in a new process or shared between
workers starts with trials it did not evaluate itself. :class:`Answers` answers a plan seen before from its
first trial's outcome (the same objective value, constraint and user attributes), so a repeated plan is
recorded as a trial of its own, as Optuna's bookkeeping and ``--resume`` need, but never costed again
(Optuna's FAQ answers "how to avoid evaluating the same parameters twice" the same way: look the parameters
up among the finished trials and return their value). It also tracks the space's valid plans not yet
evaluated, so a run whose trials cover every one of them can stop: its result is then the exhaustive
search's.
"""

from __future__ import annotations

from typing import NamedTuple

from planner.search.objective import Evaluator, objective_values
from planner.search.space import Candidate, SearchProblem, candidate_from_params, enumerate_candidates

INFEASIBLE_VALUE = 1e9
"""Objective value reported to Optuna for a rejected candidate. It never reaches the user: with
``constraints_func`` Optuna ranks infeasible trials after every feasible one by their violation."""
ATTRS = ("constraint", "status", "reason", "record")
"""The trial user attributes that carry a plan's outcome (planner.search.engine reads them back)."""


class Answer(NamedTuple):
    """The outcome of one plan as its trials record it."""

    attrs: dict
    """Trial user attributes: constraint, status, and reason (rejected) or record (feasible)."""
    violation: float
    """Optuna constraint value (<= 0 feasible)."""
    value: float | tuple
    """The objective value (a tuple for the Pareto objective)."""


class Answers:
    """Each distinct plan's outcome by canonical candidate, and the valid plans not yet evaluated."""

    def __init__(self, choices: dict, objective: str):
        self.choices, self.objective = choices, objective
        self.known: dict[Candidate, Answer] = {}
        self.evaluated = 0
        """Plans this process costed (not answered from an earlier trial)."""
        self.left: set[Candidate] | None = None
        """Valid plans of the space not yet evaluated; None when the run cannot cover them all (not watched)."""
        self.total = 0
        """Valid plans of the space (when watched)."""

    def learn(self, trials) -> None:
        """Take the outcomes of finished trials (earlier runs, other processes) that carry them."""
        for t in trials:
            if "status" not in t.user_attrs or "constraint" not in t.user_attrs or not t.values:
                continue
            c = candidate_from_params(t.params, self.choices).canonical()
            if c not in self.known:
                attrs = {k: t.user_attrs[k] for k in ATTRS if k in t.user_attrs}
                value = tuple(t.values) if self.objective == "pareto" else t.values[0]
                self._put(c, Answer(attrs, float(attrs["constraint"][0]), value))

    def watch(self, plans: list[Candidate] | None) -> None:
        """Track ``plans`` (the space's valid plans, canonical) until each has been evaluated."""
        if plans is not None:
            self.total = len(plans)
            self.left = {c for c in plans if c not in self.known}

    @property
    def covered(self) -> bool:
        """Every valid plan of the watched space has been evaluated."""
        return self.left is not None and not self.left

    def answer(self, cand: Candidate, ev: Evaluator) -> Answer:
        """The outcome of ``cand``: the known one, else evaluated now (and remembered)."""
        cand = cand.canonical()
        hit = self.known.get(cand)
        if hit is not None:
            return hit
        e = ev.evaluate(cand)
        self.evaluated += 1
        multi = self.objective == "pareto"
        if e.record is None:
            bad = INFEASIBLE_VALUE * (1.0 + e.violation)
            return self._put(cand, Answer({"constraint": [e.violation], "status": e.status, "reason": e.reason},
                                          e.violation, (bad, bad) if multi else bad))
        vals = objective_values(e.record, self.objective)
        return self._put(cand, Answer({"constraint": [e.violation], "status": e.status, "record": e.record.to_dict()},
                                      e.violation, vals if multi else vals[0]))

    def _put(self, cand: Candidate, a: Answer) -> Answer:
        self.known[cand] = a
        if self.left is not None:
            self.left.discard(cand)
        return a


SCAN_PER_TRIAL = 10
"""Most candidates :func:`valid_plans` checks per trial of the run's budget. A check (divisibility and memory,
no prediction) took about 40 us on the dev machine (the default spaces of llama-13b / 128, llama3-70b / 512 and
gpt3-175b / 1,024: 1,692 to 1,872 candidates in 64-67 ms), a trial of a llama-13b / 128 study about 3 ms (6 s of
CPU for 1,800 trials), so the scan costs at most about a seventh of the trials it may save."""


def valid_plans(problem: SearchProblem, ev: Evaluator, limit: int) -> list[Candidate] | None:
    """The space's candidates that are valid and fit in memory (the cheap checks, no prediction; the plans the
    exhaustive search costs), canonical; None when there are more than ``limit``, or when finding them would take
    more than SCAN_PER_TRIAL x ``limit`` checks."""
    out: list[Candidate] = []
    for i, c in enumerate(enumerate_candidates(problem)):
        if i >= SCAN_PER_TRIAL * max(limit, 1):
            return None
        if ev.feasible(c):
            out.append(c.canonical())
            if len(out) > limit:
                return None
    return out
