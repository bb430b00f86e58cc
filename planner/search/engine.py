"""Search engines: exhaustive enumeration (the ground truth) and an Optuna study.

Both evaluate candidates through :class:`planner.search.objective.Evaluator` and return a
:class:`SearchResult` holding every feasible plan found as a :class:`PlanRecord`.
:func:`search` is the one entry point the CLI, ``planner compare``/``size`` and report writers use.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

from costmodel.core.errors import Interrupted, PlannerError
from costmodel.cost.base import OperatorCostModel
from planner.search.answers import INFEASIBLE_VALUE, Answers, valid_plans  # noqa: F401 (INFEASIBLE_VALUE: API)
from planner.search.objective import OBJECTIVES, Evaluator, _reason_kind
from planner.search.records import PlanRecord, rank
from planner.search.space import (
    Candidate,
    SearchProblem,
    candidate_from_params,
    candidate_params,
    dimension_choices,
    enumerate_candidates,
    moe_choices,
    neighbours,
    suggest_candidate,
)
from planner.search.study import (  # noqa: F401  (open_storage, recover_stale_trials: re-exported for tests)
    OWNER_ATTR,
    InterruptFlag,
    MirroredStudy,
    ignore_sigint,
    open_storage,
    owner,
    recover_stale_trials,
)
from planner.search.sweep import basin_turns, group_sweep

Progress = Callable[[int, int], None]
"""progress(done, total): called during a search (total = trials or candidates)."""

SAMPLERS = ("tpe", "nsga2", "random")
DEFAULT_TRIALS = 200
POLISH_FRACTION = 0.25
"""Share of a single-objective study's trials spent on local search around the incumbent after TPE
(:func:`_polish`); tuned with benchmarks/bench_search.py (hit rate within 1 % of the exhaustive optimum)."""
MOE_POLISH_FRACTION = 0.5
"""POLISH_FRACTION of an MoE study (an EP dimension): its local search starts with the (PP, EP) sweep of
:func:`planner.search.sweep.group_sweep` (up to one trial per pair, about 40 for DeepSeek-V3's 256 experts
on 1,024 GPUs), so it needs a larger share; tuned with deepseek-v3 on 1,024 and 2,048 and qwen3-235b-a22b on
256 H100 (hit rate of the exhaustive optimum)."""
TPE_STARTUP = 10
"""Random trials before TPE starts modelling (Optuna's default, 10; 20 and 30 hit the 1 % target
less often in benchmarks/bench_search.py)."""
TPE_MAX_TRIALS = 500
"""Most trials one single-objective run gives the sampler; the rest of its budget goes to the local search
(:func:`_polish`). TPE rebuilds its Parzen estimators from every finished trial of the study before each
proposal (optuna/samplers/_tpe/sampler.py ``_sample``), so its cost per trial grows with the study: on the
2-core dev machine 2,250 TPE trials of a llama-13b / 128 study took 22 s of CPU (about 9 us per trial of
history per proposal), the local search's 750 trials 4 s. Runs up to 666 trials (POLISH_FRACTION) are not
affected; benchmarks/bench_search.py checks the 3,000-trial run against the exhaustive optimum."""
EXHAUSTIVE_MAX_PLANS = 3000
"""The default search evaluates every plan when the space holds at most this many valid plans (valid and
fitting in memory, counted with the microsecond checks before any prediction), else it runs Optuna. About
1.5 s of evaluation on one core of the 2-core dev machine, half that on both: benchmarks/bench_search.py
measured 1,850-1,950 plans per second per process there (llama-13b / 128 x a100-80gb, llama3-70b / 512 x
h100-sxm, gpt3-175b / 1,024 x h100-sxm; iteration-time-only evaluation, objective.quick_prediction)."""
MODES = ("auto", "exhaustive", "optuna")
"""auto: exhaustive when the valid plans are at most EXHAUSTIVE_MAX_PLANS, else Optuna."""


@dataclass
class SearchResult:
    """Outcome of one search."""

    problem: SearchProblem
    objective: str
    """time | cost | pareto."""
    method: str
    """'exhaustive' or 'optuna-<sampler>'."""
    records: list[PlanRecord]
    """Every distinct feasible plan found, ranked by the objective (rank field set)."""
    evaluated: int
    """Distinct candidates evaluated (valid or not)."""
    counts: dict
    """Distinct candidates per outcome: ok, invalid, memory."""
    reasons: list[tuple[str, int]]
    """Rejection reasons, most common first."""
    elapsed_s: float
    """Wall time of the search."""
    space_size: int
    """Cartesian size of the space (all listed values x allocations)."""
    trials: int = 0
    """Optuna trials run by this call (0 for exhaustive)."""
    study_trials: int = 0
    """Completed trials in the study, all processes and earlier runs included."""
    study_name: str | None = None
    storage: str | None = None
    mode_note: str = ""
    """Why this method ran (the automatic choice and the plan count it was made on)."""
    collapsed: int = 0
    """Feasible plans folded into an equivalent row (same allocation, batch, predicted time and memory)."""

    def top(self, k: int | None = 10) -> list[PlanRecord]:
        return self.records[:k] if k else list(self.records)

    @property
    def best(self) -> PlanRecord | None:
        return self.records[0] if self.records else None

    def pareto(self) -> list[PlanRecord]:
        """The (iteration time, USD/Mtoken) Pareto front of the feasible plans, by time."""
        return [r for r in rank(self.records, "pareto", None) if r.pareto]

    def summary(self) -> dict:
        return {"method": self.method, "objective": self.objective, "evaluated": self.evaluated,
                "feasible": self.counts.get("ok", 0), "invalid": self.counts.get("invalid", 0),
                "out_of_memory": self.counts.get("memory", 0), "space_size": self.space_size,
                "trials": self.trials, "study_trials": self.study_trials, "study_name": self.study_name,
                "elapsed_s": round(self.elapsed_s, 3), "global_batch_size": self.problem.gbs,
                "seq_len": self.problem.seq_len, "tokens": self.problem.tokens,
                "batch_tokens": (self.problem.gbs * self.problem.seq_len
                                 if self.problem.gbs is not None else None),
                "batch_range": self.problem.batch.to_dict() if self.problem.batch is not None else None,
                "mode_note": self.mode_note,
                "collapsed_equivalent": self.collapsed}


def _space_size(problem: SearchProblem) -> int:
    """Cartesian size of the listed values times the allocations (MoE: times the EP and ETP choices)."""
    eps, etps = moe_choices(problem.model, problem.space, max(t.gpus for t in problem.targets))
    return problem.space.size() * len(problem.targets) * len(eps) * len(etps)


def _check_objective(problem: SearchProblem, objective: str) -> None:
    if objective not in OBJECTIVES:
        raise PlannerError(f"--objective {objective!r} is not one of {', '.join(OBJECTIVES)}.")
    if objective in ("cost", "pareto"):
        missing = sorted({t.hardware.gpu.name for t in problem.targets if problem.price(t.hardware) is None})
        if missing:
            raise PlannerError(f"no price known for {', '.join(missing)}; pass --price {missing[0]}=USD_PER_GPU_HOUR "
                               "to rank by cost.")


# --------------------------------------------------------------------------------- exhaustive
_FORK_STATE: tuple | None = None
"""(problem, cost model, candidates) handed to forked workers of :func:`exhaustive_search`."""


def _eval_slice(args: tuple[int, int]) -> list:
    start, step = args
    problem, cost_model, cands = _FORK_STATE
    ev = Evaluator(problem, cost_model, light=True)
    return [ev.evaluate(c) for c in cands[start::step]]


def _parallel_evaluations(problem: SearchProblem, cost_model, cands: list, jobs: int) -> list | None:
    """Evaluations of ``cands`` by ``jobs`` forked processes (None where fork is unavailable)."""
    global _FORK_STATE
    if "fork" not in mp.get_all_start_methods():
        return None
    _FORK_STATE = (problem, cost_model, cands)
    try:
        with mp.get_context("fork").Pool(jobs, initializer=ignore_sigint) as pool:
            parts = pool.map(_eval_slice, [(i, jobs) for i in range(jobs)])
    finally:
        _FORK_STATE = None
    return [e for part in parts for e in part]


DETAIL_PLANS = 10
"""Plans of an exhaustive search given the full prediction (breakdown, bottleneck, interval) by default: the
ranked table's default length; the others carry the iteration time and what derives from it."""


