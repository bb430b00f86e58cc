"""Operators of block variants beyond the dense pre-norm block of :mod:`costmodel.graph.build`: parallel attention + MLP
blocks (GPT-J, PaLM, Falcon), one or four norms per block (Falcon-7B, Gemma 2) and Gemma 2's final logit
soft-capping; and the warnings for what the graph leaves out of a model (attention soft-capping).

:func:`costmodel.graph.build.layer_operators` and its head operators call these; records are built with
``costmodel.graph.opbuild`` and ``costmodel.graph.attention_ops.norm_ops``, as graph's are.
"""

from __future__ import annotations

from costmodel.core.kinds import Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.graph.attention_ops import norm_ops
from costmodel.graph.opbuild import hbm_pass
from costmodel.graph.ops import Op


def model_warnings(model: ModelSpec) -> list[str]:
    """What the operator graph leaves out of a model's time, said once per prediction."""
    if model.attn_logit_softcap > 0:
        return [f"attention logit soft-capping (cap {model.attn_logit_softcap:g}): FlashAttention applies its tanh "
                "per score inside the kernel, and the measured attention kernels have no soft-capping: its time is "
                "not costed (attention is likely underestimated)"]
    return []


LOGIT_SOFTCAP_BYTES = (8.0, 12.0)
"""HBM bytes per fp32 logit of the final soft-capping pass, forward (read, write) and backward (read the
gradient and the saved tanh, write the gradient): element-wise definitions, as the cross-entropy's 4-byte logits."""


def final_softcap_ops(model: ModelSpec, tokens: int, vocab: int, dtype: str) -> list[Op]:
    """Gemma 2's final logit soft-capping (cap * tanh(logit / cap) over the LM head's output, arXiv 2408.00118
    sec. 2): an element-wise pass over the logits, forward and backward, as HBM passes; none without a cap."""
    if model.final_logit_softcap <= 0:
        return []
    n = float(tokens) * vocab
    return [hbm_pass("logit_softcap", Phase.FWD, LOGIT_SOFTCAP_BYTES[0] * n, dtype),
            hbm_pass("logit_softcap", Phase.BWD, LOGIT_SOFTCAP_BYTES[1] * n, dtype)]


def block_variant_ops(ops: list[Op], model: ModelSpec, rows: int, dtype: str) -> list[Op]:
    """A block's norms and residual adds as the model has them (costmodel.graph.build's dense block has two of each): a
    parallel block (``parallel_attention``: GPT-J, PaLM, Falcon) adds attention and MLP outputs to the residual at once,
    one residual add fewer; ``norms_per_layer`` 1 drops the MLP's norm (Falcon-7B's shared input norm), 4 adds
    the post-attention and post-MLP norms of Gemma 2 (its "post-norm", arXiv 2408.00118 sec. 2), each a norm of
    the same rows. The TP collectives stay one pair per sub-layer (Megatron-Core has no fused parallel block)."""
    out = list(ops)
    if model.parallel_attention:
        last = max(i for i, o in enumerate(out) if o.name == "residual_add" and o.phase is Phase.FWD)
        del out[last]
    if model.norms_per_layer == 1:
        out = [o for o in out if o.name != "mlp_norm"]
    for name in ("post_attn_norm", "post_mlp_norm")[: max(0, model.norms_per_layer - 2)]:
        out += norm_ops(name, rows, model.hidden_size, 1 if model.norm == "rmsnorm" else 0, dtype)
    return out
