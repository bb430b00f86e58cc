"""Bytes per parameter of the training states (parameters, main gradients, optimizer), per plan, and how ZeRO
shards them on one pipeline stage. Used by :mod:`costmodel.memory.per_gpu`.

Sources
-------
* [MEGATRON-DO] Megatron-LM docs/user-guide/features/dist_optimizer.md (NVIDIA/Megatron-LM @d98e8a64ddf3): bytes
  per parameter 20 / ``4 + 16/d`` for "fp16 parameters, fp16 gradients", 18 / ``6 + 12/d`` for "bf16 parameters,
  fp32 gradients", 16 / ``8 + 8/d`` for fp32, without / with the distributed optimizer ("Optimizer steps always use
  fp32 main parameters"); fp16 gradients are copied to fp32 main gradients for the step (the 4 extra bytes).
* [MEGATRON-PAO] Megatron-LM megatron/training/arguments.py @d98e8a64ddf3, precision-aware optimizer:
  ``--main-grads-dtype {fp32,bf16}``, ``--main-params-dtype {fp32,fp16}``, ``--exp-avg-dtype`` /
  ``--exp-avg-sq-dtype {fp32,fp16,bf16,fp8}`` ("This dtype is used for storing the optimizer state in memory");
  ``--fp8-param-gather`` ("Keep the compute param in fp8 (do not use any other intermediate dtype) and perform the
  param all-gather in fp8"); ``--optimizer-cpu-offload`` / ``--optimizer-offload-fraction`` ("Ratio of optimizer
  state to offload to CPU").
* [DS-FP16] Rajbhandari et al., "ZeRO", SC'20, arXiv 1910.02054, Sec. 3.1: fp16 parameters and gradients (2 + 2
  bytes) and an fp32 Adam state of K = 12 bytes (master parameters, momentum, variance) per parameter; DeepSpeed
  keeps no fp32 gradient copy between steps.
* [FSDP2-MP] PyTorch ``fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))``: the
  sharded parameters keep the model's dtype (fp32 in torchtitan, which builds the model in fp32) and are cast to
  bf16 only when all-gathered; the reduce-scattered gradients are cast to the sharded parameter's dtype
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, _fsdp_collectives.py). So the fp32 sharded parameter *is*
  the main copy: 4 (parameter) + 4 (gradient) + 8 (Adam moments) = 16 bytes per parameter over the shard group.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.core.specs.memory_features import BYTES
from costmodel.core.specs.plan import ParallelPlan

BYTES_PARAM = 2.0
"""bf16/fp16 model parameter [MEGATRON-DO]."""
BYTES_FP8_PARAM = 1.0
"""fp8 primary weight (--fp8-param-gather) [MEGATRON-PAO]."""
FP16_MAIN_GRAD_COPY = 4.0
"""fp32 main-gradient copy the Megatron optimizer makes of fp16 gradients [MEGATRON-DO] (20 = 2 + 2 + 16)."""
FSDP2_STACKS = ("fsdp", "torchtitan", "torchtitan-eager")
"""Stacks whose ZeRO-3 is PyTorch FSDP2 [FSDP2-MP]."""


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each training state."""

    param: float
    """The parameters the forward uses, as held: 2 (bf16/fp16), 1 (fp8 primary weights), 4 (fp32 training)."""
    grad: float
    """Main gradient (the data-parallel gradient buffer)."""
    master: float
    """Optimizer-held copies: the main parameters (0 when the optimizer steps the model's own parameters) and, with
    Megatron's fp16 gradients, their fp32 main-gradient copy."""
    moments: float
    """Adam first and second moments."""

    @property
    def optimizer(self) -> float:
        return self.master + self.moments


def grads_dtype(plan: ParallelPlan) -> str:
    """The plan's main-gradient precision: its ``main_grads_dtype``, else fp16 for fp16 training on Megatron or
    DeepSpeed ([MEGATRON-DO], [DS-FP16]; FSDP2 reduces into fp32 shards [FSDP2-MP]), else fp32."""
    if plan.main_grads_dtype:
        return plan.main_grads_dtype
    if plan.dtype == "fp16" and plan.framework in ("megatron", "deepspeed"):
        return "fp16"
    return "fp32"


def state_bytes(plan: ParallelPlan) -> StateBytes:
    """Bytes per parameter of the plan's training states ([MEGATRON-DO], [MEGATRON-PAO], [DS-FP16])."""
    if plan.dtype == "fp32":
        # Pure fp32 training (e.g. the CPU workload): fp32 parameters and gradients, Adam m and v in the parameter's
        # dtype (torch/optim/adamw.py exp_avg, exp_avg_sq), no separate master copy.
        return StateBytes(4.0, 4.0, 0.0, 8.0)
    grad = grads_dtype(plan)
    master = BYTES[plan.main_params_dtype]
    if grad == "fp16" and plan.framework == "megatron":
        master += FP16_MAIN_GRAD_COPY
    return StateBytes(BYTES_FP8_PARAM if plan.fp8_param_gather else BYTES_PARAM, BYTES[grad], master,
                      BYTES[plan.exp_avg_dtype] + BYTES[plan.exp_avg_sq_dtype])


