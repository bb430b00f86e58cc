"""Operators of the multi-token-prediction (MTP) depths on the last pipeline stage, one micro-batch, one GPU.

Per depth (costmodel.memory.mtp [DSV3] sec. 2.2, [MCORE-MTP] MultiTokenPredictionLayer.forward): the shared embedding of
the shifted tokens, ``enorm`` on it and ``hnorm`` on the previous depth's hidden state, ``eh_proj`` (a column-
parallel 2h -> h linear over their concatenation, entered and left like the dense MLP's TP region), one Transformer
block built like the model's last layer (its forward, backward and recomputed operators and its EP / CP
collectives, here exposed: the MTP block runs after the last layer with nothing of its own micro-batch left to
hide under), and the shared head: final norm, output layer and cross entropy. :func:`costmodel.graph.build.build_graph`
passes the block's and the main embedding's and head's operators in, so an MTP depth costs as those do.
"""

from __future__ import annotations

from dataclasses import replace

from costmodel.core.kinds import Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.moe import SM_SHARE
from costmodel.graph.opbuild import elem_bytes, gemm_fwd_bwd, group_topology, mem, tp_boundary
from costmodel.graph.ops import Op

PREFIX = "mtp."
"""Name prefix of the MTP operators (their costs are those of the operators they copy: Op.key ignores names)."""


def _norms(model: ModelSpec, plan: ParallelPlan) -> list[Op]:
    """enorm and hnorm, forward and backward, on the sequence shard (the decoder norms' records)."""
    tokens = plan.mbs * plan.seq_len // plan.cp
    sp_tokens = tokens // plan.tp if plan.sp else tokens
    h = model.hidden_size
    nbytes = sp_tokens * h * elem_bytes(plan.dtype)
    rms = 1 if model.norm == "rmsnorm" else 0
    return [mem("norm", name, phase, (sp_tokens, h, rms), k * nbytes, f * sp_tokens * h)
            for name in ("enorm", "hnorm") for phase, k, f in ((Phase.FWD, 2, 8.0), (Phase.BWD, 4, 16.0))]


def _eh_proj(model: ModelSpec, plan: ParallelPlan) -> list[Op]:
    """``eh_proj``: [Emb; h] (2h) -> h, column-parallel over TP, with the TP collectives of entering the region on
    the 2h input and leaving it on the h output."""
    tokens = plan.mbs * plan.seq_len // plan.cp
    h, t = model.hidden_size, plan.tp
    eb = elem_bytes(plan.dtype)
    topo = group_topology(t, 1, plan.domain)
    return (tp_boundary("eh_proj", True, plan, tokens * 2 * h * eb, topo)
            + gemm_fwd_bwd("eh_proj", tokens, -(-h // t), 2 * h, plan.dtype)
            + tp_boundary("eh_proj", False, plan, tokens * h * eb, topo))


def mtp_operators(model: ModelSpec, plan: ParallelPlan, block: list[Op], block_overlap: list[Op],
                  embedding: list[Op], head: list[Op]) -> list[Op]:
    """Once-per-micro-batch operators of the model's MTP depths on the last stage ([] without MTP): per depth the
    ``embedding`` operators, the two norms, ``eh_proj``, the ``block`` (a decoder layer's operators of the last
    layer's kind) with its overlapped collectives ``block_overlap`` exposed, and the ``head`` operators; each
    copied with the :data:`PREFIX` and its count times the depths."""
    depths = model.mtp_layers
    if not depths:
        return []
    block = [o for o in block if o.name != SM_SHARE]  # its collectives are exposed here: no SM share
    ops = embedding + _norms(model, plan) + _eh_proj(model, plan) + block + block_overlap + head
    return [replace(o, name=PREFIX + o.name, count=o.count * depths) for o in ops]
