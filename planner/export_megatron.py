"""Megatron-LM architecture flags of a model (the network, not the layout), and the NeMo keys that carry the same
Megatron-Core TransformerConfig fields.

Flag names and semantics: NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at commit 000c4ac24f61 (the commit
:mod:`planner.export` cites): ``_add_network_size_args`` (--num-layers ... --norm-epsilon, --swiglu, --squared-relu,
--quick-geglu, --activation-func-clamp-value, --glu-linear-offset "activation_func(x[0]) * (x[1] + offset)",
--softmax-type {vanilla, off-by-one, learnable}, --window-size, --window-attn-skip-freq ("an integer N: one full
attention layer after (N-1) SWA layers", or a list expression, 1 = SWA), --use-rope-scaling / --rope-scaling-factor
(Llama 3.1 scaling, ``_apply_scaling`` with low 1, high 4, 8192 original positions in
megatron/core/models/common/embeddings/rotary_pos_embedding.py), --mtp-num-layers), ``_add_vision_args``
(--qk-layernorm), ``_add_training_args`` (--rope-type {rope, yarn}: "MLA takes yarn by default"), ``_add_mla_args``
(--rotary-scaling-factor, --mscale, --mscale-all-dim; MLATransformerConfig defaults 40, 1.0, 0.0, 4096 original
positions). Megatron's quick_gelu is ``x * sigmoid(1.702 x)`` (megatron/training/activations.py): with
--glu-linear-offset 1.0 and the clamp it is gpt-oss's gate (``gate * sigmoid(1.702 gate) * (up + 1)``, swiglu_limit).
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from planner.export_arch import Architecture, alternating, architecture, fmt_float, layer_pattern_text

MEGATRON_COMMIT = "000c4ac24f61"
LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""The Llama 3.1 RoPE scaling parameters Megatron-LM's _apply_scaling fixes (only the factor is a flag)."""
MLA_YARN_ORIGINAL = 4096
"""MLATransformerConfig.original_max_position_embeddings (no flag sets it at the pinned commit)."""

Pairs = list[tuple[str, object]]


def _activation(model: ModelSpec, arch: Architecture, notes: list[str]) -> Pairs:
    if model.activation == "swiglu" and arch.gate == "gpt_oss_clamped_swiglu":
        limit = model.extra.get("swiglu_limit", 7.0)
        return [("--quick-geglu", None), ("--activation-func-clamp-value", fmt_float(limit)),
                ("--glu-linear-offset", "1.0")]
    if model.activation == "swiglu":
        if arch.gate is not None:
            notes.append(f"gated_activation: the MLP gate is {arch.gate}, not SiLU; Megatron-LM ({MEGATRON_COMMIT}) "
                         "has no flag for it, so --swiglu builds the same GEMM shapes with a SiLU gate")
        return [("--swiglu", None)]
    if model.activation == "squared_relu":
        return [("--squared-relu", None)]
    if model.activation == "relu":
        notes.append("activation: relu has no Megatron-LM flag (default is gelu); set it in a custom spec")
    return []


def _rope_scaling(model: ModelSpec, arch: Architecture, notes: list[str]) -> Pairs:
    """RoPE-scaling flags: YaRN for MLA (Megatron's MLA default rope type), Llama 3.1 scaling otherwise."""
    sc = arch.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    if model.is_mla:
        if kind != "yarn":
            return [("--rope-type", "rope")]
        if sc.get("original_max_position_embeddings", MLA_YARN_ORIGINAL) != MLA_YARN_ORIGINAL:
            notes.append(f"rope_scaling: YaRN over {sc['original_max_position_embeddings']} original positions; "
                         f"Megatron-LM's MLA uses {MLA_YARN_ORIGINAL} (no flag)")
        return [("--rotary-scaling-factor", fmt_float(sc.get("factor", 40))),
                ("--mscale", fmt_float(sc.get("mscale", 1.0))),
                ("--mscale-all-dim", fmt_float(sc.get("mscale_all_dim", 0.0)))]
    if kind == "llama3":
        others = {k: sc.get(k) for k in LLAMA3_SCALING}
        if any(v is not None and float(v) != LLAMA3_SCALING[k] for k, v in others.items()):
            notes.append(f"rope_scaling: Llama 3.1 scaling with {others}; Megatron-LM fixes {LLAMA3_SCALING}")
        return [("--use-rope-scaling", None), ("--rope-scaling-factor", fmt_float(sc.get("factor", 8.0)))]
    if kind is not None:
        notes.append(f"rope_scaling: {kind} scaling ({sc}) is a context extension Megatron-LM's standard attention "
                     "does not take (--rope-type yarn is MLA-only); train at the original context without it")
    return []


def _position(model: ModelSpec, arch: Architecture, notes: list[str]) -> Pairs:
    if model.position_embedding == "alibi":
        notes.append("position_embedding: ALiBi has no Megatron-LM --position-embedding-type choice")
        return []
    out: Pairs = [("--position-embedding-type",
                   {"rope": "rope", "learned": "learned_absolute", "none": "none"}[model.position_embedding])]
    if model.position_embedding != "rope":
        return out
    if model.rope_theta is not None:
        out.append(("--rotary-base", int(model.rope_theta)))
    else:
        notes.append("rope_theta: the model's source states no RoPE base; Megatron's default --rotary-base 10000 "
                     "applies")
    if arch.rotary_percent is not None:
        out.append(("--rotary-percent", fmt_float(arch.rotary_percent)))
    return out + _rope_scaling(model, arch, notes)


