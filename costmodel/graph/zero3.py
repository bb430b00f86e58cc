"""ZeRO-3 / FSDP parameter gathers and gradient reduce-scatters of one sharded unit, one micro-batch.

Each unit (a transformer layer, or the root unit that holds the embedding, the final norm and the output layer)
all-gathers its parameter shards before its forward and again before its backward, and reduce-scatters its
gradients after its backward (Zhao et al., "PyTorch FSDP", VLDB 2023, sec. 3.3). The layers' collectives are
prefetched and overlap the neighbouring layers' compute (costmodel.graph.build layer_overlap_ops); the root unit's have
nothing to hide under and are exposed (:func:`root_unit_ops`).
"""

from __future__ import annotations

from costmodel.core.kinds import Category, Phase
from costmodel.core.specs.framework import get_framework
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.opbuild import coll, group_topology
from costmodel.graph.ops import Op
from costmodel.memory.memory_states import reshards_after_forward
from costmodel.memory.offload import grad_reduce_bytes, param_gather_bytes


def unit_collectives(prefix: str, params: float, group: int, stride: int, plan: ParallelPlan,
                     gather_phases: tuple[Phase, ...] = (Phase.FWD, Phase.BWD)) -> list[Op]:
    """All-gathers (one per phase of ``gather_phases``; none before the backward when the plan keeps parameters
    gathered after forward, ``costmodel.memory.memory_states.reshards_after_forward``) of ``params`` parameters per GPU
    shard group of ``group`` ranks ``stride`` apart (``costmodel.memory.offload.param_gather_bytes`` each), and the
    reduce-scatter of their gradients (backward, ``costmodel.memory.offload.grad_reduce_bytes``)."""
    if group <= 1 or params <= 0:
        return []
    if not reshards_after_forward(plan):  # kept gathered from the unit's forward to its backward
        gather_phases = tuple(p for p in gather_phases if p is not Phase.BWD)
    fw = get_framework(plan.framework)
    topo = group_topology(group, stride, plan.domain)
    if topo[0] > 1 and fw.zero3_network == "flat":
        # DeepSpeed ZeRO-3: each GPU's gathered bytes cross the network at its own NIC rate (ZeRO++,
        # Wang et al. 2023, sec. 3: cross-node volume M per all-gather), costed as a ring of single-GPU nodes
        topo = (group, 1)
    pbytes = params * param_gather_bytes(plan)
    out = [coll("all_gather", f"{prefix}.param_allgather", phase, pbytes, group, topo, Category.ZERO_COMM)
           for phase in gather_phases]
    gbytes = params * grad_reduce_bytes(plan)
    out.append(coll("reduce_scatter", f"{prefix}.grad_reducescatter", Phase.BWD, gbytes, group, topo,
                    Category.ZERO_COMM))
    return out


def root_unit_ops(prefix: str, params: float, plan: ParallelPlan) -> list[Op]:
    """ZeRO-3 collectives of the root unit's ``params`` on this stage (embedding on the first, final norm and output
    layer on the last; / TP, which shards them vocab-parallel): torchtitan (parallelize_llama.py at 9dec370, its
    Dec-2024 benchmarks) wraps them in the model's own ``fully_shard``, whose all-gather runs before the first
    layer and whose gradient reduce-scatter runs after the last backward, with no compute left to hide under:
    exposed, once per micro-batch. The root stays gathered from its forward to its backward (FSDP2 does not
    reshard the root after forward), so it gathers once. Later torchtitan shards the embedding and [norm, output]
    as units of their own, where the output layer's collectives can overlap the last layers (not modelled), and
    under PP keeps every unit gathered across micro-batches (``reshard_after_forward = not pp_enabled``), which
    the per-micro-batch gathers of this model do not follow either (README, Known gaps)."""
    if plan.zero != 3:
        return []
    return unit_collectives(f"zero3.{prefix}", params / plan.tp, plan.dp * plan.cp, plan.tp, plan, (Phase.FWD,))