def exhaustive_search(problem: SearchProblem, objective: str = "time", cost_model: OperatorCostModel | None = None,
                      progress: Progress | None = None, jobs: int = 1, detail: int = DETAIL_PLANS) -> SearchResult:
    """Evaluate every valid candidate of the space (a plain loop; the ground truth). Each is ranked on its
    iteration time (:func:`planner.search.objective.quick_prediction`, the same number as a full prediction in
    about half the time); the first ``detail`` ranked plans get the full prediction. ``jobs`` > 1 splits the
    candidates over that many forked processes (worth it above a few hundred candidates)."""
    _check_objective(problem, objective)
    t0 = time.perf_counter()
    ev = Evaluator(problem, cost_model, light=True)
    cands = list(enumerate_candidates(problem))
    n = len(cands)
    evals = _parallel_evaluations(problem, ev.cost_model, cands, jobs) if jobs > 1 and n >= 256 else None
    if evals is not None:
        for c, e in zip([c for i in range(jobs) for c in cands[i::jobs]], evals):
            ev.cache[c.canonical()] = e
            ev.counts[e.status] += 1
            if e.status != "ok":
                ev.reasons[e.reason if e.status == "memory" else _reason_kind(e.reason)] += 1
        if progress is not None:
            progress(n, n)
    else:
        evals = []
        for i, c in enumerate(cands):
            evals.append(ev.evaluate(c))
            if progress is not None and (i & 127) == 0:
                progress(i, n)
        if progress is not None:
            progress(n, n)
    recs, folded = ranked_distinct([e.record for e in evals if e.record is not None], objective)
    recs[:detail] = [ev.detailed(r) for r in recs[:detail]]
    return SearchResult(problem, objective, "exhaustive", recs, ev.evaluated, dict(ev.counts),
                        ev.reasons.most_common(), time.perf_counter() - t0, _space_size(problem), collapsed=folded)


