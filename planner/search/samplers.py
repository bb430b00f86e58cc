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
            self._inner = self._factory(trial_seed(self._seed, n))
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