def reshards_after_forward(plan: ParallelPlan) -> bool:
    """ZeRO-3 frees a unit's gathered parameters after its forward (gathering them again for its backward): the
    plan's ``reshard_after_forward``, else True (FSDP2's ``fully_shard`` default; torchtitan's "default" policy
    keeps them gathered under PP, torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy``, which
    the default here does not follow, as costmodel.graph.zero3's per-micro-batch gathers do not)."""
    return True if plan.reshard_after_forward is None else plan.reshard_after_forward


DS_MAX_LIVE_PARAMETERS = 1e9
"""DeepSpeed ZeRO-3 ``stage3_max_live_parameters`` default: "The maximum number of parameters resident per GPU
before releasing" (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig ``max_live_parameters``)."""
DS_PREFETCH_BUCKET = 5e7
"""DeepSpeed ZeRO-3 ``stage3_prefetch_bucket_size`` default, parameters prefetched ahead (same file)."""
DS_REDUCE_BUCKET = 5e8
"""DeepSpeed ``reduce_bucket_size`` default, gradient elements reduced at once (same file)."""


def zero3_units(plan: ParallelPlan, unit: float, largest_module: float) -> tuple[float, float]:
    """(parameters gathered at once, unsharded gradient parameters before their reduce-scatter) of a ZeRO-3 stage
    whose largest unit holds ``unit`` parameters. FSDP / Megatron gather whole units (a layer, the embedding, the
    head), two at once with prefetch ([FSDP-NOTES] in costmodel.memory.per_gpu), and reduce one. DeepSpeed gathers
    module by module up to ``stage3_max_live_parameters`` plus the prefetch bucket (a module is gathered whole, so at
    least ``largest_module``) and reduces gradients through a ``reduce_bucket_size`` bucket after the module's own."""
    if plan.framework == "deepspeed":
        live = max(largest_module, min(2 * unit, DS_MAX_LIVE_PARAMETERS + DS_PREFETCH_BUCKET))
        return live, min(unit, largest_module + DS_REDUCE_BUCKET)
    return 2 * unit, unit


def stage_state_bytes(plan: ParallelPlan, params: float, layer_params: float, gather: float, grad_unit: float,
                      expert: float = 0.0, expert_unit: float = 0.0) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer on the GPU, optimizer on the host) bytes of one stage's GPU holding ``params``
    non-expert parameters (``layer_params`` of them in transformer layers, the rest embedding/head, kept in bf16
    under fp8 primary weights) and ``expert`` routed-expert parameters. ZeRO-1 shards the optimizer, ZeRO-2 the
    gradients (``grad_unit`` parameters unsharded before their reduce-scatter), ZeRO-3 the parameters (``gather``
    parameters gathered at once, :func:`zero3_units`; every parameter of the stage when not resharding after
    forward), over DP x CP; routed experts over the expert data-parallel group ([MCORE-MOE] in
    costmodel.memory.moe_memory), with ``expert_unit`` their ZeRO-2/3 unit when only they are sharded."""
    sb = state_bytes(plan)
    shard = max(plan.dp * plan.cp, 1)
    zero = plan.zero if shard > 1 else 0  # nothing to shard over one rank (FSDP falls back to NO_SHARD)
    extra_b = BYTES_PARAM if plan.fp8_param_gather else sb.param  # embedding and head stay in bf16
    weights = sb.param * layer_params + extra_b * (params - layer_params)
    master_moved = 0.0
    if zero >= 3:
        gathered_b = sb.param
        working = gathered_b * (gather if reshards_after_forward(plan) else params)
        if plan.framework in FSDP2_STACKS and sb.master > 0:  # the sharded parameter is the main copy [FSDP2-MP]
            master_moved = sb.master
        weights = (master_moved or sb.param) * params / shard + working
    grads = sb.grad * (params / shard + grad_unit) if zero >= 2 else sb.grad * params
    opt = (sb.optimizer - master_moved) * params / (shard if zero >= 1 else 1)
    if expert:
        eshard = max(plan.expert_dp, 1)
        ezero = plan.zero if eshard > 1 else 0
        weights += sb.param * (expert / eshard if ezero >= 3 else expert) + (2 * sb.param * expert_unit
                                                                             if ezero >= 3 > zero else 0.0)
        grads += sb.grad * (expert / eshard if ezero >= 2 else expert) + (sb.grad * expert_unit
                                                                          if ezero >= 2 > zero else 0.0)
        opt += sb.optimizer * expert / (eshard if ezero >= 1 else 1)
    f = plan.optimizer_offload_fraction
    return weights, grads, opt * (1.0 - f), opt * f
