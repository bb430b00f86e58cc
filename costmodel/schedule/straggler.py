"""Waiting for the slowest rank: how a rank-skew excess measured on a few ranks scales to n ranks.

Ranks that synchronise wait for the slowest, so a step pays E[max over ranks] of the compute between two
synchronisations where a single-process sample measures the mean. The excess is measured on a few ranks
(costmodel/profiling/sampling/skew.py) and scaled to the ``n`` ranks of a plan by the expected maximum of ``n`` standard
normals relative to the measured count, assuming independent, normally distributed rank speeds
(costmodel.schedule.compose.straggler_wait states the assumption in the prediction's warnings).
"""

from __future__ import annotations

import math

import numpy as np


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (Tippett 1925, Biometrika 17: 364-387, Table; e_2 = 1/sqrt(pi)).

    Numerical integral of x * n * phi(x) * Phi(x)^(n-1) on [-12, 12]; 0 for n = 1.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 48001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    y = x * n * phi * cdf ** (n - 1)
    return float(np.sum((y[1:] + y[:-1]) * 0.5 * np.diff(x)))


def rank_scale(n: int, measured_ranks: int) -> float:
    """Excess for ``n`` synchronising ranks relative to the ``measured_ranks`` it was measured on."""
    if n <= 1:
        return 0.0
    return expected_max_normal(n) / expected_max_normal(max(2, measured_ranks))