# ------------------------------------------------------------------------------------- optuna
def _optuna_release(version: str) -> tuple[int, int]:
    """(major, minor) of an Optuna version string such as '4.9.0' or '5.0.0.dev'."""
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def _make_sampler(name: str, seed: int | None, multi: bool):
    import optuna  # deferred: Optuna takes about half a second to import

    from planner.search.samplers import PerTrialSeedSampler  # deferred: imports Optuna

    # Optuna >= 5 reads constraints set with Trial.set_constraint; older versions need constraints_func.
    kw = {} if _HAS_SET_CONSTRAINT() else {"constraints_func": _constraints}
    if name == "tpe":
        # multivariate TPE models the interaction of the degrees (TP x PP x MBS ...), which a
        # per-dimension (independent) TPE cannot; the conditional dimensions (e.g. vpp@pp4, present only for one
        # PP) are sampled independently by design, so Optuna's warning about them is off (the switch exists
        # before Optuna 4.9, which deprecated it with the warning)
        quiet = {} if _optuna_release(optuna.__version__) >= (4, 9) else {"warn_independent_sampling": False}

        def factory(s):
            return optuna.samplers.TPESampler(seed=s, multivariate=True, n_startup_trials=TPE_STARTUP, **quiet, **kw)
    elif name == "nsga2":
        def factory(s):
            return optuna.samplers.NSGAIISampler(seed=s, population_size=20, **kw)
    elif name == "random":
        def factory(s):
            return optuna.samplers.RandomSampler(seed=s)
    else:
        raise PlannerError(f"--sampler {name!r} is not one of {', '.join(SAMPLERS)}.")
    # seeded per trial, so a killed and resumed study proposes what an uninterrupted one would
    return PerTrialSeedSampler(factory, seed)


RUN_ATTR = "planner_run"
"""Study user attribute: the trial budget of the latest run, so ``--resume`` can finish it."""
FAULT_ENV = "PLANNER_FAULT_KILL_AT_TRIAL"
"""Fault injection for tests (tests/test_search.py): SIGKILL this process while it evaluates the trial
that would be the study's N-th finished one, leaving it RUNNING in the storage as a real crash does."""


