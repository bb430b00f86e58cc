"""Co-run slowdown: how much slower an operator runs while the other ranks of its node run it too (issue #4).

`planner profile` times each compute operator in one process (costmodel/profiling/sampling/operators.py), with the
node's memory bandwidth and shared caches to itself. In a synchronous multi-rank step every rank of a
node runs the same operators at the same moment and shares them. A GPU has its own HBM, so the
catalogue's GPU clusters have no such term (not measured: factor 1). On a CPU host the ranks share DRAM
bandwidth and the last-level cache: on the 2-core development VM (AMD EPYC, 2026-11-25) one-thread
``torch.add`` over 3 x 16 MB took 1.34-1.43 ms alone and 2.28-2.46 ms with the other core doing the same,
a 1024-wide fp32 GEMM 5.8-6.2 ms either way. Measured this way on the cpu-workload plan's shapes: GEMM
and attention 1.02-1.03, norm / activation / rope 1.05-1.12, embedding / cross-entropy / residual add
1.15-1.18, AdamW 1.45. Whole runs are less clear: two single-process training runs side by side took
0.808 / 0.824 s per iteration against 0.745 / 0.729 s alone once, and the same within noise when
repeated (0.246 / 0.237 vs 0.238 / 0.244 s for the 4-layer model, 0.732 / 0.711 vs 0.713 s for the
8-layer one): the term is a few percent of a step there.

Measured by the collective worker (``costmodel.profiling.sampling.collectives``) on the ranks it runs, when the
plan's ``[collectives]`` table has ``corun_seconds`` (time budget) and optionally ``corun_shapes`` (shapes
per kind and direction, default 4): for every compute kind and direction of the plan's ``[ops]``, that
many of its sampled shapes spread over their sizes. For each shape, in interleaved rounds: *alone*
(rank 0 times a block of calls while the other ranks wait in a barrier) and *together* (every rank times
the same block at the same moment; their mean). A block is timed the way the kind was sampled: one call
after an untimed cold-cache sweep where the plan sets ``flush_mb``, else warm back-to-back calls. Per kind
(directions and shapes pooled)::

    slowdown = sum(together) / sum(alone)

which ``planner fit`` writes into the CPU cluster as ``corun_slowdown`` (costmodel/fitting/cpu_hardware.py) and
the predictor multiplies into that kind's operator times when a plan puts more than one rank on a node
(costmodel/schedule/compose.py). Both sides are timed the same way, so the ratio carries over to the operator samples.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.profiling.sampling.operators import build
from costmodel.profiling.sampling.skew import read_measurement

CORUN_FILE = "corun.json"
FORMAT = 1
TARGET_BLOCK_S = 0.004
"""Length of one timed block of calls (chosen by us: long enough for perf_counter, short enough that a
budget of tens of seconds gives every shape tens of rounds)."""


def pick_shapes(samples: list, per_group: int) -> dict[tuple[str, str], list]:
    """Up to ``per_group`` samples per (kind, direction), spread evenly over the group's sizes (product of
    the features), smallest and largest included."""
    groups: dict[tuple[str, str], list] = {}
    for s in samples:
        groups.setdefault((s.kind, s.direction), []).append(s)
    out = {}
    for key, group in groups.items():
        group = sorted(group, key=lambda s: (float(np.prod([max(1, int(f)) for f in s.features])), s.key()))
        if len(group) <= per_group:
            out[key] = group
        else:
            idx = sorted({int(round(i)) for i in np.linspace(0, len(group) - 1, per_group)})
            out[key] = [group[i] for i in idx]
    return out


def slowdown(rows: list[dict]) -> dict[str, float]:
    """Per kind: sum of the together times / sum of the alone times over its rows (module docstring)."""
    alone: dict[str, float] = {}
    together: dict[str, float] = {}
    for r in rows:
        alone[r["kind"]] = alone.get(r["kind"], 0.0) + float(r["alone_s"])
        together[r["kind"]] = together.get(r["kind"], 0.0) + float(r["together_s"])
    out = {}
    for kind in sorted(alone):
        if alone[kind] <= 0:
            raise PlannerError(f"co-run measurement: no time recorded for {kind}")
        out[kind] = together[kind] / alone[kind]
    return out


def measure(ctx, samples: list, seconds: float, per_group: int, device: str, flush_mb=lambda kind: 0.0) -> dict:
    """Run the co-run measurement on every rank of ``ctx`` (all ranks call this with the same samples).

    ``flush_mb(kind)``: the plan's cold-cache sweep for that kind (costmodel/profiling/sampling/plan.op_timing); where
    > 0 the operator is timed as it was sampled, one call after an untimed sweep of that many MiB on every
    rank that runs it (the sweep's memory traffic is what the ranks of a step contend for); else in warm,
    back-to-back blocks of about TARGET_BLOCK_S."""
    if seconds <= 0 or per_group < 1:
        raise PlannerError("[collectives] corun_seconds must be > 0 and corun_shapes >= 1")
    chosen = [s for group in pick_shapes(samples, per_group).values() for s in group]
    if not chosen:
        raise PlannerError("co-run measurement: the plan has no [ops] samples to run")
    torch = ctx.torch
    share = seconds / len(chosen)
    rows = []
    t_start = time.perf_counter()
    buffers: dict[float, Any] = {}
    for s in chosen:
        fn = build(s, device)
        for _ in range(2):
            fn()
        ctx.sync()
        t0 = time.perf_counter()
        fn()
        ctx.sync()
        # every rank runs the same number of calls per block
        one = ctx.max_over_ranks(max(time.perf_counter() - t0, 1e-7))
        mb = float(flush_mb(s.kind) or 0.0)
        if mb > 0:
            if mb not in buffers:  # one sweep buffer per size, allocated once
                buffers[mb] = torch.empty(max(1, int(mb * 2**20 / 4)), dtype=torch.float32, device=ctx.dev)
            buf = buffers[mb]
            inner, flush_s = 1, mb * 2**20 / 10e9  # a sweep costs about this much at ~10 GB/s
        else:
            buf, inner, flush_s = None, max(1, min(1000, math.ceil(TARGET_BLOCK_S / one))), 0.0
        rounds = max(3, int(share / (2 * (inner * one + flush_s))))

        def block(fn=fn, buf=buf, inner=inner) -> float:  # this iteration's operator, buffer and count
            if buf is not None:
                buf.fill_(1.0)
            ctx.sync()
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            ctx.sync()
            return time.perf_counter() - t

        alone = together = 0.0
        for _ in range(rounds):
            ctx.barrier()
            d = block() if ctx.rank == 0 else 0.0
            ctx.barrier()
            alone += d
            together += ctx.mean_over_ranks(block())
        alone = ctx.sum_over_ranks(alone)  # rank 0's sum (the others timed nothing): the same on every rank
        rows.append({"kind": s.kind, "direction": s.direction, "features": [int(f) for f in s.features],
                     "variant": s.variant, "flush_mb": mb, "calls": inner * rounds, "alone_s": alone,
                     "together_s": together, "ratio": together / alone if alone > 0 else None})
        del fn
    return {"format": FORMAT, "ranks": ctx.world, "rows": rows, "slowdown": slowdown(rows),
            "elapsed_s": round(time.perf_counter() - t_start, 3), "unix_time": round(time.time(), 3),
            "method": "costmodel/profiling/sampling/corun.py: per shape, interleaved rounds of rank 0 alone and all "
                      "ranks "
                      "together (cold-cache single calls where the plan samples the kind cold); per kind "
                      "sum(together mean) / sum(alone)"}


def load(dirs) -> dict | None:
    """The ``corun.json`` of the first of ``dirs`` that has one (validated), else None."""
    def valid(data: dict) -> bool:
        sd = data.get("slowdown")
        return isinstance(sd, dict) and bool(sd) and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0.2 <= v <= 20.0 for k, v in sd.items())

    return read_measurement(dirs, CORUN_FILE, f"a co-run file of format {FORMAT} (ranks >= 2, a slowdown per kind "
                                              "between 0.2 and 20)", valid)
