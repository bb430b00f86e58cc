"""The ZeRO stage of a plan whose request leaves it open (``zero="auto"``, the default of a plan request).

The stage is ZeRO-1 (Megatron's distributed optimizer, which current Megatron / NeMo recipes run) when the plan fits
in the GPU's memory there; otherwise it is the lowest higher stage under which it fits, so that a layout people run
with sharded gradients is not reported as out of memory only because the request did not name the stage:

* ZeRO-2 shards the gradients as well (Megatron-FSDP ``--data-parallel-sharding-strategy optim_grads``; PyTorch
  FSDP with ``reshard_after_forward=False``). Llama 3 405B ran its TP8 PP16 layout this way: "our implementation of
  FSDP shards the optimizer states and gradients, but for model shards we do not reshard after forward computation"
  (Llama 3 Herd of Models, arXiv 2407.21783, Sec. 3.3.2).
* ZeRO-3 shards the parameters too (``optim_grads_params``; FSDP ``full``).

A plan that fits under none of them keeps ZeRO-1, so its does-not-fit report and advice are the ones the user would
get for the default stage. The memory test is the one the prediction reports (:func:`fits_in_memory` of
:func:`memory_per_gpu`, through :func:`first_fitting`) on the request's layer split (for an uneven pipeline without
one, the count-based :func:`costmodel.core.specs.plan.default_layer_split`). The choice and its reason travel in
``plan.extra`` and come out as a note (:func:`zero_choice_notes`).
"""

from __future__ import annotations

from dataclasses import replace

from costmodel.core.specs.hardware import GPUSpec
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.per_gpu import first_fitting, usable_bytes

AUTO_ZERO = "auto"
"""The request value that leaves the ZeRO stage to :func:`with_default_zero`."""
DEFAULT_ZERO = 1
"""The stage an open request starts from: Megatron's distributed optimizer (ZeRO-1)."""
AUTO_STAGES = (1, 2, 3)
"""The stages tried, lowest first."""
ZERO_NOTE_KEY = "zero_choice"
"""``plan.extra`` key holding why a stage above ZeRO-1 was chosen."""
_GIB = float(2**30)


def with_default_zero(model: ModelSpec, plan: ParallelPlan, gpu: GPUSpec) -> ParallelPlan:
    """``plan`` at the lowest ZeRO stage of :data:`AUTO_STAGES` under which it fits on ``gpu``, with the valid stages
    below it, which do not fit, in ``extra`` when that is not ZeRO-1; at ZeRO-1 when it fits under none."""
    chosen = first_fitting(model, (replace(plan, zero=stage) for stage in AUTO_STAGES), gpu)
    if chosen is None:
        return replace(plan, zero=DEFAULT_ZERO)
    too_big = [s for s in AUTO_STAGES if s < chosen.zero and not replace(plan, zero=s).problems(model)]
    if not too_big:
        return chosen
    gone = " or ".join(f"ZeRO-{s}" for s in too_big)
    why = f"at {gone} this layout does not fit in the {usable_bytes(gpu) / _GIB:.1f} GiB usable on {gpu.name}"
    return replace(chosen, extra={**plan.extra, ZERO_NOTE_KEY: why})


def zero_choice_notes(plan: ParallelPlan) -> list[str]:
    """The note saying which ZeRO stage a plan whose request left it open was given, and why (none at ZeRO-1)."""
    why = plan.extra.get(ZERO_NOTE_KEY) if isinstance(plan.extra, dict) else None
    if not why:
        return []
    what = ("shards the gradients too: Megatron-FSDP optim_grads, FSDP without resharding after forward"
            if plan.zero == 2 else "shards the parameters too: Megatron-FSDP optim_grads_params, FSDP full sharding")
    return [f"ZeRO-{plan.zero} chosen because --zero was left to auto: {why} (ZeRO-{plan.zero} {what}); state "
            "--zero 1 to cost ZeRO-1 and see the other changes that make the layout fit"]
