"""The layer split of an uneven pipeline: of the splits Megatron-Core can build
(:mod:`costmodel.core.specs.plan`), the one with the shortest predicted pipeline that fits in memory, from one
costing of the plan (:func:`balanced_layer_split`, called by :func:`costmodel.estimate.estimate`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan, account_for_splits
from costmodel.graph.build import OperatorGraph
from costmodel.memory.per_gpu import fits_in_memory, memory_per_gpu
from costmodel.schedule.compose import Times, layer_and_stage_times
from costmodel.schedule.timeline import pipeline_time


def split_fits(model: ModelSpec, plan: ParallelPlan, hardware: Hardware) -> Callable[[tuple[int, ...]], bool]:
    """Whether ``plan`` with a given layer split fits the GPU's memory (the test :func:`metrics` reports)."""
    def fits(split: tuple[int, ...]) -> bool:
        return fits_in_memory(memory_per_gpu(model, replace(plan, layer_split=split), hardware.gpu), hardware.gpu)
    return fits


def balanced_layer_split(graph: OperatorGraph, times: Times, hardware: Hardware, num_layers: int,
                         top: int = 4, fits: Callable[[tuple[int, ...]], bool] | None = None) -> tuple[int, ...]:
    """The Megatron-expressible split of ``num_layers`` (first and last stage sizes free, middle stages equal,
    multiples of VPP, or an --account-for-embedding/loss split: costmodel.core.specs.plan) with the shortest
    predicted pipeline, from one costing.

    ``graph`` is any split of the plan (costed into ``times``): every stage runs the same layer, so a
    stage's time per micro-batch is layers x (layer fwd + bwd) plus its once-per-micro-batch ops (embedding
    on the first, final norm + LM head + loss on the last). Per middle size the first-stage sizes nearest to
    balancing first against last are scored by the slowest stage; the ``top`` best go through the 1F1B
    closed form (:func:`pipeline_time`), the shortest wins (ties: fewer layers on the last, then the first
    stage). The per-iteration tail (a stage's DP gradient reduction and optimizer step, a few layers'
    worth apart between candidates) is left out of the choice.

    ``fits`` (e.g. :func:`split_fits`): the fastest split that fits in memory wins; the first stage holds the
    embedding and the most in-flight micro-batches, so the fastest split is not always one that fits. The
    candidates past the ``top`` are taken in the order of their slowest stage; when none fits, the fastest.
    """
    p, v, m = len(graph.stages), graph.vpp, graph.num_microbatches
    if p == 1:
        return (num_layers,)
    overlaps = hardware.cluster.comm_overlaps_compute
    first_st = layer_and_stage_times(graph.stages[0], times, overlaps)
    last_st = layer_and_stage_times(graph.stages[-1], times, overlaps)
    lf, lb, f0, b0 = first_st.layer_fwd_s, first_st.layer_bwd_s, first_st.stage_fwd_s, first_st.stage_bwd_s
    fl, bl = last_st.stage_fwd_s, last_st.stage_bwd_s
    t, e0, el = lf + lb, f0 + b0, fl + bl
    scored: list[tuple[float, int, int, int]] = []
    for mid in ([] if num_layers % v else [0] if p == 2 else range(v, num_layers // (p - 2) + 1, v)):
        rest = num_layers - mid * (p - 2)
        if rest < 2 * v:
            break
        ideal = (rest * t + el - e0) / (2 * t) if t > 0 else rest / 2
        lo = min(max(v, int(ideal // v) * v), rest - v)
        for first in {lo, min(lo + v, rest - v)}:
            last = rest - first
            scored.append((max(first * t + e0, mid * t, last * t + el), last, first, mid))
    for split in account_for_splits(num_layers, p, v):  # embedding / loss counted as a layer
        first, mid, last = split[0], split[1] if p > 2 else 0, split[-1]
        scored.append((max(first * t + e0, mid * t, last * t + el), last, first, mid))
    if not scored:
        raise ValueError(f"no Megatron-expressible split of {num_layers} layers over PP={p} x VPP={v}")
    scored.sort()
    evaluated: list[tuple[tuple, tuple[int, ...]]] = []
    p2p = times[graph.p2p.key()] if graph.p2p is not None else 0.0
    for c in scored[:top]:
        _, last, first, mid = c
        fwd = [first * lf + f0] + [mid * lf] * (p - 2) + [last * lf + fl]
        bwd = [first * lb + b0] + [mid * lb] * (p - 2) + [last * lb + bl]
        evaluated.append(((pipeline_time(fwd, bwd, m, v, p2p).time_s, last, first), _split(c, p)))
    # (time, last, first) names one split (first and last fix the middle), so the order has no ties
    ranked = [s for _, s in sorted(evaluated)]
    fastest = ranked[0]
    if fits is None or fits(fastest):
        return fastest
    ranked += [_split(c, p) for c in scored[top:]]
    return next((s for s in ranked if fits(s)), fastest)


def _split(candidate: tuple[float, int, int, int], p: int) -> tuple[int, ...]:
    _, last, first, mid = candidate
    return (first,) + (mid,) * (p - 2) + (last,)
