"""The checkpoint interval `planner export` writes: Daly's optimum (costmodel.schedule.goodput) for the plan's
allocation and predicted iteration time, under the default failure model (GOODPUT_FACTS.md §6.2: Llama 3's failure rate,
10-minute restarts, synchronous saves at 0.122 GB/s per GPU). `planner size` prints the same interval for its
own failure model."""

from __future__ import annotations

import math

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.schedule.goodput import FailureModel, goodput


def save_interval(model: ModelSpec, plan: ParallelPlan, prediction, failures: FailureModel | None = None
                  ) -> tuple[int, str] | None:
    """(optimizer steps between checkpoints, the comment saying where it comes from), or None without a
    prediction (an export with no predicted iteration time)."""
    if prediction is None or not prediction.iteration_time_s > 0:
        return None
    g = goodput(model.total_params(), plan.gpus, failures, dtype=plan.dtype, framework=plan.framework)
    if not math.isfinite(g.interval_s):
        return None
    steps = g.interval_iterations(prediction.iteration_time_s)
    why = (f"checkpoint every {steps} steps = {g.interval_s / 60:.1f} min, Daly's optimum for {plan.gpus} GPUs "
           f"(job MTBF {g.mtbf_s / 3600:.1f} h at {g.unplanned_per_s * 3600 / plan.gpus:.3g} interruptions per "
           f"GPU-hour, {g.checkpoint_bytes / 1e12:.2f} TB saved in {g.blocking_s:.1f} s; goodput {g.goodput:.3f}; "
           "costmodel/schedule/goodput.py)")
    return steps, why
