"""80 % prediction intervals from cross-validated residuals, per regime group (GPU family, framework).

A residual is ``log(predicted iteration time / measured iteration time)`` of a run predicted by a
calibration that never saw the run's source (leave-one-source-out, :mod:`planner.source_cv`); throughput,
TFLOP/s and MFU rows are inverse times, so their residual is ``-log(predicted / measured)``. With q10 and
q90 the 10th and 90th percentiles of the residuals of a group, the measured time lies in
``[t * exp(-q90), t * exp(-q10)]`` for 80 % of such runs, if a new run behaves like the runs of its group.

The percentiles are those of source-shifted residuals (:func:`source_shifted`): a new source's bias plus the
scatter within a source, so that the band also holds for runs of a source the table never saw.

Groups, most specific first: ``gpu_family=F,framework=W``, ``framework=W``, ``gpu_family=F``, ``pooled``;
the first with at least :data:`MIN_GROUP_RUNS` residuals is used, and the interval states which and how
many. GPU families are NVIDIA's / AMD's architecture names of the catalogue GPUs (vendor data sheets).

Mixture-of-experts plans err differently from dense ones (their own validation file, moe_runs.csv), so a
calibration carries a second table for them under ``intervals[MOE_TABLE]`` (:func:`moe_lookup`): the same
groups over the residuals of the MoE runs predicted by that calibration, which was fitted on dense runs only
and so has seen none of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

LEVEL = 0.80
"""Nominal coverage of the interval."""
QUANTILES = (10.0, 90.0)
"""Percentiles of the residuals that bound it (numpy linear interpolation)."""
MIN_GROUP_RUNS = 8
"""A group with fewer residuals falls back to the next, coarser one (10th/90th percentiles of fewer than
~8 values are the extreme values themselves)."""
MIN_GROUP_SOURCES = 10
"""Sources a regime group's residuals must come from before its own band is used instead of a coarser one. The
band's outer percentiles are mostly the spread of source biases, and a 10th/90th percentile over fewer source
means is their extremes (the MIN_GROUP_RUNS reasoning, applied to sources). The open published runs have 10
sources, so today every band is the pooled one; chosen with the held-out coverage in view: regime bands from
2-6 sources covered 58-68 % of held-out runs, the pooled band 72 % (validate --cv source)."""
DEFAULT_FRAMEWORK = "megatron"
"""Framework of a plan that does not name one (planner's default)."""

# catalogue GPU key prefix -> architecture (vendor data sheets: A100 Ampere, H100/H200/GH200 Hopper,
# B200/GB200/B300/GB300 Blackwell, L4/L40 Ada Lovelace, V100 Volta, MI300 CDNA 3)
_FAMILIES = (("a100", "ampere"), ("a10", "ampere"), ("a30", "ampere"), ("a40", "ampere"),
             ("gh200", "hopper"), ("h100", "hopper"), ("h200", "hopper"), ("h800", "hopper"),
             ("gb200", "blackwell"), ("gb300", "blackwell"), ("b200", "blackwell"), ("b300", "blackwell"),
             ("l40", "ada"), ("l4", "ada"), ("v100", "volta"), ("mi300", "cdna3"), ("cpu", "cpu"))


def gpu_family(gpu: str) -> str:
    """'h100-sxm' -> 'hopper'; 'other' for a GPU not listed."""
    g = gpu.lower()
    return next((fam for prefix, fam in _FAMILIES if g.startswith(prefix)), "other")


def plan_framework(plan: object) -> str:
    """The plan's framework (``ParallelPlan.framework``), 'megatron' when it has none."""
    return str(getattr(plan, "framework", None) or DEFAULT_FRAMEWORK)


def regime_keys(gpu: str, framework: str) -> list[str]:
    """Group keys of a run, most specific first, 'pooled' last."""
    fam = gpu_family(gpu)
    return [f"gpu_family={fam},framework={framework}", f"framework={framework}", f"gpu_family={fam}", "pooled"]


def time_residual(metric: str, predicted: float, measured: float) -> float:
    """log(predicted time / measured time) of a row published in ``metric``."""
    r = math.log(predicted / measured)
    return r if metric == "iteration_time_s" else -r


def source_shifted(by_source: Mapping[str, list[float]]) -> np.ndarray:
    """Residuals a run of a *new* source may have: every source's mean residual (its bias: the sources differ in
    stack version, cluster and how they measured) plus every within-source deviation from its source's mean,
    all combinations, each source mean and each deviation weighted alike (a two-level random-effects spread,
    as a grouped bootstrap would draw it). With one source it is that source's residuals."""
    means = {s: float(np.mean(v)) for s, v in by_source.items()}
    devs = np.array([r - means[s] for s, v in by_source.items() for r in v])
    return np.add.outer(np.array(list(means.values())), devs).ravel()


def fit_intervals(records: Iterable[Mapping]) -> dict:
    """Interval table from residual records ``{source, gpu, framework, residual}``: every group with its n, its
    sources and the percentiles of :func:`source_shifted` residuals (groups below MIN_GROUP_RUNS are kept with
    their n, and skipped by :func:`lookup`)."""
    by_group: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        for key in regime_keys(rec["gpu"], rec["framework"]):
            by_group.setdefault(key, {}).setdefault(str(rec.get("source", "")), []).append(float(rec["residual"]))
    groups = {}
    for key, by_source in sorted(by_group.items()):
        q_lo, q_hi = np.percentile(source_shifted(by_source), QUANTILES)
        groups[key] = {"n": sum(len(v) for v in by_source.values()), "sources": len(by_source),
                       "q_low": float(q_lo), "q_high": float(q_hi)}
    return {"level": LEVEL, "percentiles": list(QUANTILES), "min_group_runs": MIN_GROUP_RUNS,
            "residual": "log(predicted / measured iteration time), leave-one-source-out", "groups": groups}


def lookup(table: Mapping | None, gpu: str, framework: str) -> tuple[str, dict] | None:
    """(group key, {n, q_low, q_high}) of the most specific group with enough residuals; None without any."""
    if not table:
        return None
    groups = table.get("groups", {})
    need = int(table.get("min_group_runs", MIN_GROUP_RUNS))
    for key in regime_keys(gpu, framework):
        g = groups.get(key)
        # the pooled group is the last resort: any number of sources
        if g is not None and g["n"] >= need and (key == "pooled" or g.get("sources", 0) >= MIN_GROUP_SOURCES):
            return key, g
    return None


MOE_TABLE = "moe"
"""Key of a calibration's interval table for mixture-of-experts plans (inside its ``intervals``)."""


def moe_lookup(table: Mapping | None, gpu: str, framework: str) -> tuple[str, dict] | None:
    """:func:`lookup` in the mixture-of-experts table of a calibration's ``intervals``; None without one."""
    return lookup((table or {}).get(MOE_TABLE), gpu, framework)


def covers(group: Mapping, residual: float) -> bool:
    """Whether a run with this residual lies inside the group's interval."""
    return group["q_low"] <= residual <= group["q_high"]


def time_band(time_s: float, group: Mapping) -> tuple[float, float]:
    """(low, high) iteration time of the 80 % interval around a predicted ``time_s``."""
    return time_s * math.exp(-group["q_high"]), time_s * math.exp(-group["q_low"])


def held_out_coverage(records: list[Mapping]) -> list[tuple[str, dict] | None]:
    """For each residual record ``{source, gpu, framework, residual}``: the (group, interval) it gets from the
    records of the *other* sources only (None when they give none); its own source's errors never widen it."""
    tables: dict[str, dict] = {}
    out = []
    for rec in records:
        src = rec["source"]
        if src not in tables:
            tables[src] = fit_intervals(r for r in records if r["source"] != src)
        out.append(lookup(tables[src], rec["gpu"], rec["framework"]))
    return out
