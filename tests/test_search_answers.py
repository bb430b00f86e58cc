"""Optuna search bookkeeping: a repeated plan is answered from its first trial, never costed again (in one process,
and across a stored study's runs); a run whose trials have evaluated every valid plan stops and gives the exhaustive
search's optimum; the per-trial seeded sampler keeps its search-space cache; the local search proposes only plans a
trial can evaluate."""

from __future__ import annotations

import optuna
import pytest

from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.cost.roofline import RooflineCostModel
from planner.search import engine
from planner.search.engine import as_trial, exhaustive_search, open_storage, optuna_search
from planner.search.objective import Evaluator
from planner.search.samplers import PerTrialSeedSampler, carry_history_caches
from planner.search.space import Candidate, build_problem, dimension_choices, load_space, make_target


@pytest.fixture(scope="module")
def roofline():
    return RooflineCostModel()


def _problem(gpus: int = 16, **space):
    cat = load_catalogue()
    sp = load_space("default").override(**space)
    return build_problem(resolve_model("llama-13b"), [make_target(cat.resolve("a100-80gb"), gpus)], sp)


SMALL = dict(tp=[1, 2], pp=[1, 2], cp=[1], vpp=[1], mbs=[1, 2], recompute=["selective"], zero=[1])
"""5 valid plans of 8 candidates on llama-13b / 16 GPUs."""
MEDIUM = dict(tp=[1, 2, 4], pp=[1, 2, 4], cp=[1], vpp=[1], mbs=[1, 2, 4], recompute=["selective", "full"], zero=[1, 3])
"""93 valid plans on llama-13b / 16 GPUs."""


@pytest.fixture
def costings(monkeypatch):
    """Counts the candidates the search costs (Evaluator._evaluate: the rule checks, memory and prediction)."""
    seen: list[Candidate] = []
    real = Evaluator._evaluate

    def counting(self, cand):
        seen.append(cand)
        return real(self, cand)

    monkeypatch.setattr(Evaluator, "_evaluate", counting)
    return seen


def test_repeated_plans_are_not_costed_again(roofline, costings):
    res = optuna_search(_problem(**MEDIUM), n_trials=60, seed=0, cost_model=roofline)
    assert res.trials == 60 and res.evaluated < res.trials  # the sampler proposed some plans more than once
    assert len(costings) == len(set(costings)) == res.evaluated  # each distinct plan costed exactly once


def test_a_stored_study_answers_its_earlier_plans_without_costing_them(tmp_path, roofline, costings):
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = optuna_search(_problem(**MEDIUM), n_trials=20, seed=0, storage=url, study_name="s", cost_model=roofline)
    n_first = len(costings)
    assert n_first == first.evaluated
    second = optuna_search(_problem(**MEDIUM), n_trials=30, seed=1, storage=url, study_name="s", cost_model=roofline)
    assert second.study_trials == 50
    # the second run (a new Evaluator, as a new process has) costs only the plans the study had not seen
    assert len(costings) - n_first == second.evaluated - first.evaluated
    assert not set(costings[:n_first]) & set(costings[n_first:])


def test_a_run_that_evaluated_every_valid_plan_stops_with_the_exhaustive_optimum(roofline):
    problem = _problem(**SMALL)
    exact = exhaustive_search(problem, cost_model=roofline)
    res = engine.search(problem, mode="optuna", n_trials=500, seed=3, cost_model=roofline)
    assert res.trials < 500
    assert "every one of the space's 5 valid plans has been evaluated" in res.mode_note
    assert res.counts.get("ok", 0) == exact.counts.get("ok", 0)
    assert res.best.key() == exact.best.key() and res.best.iteration_time_s == exact.best.iteration_time_s
    # a stored study already covered runs nothing more
    assert optuna_search(problem, n_trials=0, seed=3, cost_model=roofline).trials == 0