def _attention(model: ModelSpec, arch: Architecture) -> Pairs:
    out: Pairs = [("--num-attention-heads", model.num_heads)]
    if model.num_kv_heads != model.num_heads:
        out += [("--group-query-attention", None), ("--num-query-groups", model.num_kv_heads)]
    if model.head_dim * model.num_heads != model.hidden_size:
        out.append(("--kv-channels", model.head_dim))
    if arch.qk_norm or model.is_mla:
        # MLA: --qk-layernorm builds the RMSNorms on the compressed Q and KV latents that DeepSeek-V2/V3 have
        # (gpt_layer_specs.py: linear_q_up_proj / linear_kv_up_proj become layer-norm linears)
        out.append(("--qk-layernorm", None))
    if model.attention_sinks:  # learned per-head sink logits (gpt-oss): TE's learnable softmax offset
        out.append(("--softmax-type", "learnable"))
    if arch.sliding_window is not None:  # (left, right) window; right 0 = causal (tuple_type, "4096,0")
        out.append(("--window-size", f"{arch.sliding_window},0"))
        if arch.window_pattern is not None:
            pattern = arch.window_pattern  # Megatron's int N: N - 1 window layers, then a full one (1-based)
            out.append(("--window-attn-skip-freq", 2 if alternating(pattern) else layer_pattern_text(pattern)))
    return out


def megatron_arch_args(model: ModelSpec) -> tuple[Pairs, list[str]]:
    """(flag, value / None / list) pairs of the network's architecture and the notes on what they miss."""
    arch = architecture(model)
    notes: list[str] = []
    out: Pairs = [("--num-layers", model.num_layers), ("--hidden-size", model.hidden_size)]
    out += _attention(model, arch)
    out.append(("--ffn-hidden-size", model.ffn_hidden_size))
    out += _activation(model, arch, notes)
    out.append(("--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"))
    out += _position(model, arch, notes)
    if arch.norm_eps is not None:
        out.append(("--norm-epsilon", fmt_float(arch.norm_eps)))
    else:
        notes.append("norm_eps: the model's source states no norm epsilon; Megatron's default --norm-epsilon 1e-5 "
                     "applies")
    if not model.tied_embeddings:
        out.append(("--untie-embeddings-and-output-weights", None))
    if not model.linear_bias:
        out.append(("--disable-bias-linear", None))
        if arch.qkv_bias:
            out.append(("--add-qkv-bias", None))
    # _add_tokenizer_args: read by NullTokenizer; a real tokenizer (--tokenizer-type ...) sets the vocabulary
    out.append(("--vocab-size", model.vocab_size))
    if arch.mtp_layers:  # multi-token prediction (DeepSeek-V3 sec. 2.2), RoPE models only (validate_args)
        out.append(("--mtp-num-layers", arch.mtp_layers))
    if not model.dropout:  # Megatron's defaults are 0.1 (_add_regularization_args)
        out += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    return out, notes + list(arch.notes)


NEMO_TRANSFORMER_KEYS = {
    "--qk-layernorm": "qk_layernorm", "--softmax-type": "softmax_type", "--window-attn-skip-freq":
    "window_attn_skip_freq", "--mtp-num-layers": "mtp_num_layers", "--rope-type": "rope_type",
    "--rotary-scaling-factor": "rotary_scaling_factor", "--mscale": "mscale", "--mscale-all-dim": "mscale_all_dim",
    "--activation-func-clamp-value": "activation_func_clamp_value", "--glu-linear-offset": "glu_linear_offset",
}
"""Megatron-LM flags whose Megatron-Core TransformerConfig / MLATransformerConfig field NeMo's model config passes on
(megatron/core/transformer/transformer_config.py @000c4ac24f61: qk_layernorm, softmax_type, window_attn_skip_freq,
mtp_num_layers, glu_linear_offset, activation_func_clamp_value; MLATransformerConfig: rope_type,
rotary_scaling_factor, mscale, mscale_all_dim)."""


def nemo_arch_keys(model: ModelSpec) -> tuple[dict, list[str]]:
    """NeMo model-config keys of the architecture flags in :data:`NEMO_TRANSFORMER_KEYS`, and notes for the flags
    NeMo's own keys cannot state (Llama 3.1 RoPE scaling, the gpt-oss gate function)."""
    pairs, _ = megatron_arch_args(model)
    keys: dict = {}
    notes: list[str] = []
    for flag, value in pairs:
        if flag == "--window-attn-skip-freq":  # the 0/1 list itself where the flag has its list expression
            keys["window_attn_skip_freq"] = value if isinstance(value, int) else \
                list(architecture(model).window_pattern or ())
        elif flag in NEMO_TRANSFORMER_KEYS:
            keys[NEMO_TRANSFORMER_KEYS[flag]] = True if value is None else _number_or_text(value)
        elif flag == "--use-rope-scaling":
            notes.append("rope_scaling: Llama 3.1 RoPE scaling is set by NeMo's Llama 3.1 model class, not by a "
                         "megatron_gpt key")
        elif flag == "--quick-geglu":
            notes.append("gated_activation: the quick-GELU gate of gpt-oss (activation_func quick_gelu) is set by "
                         "NeMo's gpt-oss model class; this config carries its offset and clamp")
    return keys, notes


def _number_or_text(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
