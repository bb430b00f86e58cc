"""Multi-token prediction (MTP): the extra prediction depths of DeepSeek-V3, their parameters and memory.

Sources
-------
* [DSV3] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, sec. 2.2 (eq. 21-25): the k-th MTP module
  has a shared embedding layer, a shared output head, one Transformer block and a projection matrix M_k (d x 2d);
  it combines RMSNorm(h^{k-1}) with RMSNorm(Emb(t_{i+k})), projects them to d, runs the block and the shared head
  and adds a cross-entropy loss. D = 1 in DeepSeek-V3 (config.json ``num_nextn_predict_layers``).
* [MCORE-MTP] NVIDIA/Megatron-LM ``megatron/core/transformer/multi_token_prediction.py`` @d98e8a64
  (MultiTokenPredictionLayer: ``enorm`` and ``hnorm``, ``eh_proj`` a column-parallel 2h -> h linear, the
  ``transformer_layer`` built with the decoder's layer spec, ``final_layernorm``; the embedding and the output layer
  are the model's). The MTP block sits on the last pipeline stage; with PP > 1 the last stage keeps a copy of the
  word embedding whose gradient is all-reduced with the first stage's, as for tied embeddings.
* [MCORE-FLOPS] ``megatron/training/training.py`` ``num_floating_point_operations`` @d98e8a64: an MTP depth counts
  as one more layer of the last layer's kind (MoE when the last layer is), plus its norms and the 2h x h
  ``eh_proj``, and the logits once more per depth ("MTP + final logit").

The Transformer block of a depth is built like the model's last layer (MoE in DeepSeek-V3). costmodel.graph.mtp_ops adds
the operators to the last stage, costmodel.schedule.flops counts the FLOPs; :func:`mtp_param_parts_per_gpu` and
:func:`mtp_activation_bytes` are the terms costmodel.memory.per_gpu adds to the last stage.
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.moe_memory import layer_param_parts


def mtp_layer(model: ModelSpec) -> int:
    """Index of the decoder layer an MTP depth's Transformer block is built like: the last one [MCORE-MTP]."""
    return model.num_layers - 1


def mtp_extra_params(model: ModelSpec) -> int:
    """Weights of one MTP depth beyond its Transformer block [DSV3] [MCORE-MTP]: ``eh_proj`` (2h x h) and three
    norms (enorm, hnorm, final_layernorm; LayerNorm twice the weights of RMSNorm)."""
    h = model.hidden_size
    return 2 * h * h + 3 * h * (2 if model.norm == "layernorm" else 1)


def mtp_params(model: ModelSpec) -> int:
    """All MTP weights of the model (the shared embedding and head not counted again)."""
    return model.mtp_layers * (model.layer_params(mtp_layer(model)) + mtp_extra_params(model))


def mtp_param_parts_per_gpu(model: ModelSpec, plan: ParallelPlan, padded_vocab: int) -> tuple[float, float]:
    """(non-expert, routed-expert) MTP weights on one GPU of the last stage: per depth the block's parts as a decoder
    layer's (costmodel.memory.moe_memory.layer_param_parts), ``eh_proj`` split over TP, the norms replicated; with PP >
    1 the word-embedding copy (``padded_vocab`` x h / TP) [MCORE-MTP]. (0, 0) without MTP."""
    if not model.mtp_layers:
        return 0.0, 0.0
    dense, expert = layer_param_parts(model, mtp_layer(model), plan.tp, plan.ep, plan.etp)
    h = model.hidden_size
    extra = 2 * h * h / plan.tp + 3 * h * (2 if model.norm == "layernorm" else 1)
    emb = padded_vocab * h / plan.tp if plan.pp > 1 else 0.0
    return model.mtp_layers * (dense + extra) + emb, model.mtp_layers * expert


def mtp_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer_bytes: float, head_bytes: float,
                         act_b: float) -> float:
    """Activations one micro-batch of the MTP depths stores on the last stage: per depth its block's
    (``layer_bytes``, a decoder layer's of the last layer's kind, as costmodel.memory.per_gpu counts it), the inputs of
    enorm and hnorm (the shifted tokens' embedding and the hidden state, h each) and of ``eh_proj`` (2h), all on the
    sequence shard with SP, and its head's (``head_bytes``: final-norm and output-layer inputs, logits, as the main
    head's). Only the micro-batch whose loss runs holds them (the head's rule of costmodel.memory.per_gpu)."""
    if not model.mtp_layers:
        return 0.0
    tokens = plan.seq_len / plan.cp * plan.mbs / (plan.tp if plan.sp else 1)
    inputs = act_b * tokens * 4 * model.hidden_size
    return model.mtp_layers * (layer_bytes + inputs + head_bytes)
