"""Time of the memory features that move bytes: optimizer and activation offloading to host memory, and the
communication precision of bf16 main gradients and fp8 primary weights.

Sources
-------
* [MEGATRON-HDO] Megatron-LM ``--optimizer-cpu-offload`` / ``--optimizer-offload-fraction`` (HybridDeviceOptimizer,
  megatron/core/optimizer/cpu_offloading, NVIDIA/Megatron-LM @d98e8a64ddf3): the offloaded share of the optimizer
  shard is stepped on the CPU; its gradients go device-to-host and its updated parameters host-to-device each step
  (``--overlap-cpu-optimizer-d2h-h2d`` overlaps the copies with the step; not modelled: the copies and the step
  add up, the no-overlap default).
* [MCORE-OFFLOAD] Megatron-Core fine-grained activation offloading (docs/user-guide/features/
  fine_grained_activation_offloading.md, same commit): each offloaded input goes device-to-host in its forward and
  back in its backward on a side stream, overlapping compute; "useful for partial offloading when PCIe bandwidth
  is a bottleneck", i.e. the copies cost time only where the link cannot keep up with the compute.
* Host link and host memory bandwidths: ``GPUSpec.host_link_bw_gbs`` / ``host_mem_bw_gbs`` (the hardware catalogue;
  PCIe or GH200's NVLink-C2C, 450 GB/s per direction, against PCIe Gen5 x16's 63).
"""

from __future__ import annotations

from costmodel.core.errors import PlanError
from costmodel.core.specs.framework import get_framework
from costmodel.core.specs.hardware import GPUSpec
from costmodel.core.specs.memory_features import BYTES
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.memory_states import BYTES_FP8_PARAM, BYTES_PARAM, state_bytes


def grad_reduce_bytes(plan: ParallelPlan) -> float:
    """Bytes per gradient element in the data-parallel reduction: 2 where the plan gives bf16 or fp16 main gradients
    (Megatron --main-grads-dtype bf16 / --grad-reduce-in-bf16: the grad buffer, and so its reduce-scatter, is bf16),
    else the framework's reduce dtype (``Framework.grad_reduce_bytes``)."""
    if plan.main_grads_dtype in ("bf16", "fp16"):
        return BYTES[plan.main_grads_dtype]
    return get_framework(plan.framework).grad_reduce_bytes


def param_gather_bytes(plan: ParallelPlan) -> float:
    """Bytes per parameter in the distributed optimizer's / ZeRO-3's parameter all-gathers: 1 with fp8 primary
    weights (--fp8-param-gather: "perform the param all-gather in fp8"), else 2 (bf16)."""
    return BYTES_FP8_PARAM if plan.fp8_param_gather else BYTES_PARAM


def _bandwidth(gpu: GPUSpec, field: str, what: str) -> float:
    bw = getattr(gpu, field)
    if bw <= 0:
        raise PlanError(f"{what} needs the {gpu.name}'s {field} (GB/s), which the hardware catalogue does not give: "
                        f"add it in a --hardware-file, or drop the offloading")
    return bw * 1e9


def optimizer_offload_s(plan: ParallelPlan, gpu: GPUSpec, host_params: float) -> float:
    """Seconds per iteration the host adds for ``host_params`` parameters of the optimizer shard stepped on the CPU
    [MEGATRON-HDO]: their main gradients device-to-host and updated parameters host-to-device over the host link, and
    the CPU step streaming the states through host memory (read the gradient, read and write the main parameters and
    both moments, write the parameter: Adam's update, Kingma & Ba 2015, Alg. 1)."""
    if host_params <= 0:
        return 0.0
    sb = state_bytes(plan)
    link = _bandwidth(gpu, "host_link_bw_gbs", "optimizer offloading")
    mem = _bandwidth(gpu, "host_mem_bw_gbs", "optimizer offloading (the CPU optimizer step)")
    step_bytes = sb.grad + 2 * (sb.master + sb.moments) + sb.param
    return host_params * ((sb.grad + sb.param) / link + step_bytes / mem)


def activation_offload_exposed_s(plan: ParallelPlan, gpu: GPUSpec, bytes_per_microbatch: float, microbatches: int,
                                 fwd_s: float, bwd_s: float) -> float:
    """Seconds per iteration activation offloading adds to a stage [MCORE-OFFLOAD]: each offloaded byte goes
    device-to-host during the forward passes and host-to-device during the backward passes (one direction each, so
    the two copies use the duplex link side by side), on a side stream beside the stage's ``microbatches`` forward
    (``fwd_s`` each) and backward (``bwd_s`` each) computations; what a direction's copies exceed their pass by is
    exposed."""
    if bytes_per_microbatch <= 0:
        return 0.0
    copy_s = bytes_per_microbatch * microbatches / _bandwidth(gpu, "host_link_bw_gbs", "activation offloading")
    return max(0.0, copy_s - fwd_s * microbatches) + max(0.0, copy_s - bwd_s * microbatches)


def stage_offload_s(plan: ParallelPlan, gpu: GPUSpec, graph, fwd_s: float, bwd_s: float, i: int) -> tuple[float, float]:
    """(host optimizer step, exposed activation copies) of stage ``i`` of the operator graph (its ``host_offload``:
    costmodel.memory.per_gpu.stage_host_offload), seconds per iteration; zeros without offloading. ``fwd_s`` /
    ``bwd_s``: the stage's forward / backward time of one micro-batch."""
    if not graph.host_offload:
        return 0.0, 0.0
    opt_params, act_bytes = graph.host_offload[i]
    return (optimizer_offload_s(plan, gpu, opt_params),
            activation_offload_exposed_s(plan, gpu, act_bytes, graph.num_microbatches, fwd_s, bwd_s))