def test_optuna_finds_the_exhaustive_optimum_of_a_medium_space(roofline):
    problem = _problem(**MEDIUM)
    exact = exhaustive_search(problem, cost_model=roofline)
    res = optuna_search(problem, n_trials=300, seed=0, cost_model=roofline)
    assert res.best.key() == exact.best.key()
    assert res.best.iteration_time_s == pytest.approx(exact.best.iteration_time_s, rel=1e-9)


def test_a_space_larger_than_the_budget_is_not_watched(roofline):
    res = optuna_search(_problem(**MEDIUM), n_trials=40, seed=0, cost_model=roofline)
    assert res.trials == 40 and "stopped" not in res.mode_note


def test_local_search_proposes_only_plans_a_trial_evaluates(tmp_path, roofline):
    """A local move from TP 1 to TP 2 keeps sequence_parallel False; the default space lists only True, so a trial
    with those parameters evaluates SP True. Every local-search trial evaluates a plan not tried before (proposing
    the SP False plan instead re-ran one plan over and over: 7 distinct plans in 30 local-search trials)."""
    problem = _problem(**MEDIUM)
    choices = dimension_choices(problem)
    assert choices["sequence_parallel"] == [True]
    moved = Candidate(0, 2, 1, 1, 1, 1, "selective", False, 1, "bf16", "megatron")
    assert as_trial(moved, choices).sequence_parallel is True
    url = f"sqlite:///{tmp_path / 's.db'}"
    n = 120
    optuna_search(problem, n_trials=n, seed=0, storage=url, study_name="s", cost_model=roofline)
    trials = optuna.load_study(study_name="s", storage=open_storage(url)).get_trials(deepcopy=False)
    polished = [tuple(sorted(t.params.items())) for t in trials if t.number >= n - int(n * engine.POLISH_FRACTION)]
    earlier = {tuple(sorted(t.params.items())) for t in trials if t.number < n - int(n * engine.POLISH_FRACTION)}
    assert len(polished) == 30 and len(set(polished)) == 30 and not set(polished) & earlier


def _study(seed: int, carry: bool, monkeypatch) -> tuple[list, set]:
    """The trials' parameters of a seeded 40-trial TPE study, and the ids of the search-space caches it used."""
    if not carry:
        monkeypatch.setattr("planner.search.samplers.carry_history_caches", lambda old, new: None)
    sampler = PerTrialSeedSampler(lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, n_startup_trials=5),
                                  seed)
    study = optuna.create_study(sampler=sampler)
    held: list = []  # the caches themselves, kept alive so that no two share an id()

    def objective(trial):
        held.append(sampler.inner._search_space)
        a = trial.suggest_categorical("a", [1, 2, 4, 8])
        b = trial.suggest_categorical("b", ["x", "y", "z"])
        c = trial.suggest_categorical(f"c@{a}", [1, 2]) if a > 1 else 0
        return abs(a - 4) + {"x": 0.5, "y": 0.0, "z": 1.0}[b] + c

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=40)
    return [t.params for t in study.trials], {id(c) for c in held}


def test_seeded_sampler_keeps_its_search_space_cache_and_proposes_the_same(monkeypatch):
    with_cache, caches = _study(7, True, monkeypatch)
    assert len(caches) == 1  # one cache walked the study once, not a fresh one re-reading every trial
    without, fresh = _study(7, False, monkeypatch)
    assert len(fresh) == 40
    assert with_cache == without  # the same proposals as a sampler that recomputes the space every trial


def test_carry_history_caches_only_between_samplers_of_one_class():
    tpe = optuna.samplers.TPESampler(seed=0)
    other = optuna.samplers.RandomSampler(seed=0)
    carry_history_caches(tpe, other)
    assert not hasattr(other, "_search_space")
    fresh = optuna.samplers.TPESampler(seed=1)
    carry_history_caches(tpe, fresh)
    assert fresh._search_space is tpe._search_space