def _fault_point() -> int | None:
    v = os.environ.get(FAULT_ENV, "")
    return int(v) if v.isdigit() else None


def _constraints(trial) -> list[float]:
    return list(trial.user_attrs.get("constraint", [1.0]))


def _HAS_SET_CONSTRAINT() -> bool:
    import optuna  # deferred: Optuna takes about half a second to import

    return hasattr(optuna.trial.Trial, "set_constraint")


def _check_budget(n_trials: int, seed: int | None) -> None:
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0:
        raise PlannerError(f"--trials must be a non-negative integer, got {n_trials!r}.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
        raise PlannerError(f"--seed must be an integer from 0 to {2**32 - 1} (numpy's seed range), got {seed!r}.")


def _open_study(problem: SearchProblem, objective: str, storage: str | None, study_name: str | None,
                sampler: str, seed: int | None) -> MirroredStudy:
    """The study of this search, refused when ``study_name`` in ``storage`` was created for another problem."""
    multi = objective == "pareto"
    directions = ["minimize", "minimize"] if multi else ["minimize"]
    mirror = MirroredStudy(open_storage(storage), study_name, directions, _make_sampler(sampler, seed, multi))
    meta = mirror.attrs_study
    ident = json.dumps({**problem.describe(), "objective": objective}, sort_keys=True)
    old = meta.user_attrs.get("planner_problem")
    if old is None:
        meta.set_user_attr("planner_problem", ident)
    elif old != ident:
        raise PlannerError(f"study {study_name!r} in {storage} was created for a different search (model, GPUs, "
                           "space, batch or objective); use another --study-name or repeat the original flags.")
    return mirror


class _Phases(NamedTuple):
    """This run's trials, by study-wide counts of finished trials (so a resumed run picks up where the killed
    one was): the sampler proposes until the study has ``tpe_until`` finished trials, local search
    (:func:`_polish`) until it has ``until``."""

    finished: int
    """Finished trials of the study before this run."""
    tpe_until: int
    until: int

    @property
    def trials(self) -> int:
        return max(0, self.until - self.finished)

    @property
    def sampled(self) -> int:
        return max(0, self.tpe_until - self.finished)


def _plan_phases(mirror: MirroredStudy, choices: dict, n_trials: int, multi: bool, resume: bool,
                 storage: str | None, seed: int | None, sampler: str) -> _Phases:
    """The phases of a new run of ``n_trials`` (recorded in the study for ``--resume``), or with ``resume``
    those the study's latest run had left."""
    import optuna  # deferred: Optuna takes about half a second to import

    meta = mirror.attrs_study
    finished = len(mirror.local.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if resume:
        run = meta.user_attrs.get(RUN_ATTR)
        if not isinstance(run, dict) or storage is None:
            raise PlannerError("--resume needs an existing study in --storage with --study-name that an earlier "
                               "`planner search` run started; none was found.")
        if run.get("seed") != seed or run.get("sampler") != sampler:
            raise PlannerError(f"--resume must repeat the interrupted run's --seed {run.get('seed')} and --sampler "
                               f"{run.get('sampler')} (got --seed {seed}, --sampler {sampler}).")
        return _Phases(finished, int(run["tpe_until"]), int(run["until"]))
    share = MOE_POLISH_FRACTION if "ep" in choices else POLISH_FRACTION
    polish = 0 if multi or n_trials < 40 else int(n_trials * share)
    if polish:  # the sampler's share is capped: TPE costs more per trial the more trials the study has
        polish = max(polish, n_trials - TPE_MAX_TRIALS)
    phases = _Phases(finished, finished + n_trials - polish, finished + n_trials)
    if storage is not None:
        meta.set_user_attr(RUN_ATTR, {"tpe_until": phases.tpe_until, "until": phases.until, "seed": seed,
                                      "sampler": sampler})
    return phases


def _trial_objective(study, ev: Evaluator, choices: dict, answers: Answers):
    """The function Optuna calls per trial: the proposed candidate's outcome (:class:`Answers`: evaluated once per
    distinct plan, a repeated one answered from its first trial), its constraint, status and record set as the
    trial's user attributes; a rejected one scores INFEASIBLE_VALUE. Honours FAULT_ENV."""
    import optuna  # deferred: Optuna takes about half a second to import

    use_set_constraint = _HAS_SET_CONSTRAINT()
    who = owner()
    kill_at = _fault_point()

    def obj(trial):
        trial.set_user_attr(OWNER_ATTR, who)
        if kill_at is not None and len(study.get_trials(deepcopy=False, states=(
                optuna.trial.TrialState.COMPLETE,))) + 1 >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: die mid-trial (tests only)
        a = answers.answer(suggest_candidate(trial, choices), ev)
        for key, value in a.attrs.items():
            trial.set_user_attr(key, value)
        if use_set_constraint:
            trial.set_constraint("plan", a.violation)
        return a.value

    return obj


class _Halt:
    """Stop the run: Ctrl-C (``stop``, an :class:`InterruptFlag`) or every valid plan evaluated."""

    def __init__(self, stop: InterruptFlag, answers: Answers):
        self.stop, self.answers = stop, answers

    @property
    def hit(self) -> bool:
        return self.stop.hit or self.answers.covered


def _run_phases(mirror: MirroredStudy, obj, choices: dict, phases: _Phases, ev: Evaluator,
                progress: Progress | None, answers: Answers) -> int:
    """Run the sampler's then the local search's trials; the number run. The run stops early once every valid
    plan of the space has been evaluated (``answers.covered``). Ctrl-C stops after the running trial and raises
    :class:`Interrupted` (resumable when the study is stored)."""
    study = mirror.local
    done = [0]
    stop = InterruptFlag()
    halt = _Halt(stop, answers)

    def tick(study_, trial_):
        done[0] += 1
        mirror.after_trial(study_, trial_)
        if halt.hit:
            study_.stop()
        if progress is not None:
            progress(done[0], phases.trials)

    if not (choices and phases.trials) or answers.covered:
        return 0
    polish = phases.trials - phases.sampled
    with stop:
        if phases.sampled:
            study.optimize(obj, n_trials=phases.sampled, callbacks=[tick], gc_after_trial=False)
        left = _polish(study, obj, choices, polish, tick, ev, halt) if polish and not halt.hit else 0
        if left and not halt.hit:
            study.optimize(obj, n_trials=left, callbacks=[tick], gc_after_trial=False)
        mirror.flush()
    if stop.hit:
        raise Interrupted("resume with --resume" if mirror.remote is not None else "", resumable=(
            mirror.remote is not None))
    return done[0]


class _Tally(NamedTuple):
    """The completed trials of a study, per distinct plan."""

    records: list[PlanRecord]
    """The feasible plans, each from the lowest trial number that found it."""
    distinct: int
    """Distinct candidates evaluated."""
    status: Counter
    """Distinct candidates per outcome."""
    reasons: Counter
    """Rejection reasons of the distinct rejected candidates."""


def _tally(complete: list) -> _Tally:
    recs, status, reasons = [], Counter(), Counter()
    seen = set()
    for t in complete:
        key = tuple(sorted(t.params.items()))
        st = t.user_attrs.get("status", "invalid")
        if key not in seen:
            seen.add(key)
            status[st] += 1
            if st != "ok":
                r = t.user_attrs.get("reason", "")
                reasons[_reason_kind(r) if st == "invalid" else r] += 1
        if st == "ok" and "record" in t.user_attrs:
            recs.append(replace(PlanRecord.from_dict(t.user_attrs["record"]), trial=t.number))
    recs.sort(key=lambda r: r.trial)
    first: dict = {}
    for r in recs:
        first.setdefault(r.key(), r)
    return _Tally(list(first.values()), len(seen), status, reasons)


def optuna_search(problem: SearchProblem, objective: str = "time", n_trials: int = DEFAULT_TRIALS,
                  seed: int | None = None, sampler: str = "tpe", storage: str | None = None,
                  study_name: str | None = None, cost_model: OperatorCostModel | None = None,
                  progress: Progress | None = None, resume: bool = False) -> SearchResult:
    """Run ``n_trials`` more trials of an Optuna study over the space's categorical dimensions.

    Each dimension is one categorical with choices fixed before the study
    (:func:`planner.search.space.dimension_choices`); invalid and out-of-memory combinations are
    reported through Optuna's constraints (``Trial.set_constraint``; ``constraints_func`` before Optuna 5),
    so samplers rank them after every feasible trial. Single-objective studies spend the last
    POLISH_FRACTION of the trials on a constraint-aware local search around the best plans (:func:`_polish`).
    With ``study_name`` the study is
    kept in ``storage`` (default ``sqlite:///planner.db``); running again resumes and extends it, and
    several processes on one storage share it. The result holds the records of every completed
    trial of the study, not only this call's.

    Trials left running by a killed process of this host are failed and their parameters queued again
    (:func:`recover_stale_trials`). ``resume=True`` finishes the study's latest run instead of adding
    ``n_trials``: it runs only the trials that run had left, with its seed and phases, so a search killed
    mid-way and resumed ends with the same trials and ranking as an uninterrupted one.
    """
    _check_objective(problem, objective)
    _check_budget(n_trials, seed)
    import optuna  # deferred: Optuna takes about half a second to import

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    t0 = time.perf_counter()
    if study_name is not None and storage is None:
        storage = "sqlite:///planner.db"
    mirror = _open_study(problem, objective, storage, study_name, sampler, seed)
    choices = dimension_choices(problem)
    ev = Evaluator(problem, cost_model)
    if mirror.remote is not None:
        recover_stale_trials(mirror.remote)
    mirror.load()
    phases = _plan_phases(mirror, choices, n_trials, objective == "pareto", resume, storage, seed, sampler)
    answers = Answers(choices, objective)
    answers.learn(mirror.local.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if choices:
        answers.watch(valid_plans(problem, ev, len(answers.known) + phases.trials))
    obj = _trial_objective(mirror.local, ev, choices, answers)
    done = _run_phases(mirror, obj, choices, phases, ev, progress, answers)
    complete = mirror.complete_trials()  # earlier runs and other processes included
    tally = _tally(complete)
    ranked, folded = ranked_distinct(tally.records, objective)
    res = SearchResult(problem, objective, f"optuna-{sampler}", ranked, tally.distinct, dict(tally.status),
                       tally.reasons.most_common(), time.perf_counter() - t0, _space_size(problem), trials=done,
                       study_trials=len(complete), study_name=study_name, storage=storage, collapsed=folded)
    if answers.covered and done < phases.trials:
        res.mode_note = (f"stopped after {done:,} of {phases.trials:,} trials: every one of the space's "
                         f"{answers.total:,} valid plans has been evaluated, so the result is the exhaustive search's")
    return res


def as_trial(c: Candidate, choices: dict) -> Candidate:
    """The candidate a trial with ``c``'s parameters evaluates (canonical): a dimension with one choice is not a
    trial parameter, so it takes that choice whatever ``c`` holds (a local move from TP 1 to TP 2 keeps
    sequence_parallel False, which a space of ``sequence_parallel = [true]`` cannot propose)."""
    return candidate_from_params(candidate_params(c, choices), choices).canonical()


def _repair(c: Candidate, choices: dict, ev: Evaluator) -> Candidate | None:
    """``c`` if it is valid and fits, else the first feasible variant with a smaller micro-batch or
    more recomputation (memory checks only, microseconds each), else None."""
    if ev.feasible(c):
        return c
    mbs = [m for m in choices["mbs"] if m <= c.mbs][::-1]
    rcs = choices["recompute"][choices["recompute"].index(c.recompute):] if c.recompute in choices["recompute"] else []
    for rc in rcs:
        for m in mbs:
            n = c._replace(mbs=m, recompute=rc)
            if ev.feasible(n):
                return n
    return None


class _Moves:
    """The local moves of each plan, repaired (:func:`_repair`) and worked out once: a plan's moves never change
    and the tried plans only grow, so a plan none of whose moves is untried is never looked at again (the
    local search's rounds would otherwise redo every plan's moves: quadratic in the trials)."""

    def __init__(self, choices: dict, ev: Evaluator):
        self.choices, self.ev = choices, ev
        self.moves: dict[Candidate, list[Candidate]] = {}
        self.spent: set[Candidate] = set()

    def untried(self, c: Candidate, seen: set) -> list[Candidate]:
        """The repaired neighbours of ``c`` not in ``seen``, in :func:`neighbours` order, without repeats."""
        if c in self.spent:
            return []
        found = self.moves.get(c)
        if found is None:
            repaired = (_repair(as_trial(n, self.choices), self.choices, self.ev) for n in neighbours(c, self.choices))
            found = self.moves[c] = list(dict.fromkeys(r.canonical() for r in repaired if r is not None))
        out = [r for r in found if r not in seen]
        if not out:
            self.spent.add(c)
        return out


def _polish(study, obj, choices: dict, budget: int, tick, ev: Evaluator, stop=None) -> int:
    """Constraint-aware local search with enqueued trials: take the untried neighbours
    (:func:`planner.search.space.neighbours`) of the best feasible trial, repair those that break a
    rule or do not fit (:func:`_repair`; cheap checks, no trial spent) and evaluate them; when none
    is left (a local optimum), move on to the next-best trial. Stops when the budget is spent or no
    feasible trial has untried feasible neighbours. Returns the unspent budget."""
    import optuna  # deferred: Optuna takes about half a second to import

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)
    cands: dict[int, Candidate] = {}  # trial number -> canonical candidate (params never change)

    def cand(t) -> Candidate:
        c = cands.get(t.number)
        if c is None:
            c = cands[t.number] = candidate_from_params(t.params, choices).canonical()
        return c

    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if waiting and budget > 0:  # a batch queued by a killed run: finish it first, as that run would have
        n = min(len(waiting), budget)
        study.optimize(obj, n_trials=n, callbacks=[tick], gc_after_trial=False)
        budget -= n
    basins = "ep" in choices or len(choices["pp"]) > 1  # (PP, EP) basins: MoE, or dense with a PP choice
    moves = _Moves(choices, ev)
    if basins and budget > 0 and not (stop is not None and stop.hit):
        budget = group_sweep(study, obj, choices, budget, tick, ev, cand)
    rounds = 0
    while budget > 0 and not (stop is not None and stop.hit):
        trials = study.get_trials(deepcopy=False, states=states)
        seen = {cand(t) for t in trials}
        ok = sorted((t for t in trials if t.state == optuna.trial.TrialState.COMPLETE
                     and t.user_attrs.get("status") == "ok"), key=lambda t: t.value)
        if basins:  # the best plans of the best (PP, EP) basins take turns (planner.search.sweep)
            ok = basin_turns(ok, cand, rounds)
            rounds += 1
        todo = next((u for t in ok if (u := moves.untried(cand(t), seen))), [])
        if not todo:
            return budget
        batch = todo[:budget]
        for n in batch:
            study.enqueue_trial(candidate_params(n, choices))
        study.optimize(obj, n_trials=len(batch), callbacks=[tick], gc_after_trial=False)
        budget -= len(batch)
    return budget


def count_plans(problem: SearchProblem, limit: int | None = None) -> int:
    """Valid plans of the space that fit in memory (the cheap checks only, no prediction); counting stops
    past ``limit``."""
    ev = Evaluator(problem)
    n = 0
    for c in enumerate_candidates(problem):
        if ev.feasible(c):
            n += 1
            if limit is not None and n > limit:
                break
    return n


def choose_mode(n_plans: int, max_plans: int = EXHAUSTIVE_MAX_PLANS) -> str:
    """'exhaustive' when the space's ``n_plans`` valid plans are within the exhaustive budget, else 'optuna'."""
    return "exhaustive" if n_plans <= max_plans else "optuna"


def search(problem: SearchProblem, objective: str = "time", *, exhaustive: bool = False, jobs: int = 1,
           n_trials: int = DEFAULT_TRIALS, seed: int | None = None, sampler: str = "tpe",
           storage: str | None = None, study_name: str | None = None,
           cost_model: OperatorCostModel | None = None, progress: Progress | None = None,
           resume: bool = False, mode: str = "auto", max_plans: int = EXHAUSTIVE_MAX_PLANS,
           detail: int = DETAIL_PLANS) -> SearchResult:
    """Run a search; ``result.records`` are the ranked feasible plans (for tables, reports, exports).

    ``mode`` auto (default): count the space's valid plans first and evaluate them all when there are at
    most ``max_plans`` (the exhaustive search is then both exact and faster than a study), else run Optuna;
    a study (``storage``/``study_name``/``resume``) always runs Optuna. ``exhaustive=True`` is mode
    'exhaustive'. ``result.mode_note`` says which ran and why. ``detail``: ranked plans of an exhaustive search
    given the full prediction (the ones printed)."""
    if mode not in MODES:
        raise PlannerError(f"--mode {mode!r} is not one of {', '.join(MODES)}.")
    if exhaustive:
        mode = "exhaustive"
    note = f"--mode {mode}"
    if mode == "auto":
        if storage is not None or study_name is not None or resume:
            mode, note = "optuna", "auto: Optuna, because a study (--storage/--study-name) was given"
        else:
            n = count_plans(problem, max_plans)
            mode = choose_mode(n, max_plans)
            note = (f"auto: exhaustive, the space has {n:,} valid plans by the quick memory check (<= {max_plans:,})"
                    if mode == "exhaustive"
                    else f"auto: Optuna {sampler}, the space has more than {max_plans:,} valid plans")
    if mode == "exhaustive":
        res = exhaustive_search(problem, objective, cost_model, progress, jobs, detail)
    else:
        res = optuna_search(problem, objective, n_trials, seed, sampler, storage, study_name, cost_model, progress,
                            resume)
    res.mode_note = f"{note}; {res.mode_note}" if res.mode_note else note
    return res


EQUIVALENT_MEMORY_GIB = 0.1
"""Plans with identical predicted time whose memory differs by less than this fold into one row: the
ranked tables print memory to 0.1 GiB, so such rows read as duplicates."""


def ranked_distinct(records: list[PlanRecord], objective: str) -> tuple[list[PlanRecord], int]:
    """``records`` ranked by the objective with equivalent plans folded into one row: plans on the same
    allocation and batch with identical predicted iteration time and cost and memory within
    EQUIVALENT_MEMORY_GIB (e.g. selective recompute that recomputes nothing, ZeRO-3 at DP 1). The row kept
    is the group's plan needing least memory; its ``equivalent`` says how each other one differs.
    Returns (ranked records, number folded)."""
    groups: dict[tuple, list[PlanRecord]] = {}
    for r in records:
        key = (r.gpu, r.cluster, r.gpus, r.gpus_per_node, r.gbs, r.seq_len, f"{r.iteration_time_s:.12g}",
               None if r.usd_per_mtoken is None else f"{r.usd_per_mtoken:.12g}")
        groups.setdefault(key, []).append(r)
    out: list[PlanRecord] = []
    folded = 0
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        group = sorted(group, key=lambda r: (r.memory_gib_per_gpu, r.key()))
        while group:
            keep = group[0]
            same = [r for r in group if r.memory_gib_per_gpu - keep.memory_gib_per_gpu < EQUIVALENT_MEMORY_GIB]
            folded += len(same) - 1
            out.append(replace(keep, equivalent=[_difference(keep, r) for r in same[1:]]))
            group = group[len(same):]
    return rank(out, objective, None), folded


_PLAN_FIELDS = ("tp", "pp", "dp", "cp", "vpp", "mbs", "recompute", "sequence_parallel", "zero", "dtype", "framework",
               "ep", "etp")


def _difference(a: PlanRecord, b: PlanRecord) -> str:
    """How plan ``b`` differs from ``a``, e.g. 'recompute=none (+0.05 GiB)'."""
    text = " ".join(f"{f}={getattr(b, f)}" for f in _PLAN_FIELDS if getattr(a, f) != getattr(b, f)) or "same plan"
    extra = b.memory_gib_per_gpu - a.memory_gib_per_gpu
    return f"{text} (+{extra:.2f} GiB)" if extra >= 0.005 else text
