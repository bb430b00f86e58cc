"""Rank skew: how much longer a synchronous step runs than its average rank.

Ranks that synchronise (a TP all-reduce, a pipeline send/recv, the DP gradient reduction) all wait
for the slowest: between two synchronisations the step pays E[max over ranks] of the compute segment,
while an operator sampled in one process measures its mean. On a GPU node the difference is small;
on a shared CPU VM it is not (2 vCPUs running identical GEMMs on this machine differ by 2-17 % in
speed from moment to moment), so a prediction without it is too fast for every multi-process run.

Measured by the collective worker (``costmodel.profiling.sampling.collectives``), on the ranks it runs, when
the plan's ``[collectives]`` table has ``skew_segments_s`` (segment lengths) and ``skew_seconds``
(time budget): every repeat, all ranks pass a barrier and run the same GEMM segment of about that
length; each rank times its own segment; the repeat's max and mean over ranks are summed. Lengths
are interleaved (one repeat of each per round) so that drifts of the machine hit all of them alike,
and each length gets an equal share of the budget. Recorded: per length and pooled,

    excess = sum(max over ranks) / sum(mean over ranks) - 1,

which ``planner fit`` writes into the CPU cluster as ``straggler_excess`` (costmodel/fitting/cpu_hardware.py)
and the timeline adds as a wait of ``excess x`` the compute between synchronisations
(costmodel.schedule.compose.straggler_wait). For more ranks than measured the excess is scaled by the expected maximum
of n standard normals relative to the measured count (:func:`costmodel.schedule.straggler.rank_scale`): the assumption
that rank speeds vary independently and normally, stated in the prediction's warnings.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.core.errors import PlannerError

SKEW_FILE = "sync_skew.json"
FORMAT = 1


def pooled_excess(per_length: list[dict]) -> float:
    """sum of the per-length max sums / sum of the mean sums - 1 (module docstring)."""
    smax = sum(p["sum_max_s"] for p in per_length)
    smean = sum(p["sum_mean_s"] for p in per_length)
    if smean <= 0:
        raise PlannerError("sync skew: no segment was timed")
    return smax / smean - 1.0


def measure(ctx, segments_s: list[float], seconds: float, burst_factory) -> dict:
    """Run the skew measurement on every rank of ``ctx`` (all ranks call this); the summary dict.

    ``ctx``: the collective worker's context (costmodel/profiling/sampling/collectives._Ctx: ``barrier``, ``sync``,
    ``world`` and the min / max / mean over ranks).

    ``burst_factory(seconds)`` returns a callable that runs about that much compute on this rank, with a
    ``reps`` attribute (its GEMM count) that must be equal on every rank: the segments are identical.
    """
    lengths = sorted({float(s) for s in segments_s})
    if not lengths or min(lengths) <= 0 or seconds <= 0:
        raise PlannerError("[collectives] skew_segments_s must hold lengths > 0 s and skew_seconds must be > 0")
    bursts = [burst_factory(length) for length in lengths]
    reps = []
    for burst in bursts:  # identical segments: the same GEMM count on every rank
        n = getattr(burst, "reps", 0)
        lo, hi = ctx.min_over_ranks(n), ctx.max_over_ranks(n)
        if lo != hi:
            raise PlannerError(f"sync skew: ranks would run different segments ({lo:.0f} vs {hi:.0f} "
                               "GEMMs); the burst calibration must agree across ranks")
        reps.append(int(n))
    share = seconds / len(lengths)
    repeats = [max(3, int(share / length)) for length in lengths]
    acc: list[dict[str, Any]] = [{"segment_s": length, "gemms_per_segment": n, "repeats": 0, "sum_max_s": 0.0,
            "sum_mean_s": 0.0, "excess_per_repeat": []} for length, n in zip(lengths, reps)]
    t_start = time.perf_counter()
    for rnd in range(max(repeats)):
        for i, burst in enumerate(bursts):
            if rnd >= repeats[i]:
                continue
            ctx.barrier()
            t0 = time.perf_counter()
            burst()
            ctx.sync()
            d = time.perf_counter() - t0
            dmax, dmean = ctx.max_over_ranks(d), ctx.mean_over_ranks(d)
            a = acc[i]
            a["repeats"] += 1
            a["sum_max_s"] += dmax
            a["sum_mean_s"] += dmean
            a["excess_per_repeat"].append(dmax / dmean - 1.0)
    per_length = []
    for a in acc:
        ex = np.asarray(a.pop("excess_per_repeat"))
        p10, p90 = np.percentile(ex, [10, 90])
        per_length.append({**a, "excess": a["sum_max_s"] / a["sum_mean_s"] - 1.0,
                           "excess_p10": float(p10), "excess_p90": float(p90)})
    return {"format": FORMAT, "ranks": ctx.world, "segments": per_length, "excess": pooled_excess(per_length),
            "elapsed_s": round(time.perf_counter() - t_start, 3), "unix_time": round(time.time(), 3),
            "method": "costmodel/profiling/sampling/skew.py: barrier, the same GEMM segment on every rank, "
                      "sum(max over ranks) / sum(mean over ranks) - 1, lengths interleaved"}


def read_measurement(dirs, name: str, what: str, valid) -> dict | None:
    """The measurement file ``name`` of the first of ``dirs`` that has one, checked by ``valid(data)``
    (a JSON object of ranks >= 2 and the format is checked here), with its ``path``; None if none has it.
    Shared by this module's ``sync_skew.json`` and costmodel/profiling/sampling/corun.py's ``corun.json``."""
    for d in dirs or []:
        path = Path(d) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlannerError(f"{path} is not readable JSON ({exc}); delete it and re-run `planner profile`") from None
        ranks = data.get("ranks") if isinstance(data, dict) else None
        if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(ranks, int)
                and not isinstance(ranks, bool) and ranks >= 2 and valid(data)):
            raise PlannerError(f"{path} is not {what}; delete it and re-run `planner profile`")
        return {**data, "path": str(path)}
    return None


def load(dirs) -> dict | None:
    """The ``sync_skew.json`` of the first of ``dirs`` that has one (validated), else None."""
    def valid(data: dict) -> bool:
        ex = data.get("excess")
        return (isinstance(ex, (int, float)) and not isinstance(ex, bool) and math.isfinite(ex) and 0.0 <= ex < 5.0
                and isinstance(data.get("segments"), list) and bool(data["segments"]))

    return read_measurement(dirs, SKEW_FILE, f"a sync-skew file of format {FORMAT} (ranks >= 2, finite excess, "
                                             "segments)", valid)
