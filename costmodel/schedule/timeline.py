"""Pipeline-parallel timeline: a closed form for every prediction and an exact simulator.

Schedules modelled
------------------
* non-interleaved 1F1B (PipeDream-Flush), Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC21 (arXiv 2104.04473) §2.2.1: stage i runs
  min(p-i-1, m) warm-up forwards, then alternates one forward / one backward, then drains backwards.
* interleaved 1F1B, SC21 §2.2.2, with the op order of Megatron-LM
  ``forward_backward_pipelining_with_interleaving`` (megatron/core/pipeline_parallel/schedules.py):
  model chunk c of stage i is virtual stage c*p + i; stage i runs (p-i-1)*2 + (v-1)*p warm-up
  forward chunks (all m*v of them when m == p), forward op k is chunk (k mod p*v) // p of
  micro-batch (k // (p*v))*p + k mod p, backward op k walks the chunks in reverse order.

:func:`simulate_1f1b` is the reference: a dependency simulation of that exact op order, where a
forward waits for the previous virtual stage's forward (+ ``p2p_s`` when the two virtual stages
sit on different devices), a backward waits for its own forward and for the next virtual stage's
backward (+ ``p2p_s``), and each device runs one op at a time. A send costs latency on the edge,
not device time (the compute stream is free while the message flies).

:func:`pipeline_time` is the closed form used for every prediction; its derivation and its
measured deviation from the simulator are documented on the function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.core.errors import PlannerError


@dataclass(frozen=True)
class PipelineResult:
    """Closed-form timing of the forward+backward pass of one iteration through the pipeline."""

    time_s: float
    """Forward+backward of all micro-batches through the pipeline (critical path), seconds."""
    bubble_s: float
    """Idle time of the critical (slowest) stage: time_s - m * (f_k + b_k), seconds."""
    bubble_fraction: float
    """bubble_s / time_s (SC21's (p-1)/m is bubble_s / ideal time; this is bubble_s / total)."""
    steady_stage: int
    """Index of the slowest stage (largest f_i + b_i); the first one on ties."""


@dataclass(frozen=True)
class PipelineEvent:
    """One op of the simulated schedule."""

    stage: int
    """Physical pipeline stage (device) that runs it."""
    microbatch: int
    """Micro-batch index, 0-based."""
    chunk: int
    """Model chunk (virtual pipeline rank) on that stage, 0-based; always 0 when vpp == 1."""
    kind: str
    """'F' (forward) or 'B' (backward, including recomputation)."""
    start_s: float
    """Start time, seconds from the start of the iteration."""
    end_s: float
    """End time, seconds."""


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate_1f1b`."""

    makespan_s: float
    """Time at which the last op of any stage ends, seconds."""
    busy_s: tuple[float, ...]
    """Per stage: total compute time, seconds."""
    idle_s: tuple[float, ...]
    """Per stage: makespan_s - busy_s, seconds."""
    events: tuple[PipelineEvent, ...] | None
    """The ops in the order they were scheduled, when asked for with ``record=True``."""


def validate(stage_fwd_s: Sequence[float], stage_bwd_s: Sequence[float], num_microbatches: int,
             vpp: int = 1, p2p_s: float = 0.0) -> None:
    """Raise PlannerError (a ValueError) on inputs neither the schedule nor the formula accept."""
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) \
            or num_microbatches < 1:
        raise PlannerError(f"num_microbatches must be a positive integer, got {num_microbatches!r}; "
                           "raise the global batch or lower the micro-batch size.")
    if isinstance(vpp, bool) or not isinstance(vpp, int) or vpp < 1:
        raise PlannerError(f"vpp must be a positive integer, got {vpp!r}; use 1 for no interleaving.")
    p = len(stage_fwd_s)
    if p < 1 or len(stage_bwd_s) != p:
        raise PlannerError(f"stage_fwd_s and stage_bwd_s must be non-empty and equally long, got "
                           f"{p} and {len(stage_bwd_s)}; pass one time per pipeline stage.")
    if min(stage_fwd_s) < 0 or min(stage_bwd_s) < 0 or p2p_s < 0:
        raise PlannerError("stage times and p2p_s must be >= 0; check the per-stage cost model.")
    if vpp > 1 and num_microbatches < p:
        # Megatron-Core schedules.py: the micro-batch group N of the interleaved schedule must satisfy
        # p <= N <= m (ParallelPlan.vpp_microbatch_group picks N; older Megatron required m % p == 0)
        raise PlannerError(f"the interleaved schedule needs num_microbatches ({num_microbatches}) >= the "
                           f"pipeline size ({p}) (Megatron-Core requirement); "
                           "change the number of micro-batches or set vpp=1.")


# ----------------------------------------------------------------------------------------------
# Simulator (reference)
# ----------------------------------------------------------------------------------------------

def _stage_order(i: int, p: int, m: int, v: int, group: int = 0) -> list[tuple[str, int, int]]:
    """The (kind, microbatch, chunk) ops of stage i in execution order (see module docstring).

    Interleaved: Megatron-Core's schedule table (schedules.py get_schedule_table): micro-batches in groups
    of ``group`` (default p; the last group takes the rest), each group run chunk by chunk."""
    if v == 1:
        w = min(p - i - 1, m)
        ops = [("F", k, 0) for k in range(w)]
        for j in range(m - w):
            ops += [("F", w + j, 0), ("B", j, 0)]
        return ops + [("B", k, 0) for k in range(m - w, m)]
    total = m * v
    n = group or p
    w = total if m == p else min((p - i - 1) * 2 + (v - 1) * n, total)
    table = [(mb, c) for g in range(0, m, n) for c in range(v) for mb in range(g, min(g + n, m))]

    def op(k: int, kind: str) -> tuple[str, int, int]:
        mb, chunk = table[k]
        return kind, mb, chunk if kind == "F" else v - 1 - chunk

    ops = [op(k, "F") for k in range(w)]
    for j in range(total - w):
        ops += [op(w + j, "F"), op(j, "B")]
    return ops + [op(k, "B") for k in range(total - w, total)]


def simulate_1f1b(stage_fwd_s: Sequence[float], stage_bwd_s: Sequence[float], num_microbatches: int,
                  vpp: int = 1, p2p_s: float = 0.0, record: bool = False, microbatch_group: int = 0) -> SimResult:
    """Dependency simulation of the exact 1F1B / interleaved-1F1B op order.

    Per-chunk times are stage time / vpp. Returns the makespan, per-stage busy and idle time and,
    with ``record=True``, every op as a :class:`PipelineEvent` in scheduling order. ``microbatch_group``:
    Megatron-Core's microbatch_group_size_per_vp_stage (0 = the pipeline size).
    """
    validate(stage_fwd_s, stage_bwd_s, num_microbatches, vpp, p2p_s)
    p, m, v = len(stage_fwd_s), num_microbatches, vpp
    last = p * v - 1
    hop = p2p_s if p > 1 else 0.0  # adjacent virtual stages sit on different devices iff p > 1
    orders = [_stage_order(i, p, m, v, microbatch_group) for i in range(p)]
    ptr, free, busy = [0] * p, [0.0] * p, [0.0] * p
    end: dict[tuple[str, int, int], float] = {}
    events: list[PipelineEvent] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            order = orders[i]
            while ptr[i] < len(order):
                kind, mb, chunk = order[ptr[i]]
                s = chunk * p + i
                ready = free[i]
                if kind == "F":
                    if s > 0:
                        dep = end.get(("F", s - 1, mb))
                        if dep is None:
                            break
                        ready = max(ready, dep + hop)
                    dur = stage_fwd_s[i] / v
                else:
                    own = end.get(("F", s, mb))
                    nxt = end.get(("B", s + 1, mb)) if s < last else 0.0
                    if own is None or nxt is None:
                        break
                    ready = max(ready, own, nxt + hop if s < last else 0.0)
                    dur = stage_bwd_s[i] / v
                stop = ready + dur
                end[(kind, s, mb)] = stop
                free[i] = stop
                busy[i] += dur
                if record:
                    events.append(PipelineEvent(i, mb, chunk, kind, ready, stop))
                ptr[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the schedules above; guards future edits
            raise RuntimeError("pipeline schedule deadlocked")
    makespan = max(free)
    return SimResult(makespan, tuple(busy), tuple(makespan - x for x in busy),
                     tuple(events) if record else None)


# ----------------------------------------------------------------------------------------------
# Closed form
# ----------------------------------------------------------------------------------------------

def _stage_path(f: Sequence[float], b: Sequence[float], m: int, k: int, below: float) -> float:
    """Longest 'single bottleneck' path through stage k of non-interleaved 1F1B, no p2p.

    The path runs F(0) down stages 0..k-1, then every op of stage k, then B(m-1) up stages
    k-1..0: sum_{j<k}(f_j+b_j) + m(f_k+b_k). It may leave stage k for a detour: from F(x) down
    to the last stage and back to B(x), taking ``below`` = sum_{j>k}(f_j+b_j) instead of the
    local ops between F(x) and B(x) on stage k (w F's and/or w B's, w = min(p-k-1, m)).
    Detours: x = 0 (skips w forwards), x = m-1 (skips w backwards) and, in between, one every
    w+1 micro-batches (skips w forwards and w backwards).
    """
    p = len(f)
    t = f[k] + b[k]
    w = min(p - k - 1, m)
    n = min(w, m - 1)
    gain_first = max(0.0, below - n * f[k])
    gain_last = max(0.0, below - n * b[k])
    if w > 0 and m - 1 >= w + 1:  # first and last detours are disjoint
        middle = max(0, (m - 1) // (w + 1) - 1)
        gain = gain_first + gain_last + middle * max(0.0, below - w * t)
    else:
        gain = max(gain_first, gain_last)
    return m * t + gain


def pipeline_time(stage_fwd_s: Sequence[float], stage_bwd_s: Sequence[float], num_microbatches: int,
                  vpp: int = 1, p2p_s: float = 0.0) -> PipelineResult:
    """Closed-form time of forward+backward of all micro-batches through a 1F1B pipeline.

    Uniform stages (f, b per stage, p stages, m micro-batches, v = vpp, c = p2p_s):

    * 1F1B: T = (m + p - 1)(f + b) + n c, with n = 2(p-1) + 2 floor((m-1)(p-1)/p).
      The first term is SC21 §2.2.1 (bubble (p-1)/m of the ideal time, eq. in §2.2.1).
      The p2p term: 2(p-1) boundary crossings to fill and drain the pipeline, plus, in steady
      state, the round trip of stage 0 (w = p-1 warm-up micro-batches in flight) costs 2(p-1)c
      every p micro-batches, i.e. 2(p-1)c/p per micro-batch. Exact (== simulator) for all c.
    * interleaved: T = m(f + b) + (p-1)(f + b)/v + 2(vp - 1) c (SC21 §2.2.2: bubble
      (p-1)/(v m)); the v·p virtual stages give 2(vp-1) crossings to fill and drain, and the
      extra (p-1) warm-up chunks of Megatron's schedule absorb the steady-state crossings.
      Exact while c <= min(f, b)/v (a chunk's forward or backward hides one send); beyond that a
      steady-state cycle bound is added (approximation, see below).

    Non-uniform stages: the base SC21-style form m max_i t_i + (sum_i t_i - max_i t_i)/v
    (t_i = f_i + b_i) over-estimates the simulator by up to ~20% (it charges the slowest stage
    the whole fill and drain, although it runs its own warm-up forwards meanwhile). Instead,
    1F1B uses T0 = max_k [sum_{j<k} t_j + _stage_path(k)] (see :func:`_stage_path`), the longest
    of the paths that spend their steady state on one stage k, which matches the simulator
    exactly when one stage differs from the rest (heavy first or last stage) and is within the
    bound checked in tests/test_timeline.py otherwise (slightly low: it misses paths through two
    bottlenecks). Interleaving divides the non-steady part by v: T0_v = max_k [m t_k +
    (T0_k - m t_k)/v]. The p2p term for non-uniform stages adds the fill/drain crossings and the
    steady-state excess of the round-trip cycle of each stage i over the slowest stage:
    e_i = (t_i + sum_{j>i} t_j + 2 w_i c)/(w_i + 1) - max t (1F1B, w_i = p-i-1), which reduces to
    the uniform floor term above.
    """
    validate(stage_fwd_s, stage_bwd_s, num_microbatches, vpp, p2p_s)
    f, b = stage_fwd_s, stage_bwd_s
    p, m, v, c = len(f), num_microbatches, vpp, float(p2p_s) if len(f) > 1 else 0.0
    t = [fi + bi for fi, bi in zip(f, b)]
    k_star = max(range(p), key=t.__getitem__)
    t_max = t[k_star]

    # compute-only critical path (c = 0)
    base = 0.0
    above = 0.0                      # sum_{j<k} t_j
    below = sum(t)                   # becomes sum_{j>k} t_j inside the loop
    for k in range(p):
        below -= t[k]
        path = _stage_path(f, b, m, k, below)
        base = max(base, m * t[k] + (above + path - m * t[k]) / v)
        above += t[k]

    # p2p: fill/drain crossings plus steady-state excess of the slowest round-trip cycle
    if c > 0.0:
        if v == 1:
            extra = 0.0
            below = sum(t)
            for i in range(p - 1):
                below -= t[i]
                w = p - i - 1
                excess = (t[i] + below + 2 * w * c) / (w + 1) - t_max
                if excess > 0:
                    # floor keeps the uniform case exact: pairs of crossings are whole
                    extra = max(extra, 2 * c * int((m - 1) * excess / (2 * c) + 1e-9))
            base += 2 * (p - 1) * c + extra
        else:
            fill = 2 * (v * p - 1) * c
            extra = 0.0
            chunk = min(min(f), min(b)) / v
            if c > chunk and m > p:
                # steady-state cycle of virtual stage 0 (d = vp-1 downstream virtual stages):
                # (d+1) chunk pairs + 2d sends per 2d+1 forward chunks on a device (uniform
                # analysis of Megatron's interleaved order; approximation).
                d = v * p - 1
                per = ((d + 1) * t_max / v + 2 * d * c) / (2 * d + 1)
                extra = max(0.0, (m * v - 1) * (per - t_max / v) - (fill - 2 * (p - 1) * c))
            base += fill + extra
    bubble = base - m * t_max
    return PipelineResult(base, bubble, bubble / base if base > 0 else 0.0, k_star)
