"""Error statistics of a validation: MAPE, median, p90 and bias of the signed relative errors, per group."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from costmodel.core.errors import PlannerError

SUMMARY_GROUPS = ("source", "gpu", "kind", "tier", "metric")
"""Row attributes the errors are grouped by, in report order (the overall summary comes last)."""


@dataclass
class GroupSummary:
    """Error statistics of one group of predicted rows (all figures in percent)."""

    group: str
    """Grouping key, e.g. 'gpu'."""
    value: str
    """Group value, e.g. 'a100-80gb'."""
    n: int
    """Predicted rows in the group."""
    mape_pct: float
    """Mean absolute percentage error."""
    median_abs_pct: float
    """Median absolute percentage error."""
    p90_abs_pct: float
    """90th percentile of the absolute percentage error (numpy linear interpolation)."""
    bias_pct: float
    """Mean signed percentage error (> 0: predictions too high)."""


def summarize(errors: Iterable[float], group: str = "overall", value: str = "all") -> GroupSummary:
    """MAPE, median, p90 of |error| and mean signed error, all in percent."""
    e = np.asarray(list(errors), dtype=float) * 100.0
    if e.size == 0:
        raise PlannerError(f"no predicted rows in group {group}={value}")
    a = np.abs(e)
    return GroupSummary(group=group, value=value, n=int(e.size), mape_pct=float(a.mean()),
                        median_abs_pct=float(np.median(a)), p90_abs_pct=float(np.percentile(a, 90)),
                        bias_pct=float(e.mean()))


def group_summaries(done: Sequence) -> list[GroupSummary]:
    """Summaries of predicted results (objects with ``error`` and the SUMMARY_GROUPS attributes): one per
    value of each group, sorted by value, then the overall one (none when ``done`` is empty)."""
    summaries = []
    for group in SUMMARY_GROUPS:
        for value in sorted({getattr(r, group) for r in done}):
            summaries.append(summarize([r.error for r in done if getattr(r, group) == value], group, value))
    if done:
        summaries.append(summarize([r.error for r in done]))
    return summaries
