"""The architecture fields a launcher needs, read once from a ModelSpec and the config.json fields kept in its
``extra`` (norm epsilon, QKV-only bias, sliding window, partial rotary, QK-norm, multi-token prediction, RoPE
scaling, the gate function of a gated MLP), and the table of every ``extra`` key the exports know.

``planner.export`` writes these into every target; ``tests/test_export_fields.py`` checks that none is dropped:
each field becomes a flag/key of the target or a ``# NOTE: <field>: ...`` line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.core.kinds import describe_cost_sources
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan

if TYPE_CHECKING:  # planner.prediction pulls in the cost model; exports only read a finished Prediction
    from planner.prediction import Prediction


@dataclass(frozen=True)
class Architecture:
    """What the launchers need beyond ModelSpec's own fields (None: the model's source does not say)."""

    norm_eps: float | None
    """Epsilon of every LayerNorm / RMSNorm (config.json ``rms_norm_eps``, ``layer_norm_eps``, ...)."""
    qkv_bias: bool
    """A bias on the Q/K/V projections while the other linear layers have none (Qwen2)."""
    sliding_window: int | None
    """Tokens each query attends back to, when sliding-window attention is on (Mistral 7B: 4096)."""
    window_pattern: tuple[int, ...] | None
    """1 (sliding window) / 0 (full attention) per layer when not every layer uses the window (gpt-oss)."""
    rotary_percent: float | None
    """Fraction of each head's channels that RoPE rotates, when not all (GPT-NeoX: 0.25)."""
    qk_norm: bool
    """An RMSNorm over each head's query and key before attention (Qwen3 ``q_norm`` / ``k_norm``)."""
    mtp_layers: int
    """Multi-token-prediction modules after the last layer (DeepSeek-V3 ``num_nextn_predict_layers``)."""
    rope_scaling: dict | None
    """config.json ``rope_scaling`` / ``rope_parameters`` beyond the base (YaRN, Llama 3.1 scaling)."""
    gate: str | None
    """The gate function of a gated MLP when it is not SiLU (``gpt_oss_clamped_swiglu``, ``gelu_pytorch_tanh``)."""
    notes: tuple[str, ...]
    """What no launcher flag expresses exactly, each ``<field>: <why>`` (written into every export)."""


ARCHITECTURE_EXTRA = frozenset({
    "norm_eps", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon", "qkv_bias",
    "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers", "rotary_pct",
    "partial_rotary_factor", "qk_norm", "use_qk_norm", "num_nextn_predict_layers", "rope_scaling",
    "rope_parameters", "gated_activation", "swiglu_limit", "use_parallel_residual", "embedding_layernorm",
    "clip_qkv", "query_pre_attn_scalar", "scale_embeddings",
    # routing (planner.export_moe)
    "norm_topk_prob", "routed_scaling_factor", "topk_method", "n_group", "topk_group", "router_aux_loss_coef",
    "aux_loss_alpha", "seq_aux", "router_jitter_noise", "shared_expert_gate",
})
"""``ModelSpec.extra`` keys that change the network or its training: every export turns each into a flag/key or a
``# NOTE: <key>: ...`` line (tests/test_export_fields.py)."""

REFERENCE_EXTRA = {
    "model_type": "the config.json family; the torchtitan export reads it to choose torchtitan's model",
    "hidden_act": "the activation's name in config.json; ModelSpec.activation (and gated_activation) carry it",
    "config_max_position_embeddings": "the config's position limit after a context extension, not used in training",
    "initial_context_length": "gpt-oss's pre-training context, the preset's max_seq_len",
    "ep_size": "the inference-time expert split of DeepSeek's remote code",
    "norm_type": "MPT's norm kernel choice (low_precision_layernorm is a LayerNorm)",
    "unread_keys": "config.json keys planner does not read, listed in its warnings",
    "seq_len_source": "where the preset's default sequence length comes from",
}
"""``ModelSpec.extra`` keys kept for reference only, with why no launcher needs them."""

