"""An Optuna sampler whose proposals depend only on the seed and the finished trials.

Optuna's samplers draw from one random stream seeded once per process, so a study that is killed and
resumed in a new process proposes other plans than an uninterrupted run with the same seed would.
:class:`PerTrialSeedSampler` builds the wrapped sampler afresh before every trial, seeded from
``(seed, number of finished trials)``; TPE, NSGA-II and random sampling keep no other state between
trials (they re-read the study's history), so a resumed study proposes exactly what the uninterrupted
one would have (issue #6, tests/test_search.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import optuna
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
"""Trials that count towards the per-trial seed (a trial killed mid-way is failed and not counted)."""

HISTORY_CACHES = ("_search_space", "_intersection_search_space")
"""Attributes of Optuna's samplers that cache what the study's history implies and nothing drawn at random:
``IntersectionSearchSpace`` (TPE, NSGA-II, CMA-ES; GP's ``_intersection_search_space``) keeps the
intersection of the finished trials' distributions and a cursor, and adds only trials past the cursor
(optuna/search_space/intersection.py). A sampler made afresh before every trial starts the cursor at 0 and
re-reads every trial: 21 of 38 s of a 600-trial llama-13b study on the dev machine, quadratic in trials.
Handing the cache to the new sampler gives the same search space (an intersection does not depend on the
order it is taken in) from the new trials alone."""


def carry_history_caches(old: BaseSampler, new: BaseSampler) -> None:
    """Give ``new`` the history caches (:data:`HISTORY_CACHES`) of ``old``, a sampler of the same class."""
    if type(old) is not type(new):
        return
    for name in HISTORY_CACHES:
        cache = getattr(old, name, None)
        if cache is not None and type(cache) is type(getattr(new, name, None)):
            setattr(new, name, cache)


def trial_seed(seed: int, n_finished: int) -> int:
    """The seed of the trial proposed after ``n_finished`` finished trials (numpy SeedSequence: the same on
    every platform and Python version)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, n_finished]).generate_state(1)[0])


class PerTrialSeedSampler(BaseSampler):
    """Wraps the sampler ``factory(seed)`` makes; with a seed, re-makes it before each trial with
    :func:`trial_seed`. Without a seed it is the wrapped sampler, made once."""

    def __init__(self, factory: Callable[[int | None], BaseSampler], seed: int | None):
        self._factory, self._seed = factory, seed
        self._inner = factory(seed)

    @property
    def inner(self) -> BaseSampler:
        return self._inner

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self._seed is not None:
            n = len(study.get_trials(deepcopy=False, states=FINISHED))
            old, self._inner = self._inner, self._factory(trial_seed(self._seed, n))
            carry_history_caches(old, self._inner)
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()
