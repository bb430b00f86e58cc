"""Physical shape constraints on measured operator models (issue 15, item 5).

Tree ensembles are piecewise constant between their samples and constant outside them, so on their own they
give shapes no kernel has. Three corrections, each applied by :class:`~costmodel.cost.measured.MeasuredCostModel`:

* **Anchored extrapolation** (attention): outside the sampled feature box the tree's value at the nearest
  sampled point (features clipped into the box) is scaled by the analytical roofline's ratio between the
  asked point and that anchor, ``t(x) = t_tree(clip(x)) * roof(x) / roof(clip(x))``: the measured level, the
  roofline's dependence on size (work, bytes and the launch floor).
* **Monotone collectives**: per (kind, ranks, nodes, ranks per node, dtype) the tree is evaluated on a byte
  grid spanning its sampled range, made non-decreasing by isotonic regression (pool-adjacent-violators,
  Barlow et al. 1972; what sklearn's IsotonicRegression computes), interpolated log-log between the centres
  of its plateaus (:func:`knots`), and anchored to the alpha-beta model (which has the latency term) below
  the smallest and above the largest sampled size.
* **Attention backward >= forward**: the FlashAttention backward recomputes the forward's scores and adds
  three more matmuls (5 vs 2, Dao, "FlashAttention-2", arXiv 2307.08691, §3.1.2), so it never takes less time.
"""

from __future__ import annotations

import numpy as np

GRID_STEPS_PER_OCTAVE = 8
"""Byte-grid resolution of the collective envelopes (1/8 octave: finer than nccl-tests' factor-2 sweeps)."""

ANCHORED_KINDS = frozenset({"attention_fwd", "attention_bwd"})
"""Operator kinds whose out-of-range predictions are anchored to the roofline (the attention sweeps of the
different sources cover different boxes: estimate-train-time batch 4-8 x 1,024-5,120 tokens, aiconfigurator
inference shapes; shared/data PROVENANCE)."""


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of ``y`` (equal weights), pool-adjacent-violators."""
    vals: list[float] = []
    sizes: list[int] = []
    for v in np.asarray(y, dtype=float):
        vals.append(float(v))
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            n = sizes[-2] + sizes[-1]
            merged = (vals[-2] * sizes[-2] + vals[-1] * sizes[-1]) / n
            vals[-2:] = [merged]
            sizes[-2:] = [n]
    return np.repeat(vals, sizes)


def byte_grid(lo: float, hi: float) -> np.ndarray:
    """Log-spaced bytes from ``lo`` to ``hi`` (both included)."""
    lo, hi = max(lo, 1.0), max(hi, lo, 1.0)
    n = max(2, int(np.ceil(np.log2(hi / lo) * GRID_STEPS_PER_OCTAVE)) + 1)
    return np.exp2(np.linspace(np.log2(lo), np.log2(hi), n))


def knots(grid: np.ndarray, curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log2 bytes, log2 seconds) knots of a non-decreasing step ``curve`` on ``grid``: one at the start of each
    plateau, plus the largest sampled size. xgboost's histogram splits fall at sample values (a sample opens the
    plateau to its right: nccl-tests' 2^k sizes give steps at 2^k), so interpolating between plateau starts goes
    through the samples' levels instead of stepping between them."""
    lx, ly = np.log2(grid), np.log2(np.maximum(curve, 1e-15))
    starts = np.flatnonzero(np.r_[True, np.diff(ly) > 1e-12])
    if starts[-1] != len(ly) - 1:
        starts = np.r_[starts, len(ly) - 1]
    return lx[starts], ly[starts]


def envelope_at(env: tuple[np.ndarray, np.ndarray], nbytes: np.ndarray) -> np.ndarray:
    """Seconds at ``nbytes`` from :func:`knots`: log-log interpolation, clamped to the sampled range."""
    xs, ys = env
    return np.exp2(np.interp(np.log2(np.maximum(nbytes, 1.0)), xs, ys))


def clip_to_box(raw: np.ndarray, names: tuple, ranges: dict) -> tuple[np.ndarray, np.ndarray]:
    """(raw clipped into the sampled box, rows that were outside it)."""
    out = raw.copy()
    for j, f in enumerate(names):
        rng = ranges.get(f)
        if rng is not None:
            out[:, j] = np.clip(out[:, j], rng[0], rng[1])
    return out, np.any(out != raw, axis=1)