_EPS_KEYS = ("norm_eps", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")
_ROTARY_KEYS = ("rotary_pct", "partial_rotary_factor")


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def _bias(model: ModelSpec, ex: dict, notes: list[str]) -> bool:
    """QKV-only bias (Qwen2 qkv_bias, or Llama-style attention_bias without mlp_bias)."""
    attn_bias, mlp_bias = ex.get("attention_bias"), ex.get("mlp_bias")
    qkv_bias = not model.linear_bias and ex.get("qkv_bias") is True
    if attn_bias is True and mlp_bias is False:
        qkv_bias = True
        notes.append("attention_bias: the attention output projection also carries a bias, which --add-qkv-bias / "
                     "qkv_bias does not add")
    elif attn_bias is False and mlp_bias is True:
        notes.append("mlp_bias: only the MLP carries a bias; the export enables bias on every linear layer")
    return qkv_bias


def _window(model: ModelSpec, ex: dict, notes: list[str]) -> tuple[int | None, tuple[int, ...] | None]:
    """(window, per-layer pattern or None) from ModelSpec.sliding_window (gpt-oss) or extra (Mistral, Qwen2)."""
    if model.sliding_window > 0 and model.sliding_window_every > 0:
        pattern = tuple(int(model.uses_sliding_window(i)) for i in range(model.num_layers))
        return model.sliding_window, (None if all(pattern) else pattern)
    window = ex.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0 or ex.get("use_sliding_window") is False:
        return None, None
    layers = ex.get("max_window_layers")
    if isinstance(layers, int) and 0 < layers < model.num_layers:
        notes.append(f"max_window_layers: sliding-window attention applies only from layer {layers} on; the export "
                     "applies it to every layer")
    return window, None


def _notes_of_fields(model: ModelSpec, notes: list[str]) -> None:
    """Notes for the ModelSpec fields no launcher flag expresses (Megatron-LM @000c4ac24f61 has none for them)."""
    if model.parallel_attention:
        notes.append("parallel_attention: attention and MLP read the same input and join the residual in one add "
                     "(Falcon, GPT-J); the launchers build sequential blocks")
    if model.norms_per_layer != 2:
        notes.append(f"norms_per_layer: {model.norms_per_layer} norms per block "
                     + ("(one input norm shared by attention and MLP)" if model.norms_per_layer == 1 else
                        "(Gemma 2's norms before and after each sub-layer)") + "; the launchers build 2")
    for name, where in (("attn_logit_softcap", "attention scores"), ("final_logit_softcap", "output logits")):
        cap = getattr(model, name)
        if cap:
            notes.append(f"{name}: the {where} are soft-capped, cap * tanh(x / cap) with cap {cap:g}; no launcher "
                         "flag sets it")


def _notes_of_extras(ex: dict, notes: list[str]) -> None:
    """Notes for the extras no target expresses."""
    if ex.get("use_parallel_residual") is True:
        notes.append("use_parallel_residual: attention and MLP read the same input and their outputs are added "
                     "(GPT-NeoX); the launchers build sequential blocks")
    if ex.get("embedding_layernorm") is True:
        notes.append("embedding_layernorm: a LayerNorm after the word embedding (BLOOM) has no launcher flag")
    if ex.get("clip_qkv") is not None:
        notes.append(f"clip_qkv: the Q/K/V clamp at +-{ex['clip_qkv']} (MPT) has no launcher flag")
    if ex.get("scale_embeddings") is True:
        notes.append("scale_embeddings: the token embeddings are multiplied by sqrt(hidden) (Gemma); no launcher "
                     "flag sets it")


def architecture(model: ModelSpec) -> Architecture:
    """The launcher-relevant fields of ``model`` (see :class:`Architecture`)."""
    ex = model.extra if isinstance(model.extra, dict) else {}
    notes: list[str] = []
    eps = next((e for e in (_number(ex.get(k)) for k in _EPS_KEYS) if e is not None), None)
    qkv_bias = _bias(model, ex, notes)
    window, pattern = _window(model, ex, notes)
    rotary = next((r for r in (_number(ex.get(k)) for k in _ROTARY_KEYS) if r is not None), None)
    if model.position_embedding != "rope" or rotary == 1.0:
        rotary = None
    scaling = next((ex[k] for k in ("rope_scaling", "rope_parameters") if isinstance(ex.get(k), dict)), None)
    if scaling is not None and (scaling.get("rope_type") or scaling.get("type")) in (None, "default"):
        scaling = None
    gate = ex.get("gated_activation") if model.gated else None
    mtp = model.mtp_layers
    _notes_of_fields(model, notes)
    _notes_of_extras(ex, notes)
    scalar = ex.get("query_pre_attn_scalar")
    if isinstance(scalar, (int, float)) and float(scalar) != float(model.head_dim):
        notes.append(f"query_pre_attn_scalar: attention scores are scaled by 1/sqrt({scalar:g}), not 1/sqrt(head "
                     f"dim {model.head_dim}); no launcher flag sets it")
    return Architecture(norm_eps=eps, qkv_bias=qkv_bias, sliding_window=window, window_pattern=pattern,
                        rotary_percent=rotary, qk_norm=ex.get("qk_norm") is True or ex.get("use_qk_norm") is True,
                        mtp_layers=mtp, rope_scaling=scaling, gate=gate if isinstance(gate, str) else None,
                        notes=tuple(notes))


def fmt_float(x: float) -> str:
    """Shortest text that reads back as ``x`` (1e-06, 0.25, 500000.0 -> '1e-06', '0.25', '500000.0')."""
    return repr(float(x))


def layer_pattern_text(pattern) -> str:
    """A 0/1 layer pattern as the run-length list expression Megatron-LM's moe_freq_type reads (--moe-layer-freq,
    --window-attn-skip-freq), e.g. '([0]*3+[1]*58)'."""
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def alternating(pattern) -> bool:
    """The 0/1 layer pattern is 1, 0, 1, 0, ... (a sliding window on every other layer from layer 0)."""
    return all(v == (i % 2 == 0) for i, v in enumerate(pattern))


def describe_architecture(model: ModelSpec, arch: Architecture) -> str:
    """One line naming every architecture field (for launchers that take them from a model definition)."""
    parts = [f"layers {model.num_layers}", f"hidden {model.hidden_size}", f"heads {model.num_heads}",
             f"KV heads {model.num_kv_heads}", f"head dim {model.head_dim}", f"FFN hidden {model.ffn_hidden_size}",
             f"vocab {model.vocab_size}", f"activation {model.activation}", f"norm {model.norm}",
             f"norm eps {fmt_float(arch.norm_eps) if arch.norm_eps is not None else 'not stated'}",
             f"position {model.position_embedding}"]
    if model.position_embedding == "rope":
        parts.append(f"rope theta {fmt_float(model.rope_theta) if model.rope_theta else 'not stated'}")
    if arch.rotary_percent is not None:
        parts.append(f"rotary percent {fmt_float(arch.rotary_percent)}")
    parts.append(f"tied embeddings {'yes' if model.tied_embeddings else 'no'}")
    parts.append("bias " + ("all linears" if model.linear_bias else "QKV only" if arch.qkv_bias else "none"))
    parts.append(f"sliding window {arch.sliding_window if arch.sliding_window is not None else 'none'}")
    if arch.window_pattern is not None:
        parts.append("window layers " + ("every other from layer 0" if alternating(arch.window_pattern)
                                         else layer_pattern_text(arch.window_pattern)))
    if arch.qk_norm:
        parts.append("QK norm yes")
    if arch.gate is not None:
        parts.append(f"gate {arch.gate}")
    if model.attention_sinks:
        parts.append("attention sinks yes")
    parts += [f"max positions {model.max_seq_len}", f"dropout {'yes' if model.dropout else 'no'}"]
    if model.is_moe:
        parts += [f"experts {model.num_experts}", f"top-k {model.experts_per_token}", f"expert FFN {model.expert_ffn}",
                  f"shared experts {model.num_shared_experts} x "
                  f"{model.shared_expert_ffn_hidden_size or model.expert_ffn}",
                  f"dense-first layers {model.first_dense_layers}", f"MoE every {model.moe_layer_freq}",
                  f"router {model.router}", f"capacity factor {model.capacity_factor:g}"]
    if model.is_mla:
        parts += [f"q LoRA rank {model.q_lora_rank}", f"KV LoRA rank {model.kv_lora_rank}",
                  f"rope head dim {model.qk_rope_head_dim}", f"V head dim {model.v_head_dim or model.head_dim}"]
    if arch.mtp_layers:
        parts.append(f"MTP layers {arch.mtp_layers}")
    ex = model.extra if isinstance(model.extra, dict) else {}
    stated = [f"{k}={ex[k]!r}" for k in sorted(ARCHITECTURE_EXTRA) if ex.get(k) is not None]
    if stated:
        parts.append("config " + " ".join(stated))
    return ", ".join(parts)


# ------------------------------------------------------------------------------------- shared by exports
def is_uneven(plan: ParallelPlan) -> bool:
    """The plan's pipeline stages hold different numbers of layers."""
    return plan.pipeline_layout is not None or (plan.layer_split is not None and len(set(plan.layer_split)) > 1)


def note_lines(notes) -> list[str]:
    """``# NOTE: ...`` comment lines, one per note."""
    return [f"# NOTE: {n}." for n in notes]


def header(title: str, model: ModelSpec, plan: ParallelPlan, hardware: Hardware,
           prediction: "Prediction | None") -> list[str]:
    """Comment lines opening every export: what, where, the layout, the architecture, the prediction."""
    lines = [f"# {title} for {model.name} on {plan.gpus} x {hardware.gpu.name} "
             f"({plan.num_nodes} node(s) x {plan.gpus_per_node} GPUs), written by `planner export`.",
             f"# Layout: {plan.factors()}",
             f"# Architecture: {describe_architecture(model, architecture(model))}."]
    if prediction is not None:
        lines.append(f"# Predicted iteration time {prediction.iteration_time_s:.4g} s, memory "
                     f"{prediction.memory_gib_per_gpu:.1f} GiB per GPU (cost model: "
                     f"{describe_cost_sources(prediction.cost_sources, prediction.cost_model)}).")
        if not prediction.fits_in_memory:
            lines.append("# WARNING: the predicted memory per GPU exceeds the GPU's capacity; this plan will not fit.")
    return lines
