"""Mixture-of-experts keys of Hugging Face ``config.json`` files (split from :mod:`.hf_config`).

:func:`moe_fields` adds the MoE (and MLA / sliding-window) fields of one family to the fields the Llama-like base
parser of :mod:`costmodel.core.specs.hf_config` read. Defaults for absent keys are those of the matching
``transformers`` configuration class (``MixtralConfig``, ``Qwen2MoeConfig``, ``Qwen3MoeConfig``,
``DeepseekV2Config``, ``DeepseekV3Config``, ``GptOssConfig``) unless a comment names another source. Routing
hyperparameters that change no GEMM shape (aux-loss coefficients, top-k renormalisation, routed scaling, group-
limited routing) are kept in ``ModelSpec.extra``.
"""

from __future__ import annotations

from typing import Any

from costmodel.core.errors import PlannerError

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
"""model_types whose MoE keys :func:`moe_fields` reads."""

ROUTING_EXTRA_KEYS = ("norm_topk_prob", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "routed_scaling_factor",
                      "topk_method", "n_group", "topk_group", "router_jitter_noise", "ep_size", "swiglu_limit",
                      "initial_context_length", "use_qk_norm")
"""Keys read and kept in ``extra`` only: routing and numerics details that do not change a GEMM's shape (``ep_size``
is the inference-time expert split of DeepSeek's remote code; ``initial_context_length`` gpt-oss's pre-training
context)."""

CAPACITY_FACTOR_KEYS = ("capacity_factor", "moe_expert_capacity_factor")
"""Expert capacity factor under the names it has: the generic one, and Megatron-Core's
``--moe-expert-capacity-factor`` (none of the supported families' published configs sets one: they are dropless)."""


def _reader_list(r: Any, key: str) -> list:
    r.seen.add(r.prefix + key)
    value = r.data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlannerError(f"{r.where} field {key!r} is {value!r} but must be a list; fix that value in the config.")
    return value


def _mlp_only_layers(r: Any, fields: dict, freq: int) -> None:
    """Qwen-MoE ``mlp_only_layers`` (layers with a dense MLP): a leading block 0..k-1 with every other layer MoE
    maps onto ``first_dense_layers`` = k; any other pattern is refused (ModelSpec has no per-layer list)."""
    layers = _reader_list(r, "mlp_only_layers")
    if not layers:
        return
    if any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
        raise PlannerError(f"{r.where} field 'mlp_only_layers' must list layer numbers, not {layers!r}; fix the "
                           "config.")
    if freq != 1 or sorted(set(layers)) != list(range(len(set(layers)))):
        raise PlannerError(f"{r.where} has mlp_only_layers={layers} (with decoder_sparse_step={freq}), a dense/MoE "
                           "layer pattern planner cannot model (only leading dense layers 0..k-1 with every other "
                           "layer MoE); set mlp_only_layers to [] or to [0, ..., k-1].")
    fields["first_dense_layers"] = len(set(layers))


def _capacity(r: Any, fields: dict) -> None:
    if r.has(*CAPACITY_FACTOR_KEYS):
        fields["capacity_factor"] = r.float_(*CAPACITY_FACTOR_KEYS)


def _routing_extra(r: Any, extra: dict) -> None:
    for key in ROUTING_EXTRA_KEYS:
        r.seen.add(r.prefix + key)
        if r.data.get(key) is not None:
            extra[key] = r.data[key]


def _qwen_moe(r: Any, model_type: str, fields: dict, extra: dict) -> None:
    """Qwen2-MoE / Qwen3-MoE (``Qwen2MoeSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``): softmax top-k router over
    ``num_experts`` experts of width ``moe_intermediate_size``; layer i is MoE when (i + 1) % decoder_sparse_step == 0
    and i is not in mlp_only_layers. Qwen2-MoE adds one shared expert of its own width
    ``shared_expert_intermediate_size`` behind a sigmoid gate (an h x 1 linear, kept in ``extra``)."""
    fields["num_experts"] = r.int_("num_experts")
    fields["experts_per_token"] = r.int_("num_experts_per_tok")
    fields["moe_ffn_hidden_size"] = r.int_("moe_intermediate_size")
    freq = r.int_("decoder_sparse_step", default=1)
    if freq > fields["num_layers"]:
        raise PlannerError(f"{r.where} has decoder_sparse_step={freq} > num_hidden_layers={fields['num_layers']}, "
                           "so no layer is MoE; use the dense model_type or a step <= the layer count.")
    fields["moe_layer_freq"] = freq
    if not r.bool_("use_sliding_window", default=False):
        # sliding_window / max_window_layers act only with use_sliding_window (Qwen2MoeAttention): not warned about
        r.seen.update(r.prefix + k for k in ("sliding_window", "max_window_layers"))
    _mlp_only_layers(r, fields, freq)
    if model_type == "qwen2_moe":
        shared = r.data.get("shared_expert_intermediate_size")
        r.seen.add(r.prefix + "shared_expert_intermediate_size")
        if shared not in (None, 0):
            fields["num_shared_experts"] = 1
            fields["shared_expert_ffn_hidden_size"] = r.int_("shared_expert_intermediate_size")
            extra["shared_expert_gate"] = True
    else:
        extra["qk_norm"] = True  # Qwen3MoeAttention: RMSNorm over each head's q and k (2 * head_dim weights)


def _deepseek(r: Any, model_type: str, fields: dict, extra: dict) -> None:
    """DeepSeek-V2 / V3 (DeepSeek-V2 arXiv 2405.04434 sec. 2; DeepSeek-V3 arXiv 2412.19437 sec. 2): MLA attention and
    DeepSeekMoE with shared experts; the first ``first_k_dense_replace`` layers are dense."""
    heads = fields["num_heads"]
    fields["num_kv_heads"] = heads  # MLA: every head has its own K and V (up-projected from the shared latent)
    fields["num_experts"] = r.int_("n_routed_experts")
    fields["experts_per_token"] = r.int_("num_experts_per_tok")
    fields["moe_ffn_hidden_size"] = r.int_("moe_intermediate_size")
    r.seen.add(r.prefix + "n_shared_experts")
    shared = r.data.get("n_shared_experts")
    fields["num_shared_experts"] = 0 if shared in (None, 0) else r.int_("n_shared_experts")
    r.seen.add(r.prefix + "first_k_dense_replace")
    first = r.data.get("first_k_dense_replace")
    fields["first_dense_layers"] = 0 if first in (None, 0) else r.int_("first_k_dense_replace")
    freq = r.int_("moe_layer_freq", default=1)
    if freq != 1:
        # modeling_deepseek: MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0; ModelSpec counts the
        # period from the first MoE layer, so the two agree only for a period of 1 (every released DeepSeek config)
        raise PlannerError(f"{r.where} has moe_layer_freq={freq}; planner models DeepSeek configs with an MoE block "
                           "in every layer after first_k_dense_replace (moe_layer_freq = 1, as released).")
    # DeepseekV2Config defaults scoring_func to softmax; DeepSeek-V3 routes with sigmoid affinities (arXiv 2412.19437
    # eq. 15) and transformers' DeepseekV3Config has no key for it
    router = r.str_("scoring_func", default="sigmoid" if model_type == "deepseek_v3" else "softmax")
    if router not in ("softmax", "sigmoid"):
        raise PlannerError(f"{r.where} field 'scoring_func' is {router!r}; planner models softmax and sigmoid routers.")
    fields["router"] = router
    r.seen.add(r.prefix + "q_lora_rank")
    q_rank = r.data.get("q_lora_rank")  # null in DeepSeek-V2-Lite: queries projected directly
    fields["q_lora_rank"] = 0 if q_rank in (None, 0) else r.int_("q_lora_rank")
    fields["kv_lora_rank"] = r.int_("kv_lora_rank")
    rope = r.int_("qk_rope_head_dim")
    fields["qk_rope_head_dim"] = rope
    fields["head_dim"] = r.int_("qk_nope_head_dim") + rope
    fields["v_head_dim"] = r.int_("v_head_dim")
    # multi-token prediction depths (DeepseekV3Config: num_nextn_predict_layers, 1 in the released config)
    fields["mtp_layers"] = r.int_("num_nextn_predict_layers", default=0)


def _layer_pattern(r: Any) -> int:
    """gpt-oss ``layer_types`` -> ``sliding_window_every``: 2 when strictly alternating from a sliding layer (as
    released), 1 all sliding, 0 all full. Absent: GptOssConfig's default, sliding on even layers (i + 1) % 2."""
    types = _reader_list(r, "layer_types")
    if not types:
        return 2
    if all(t == "full_attention" for t in types):
        return 0
    if all(t == "sliding_attention" for t in types):
        return 1
    if all(t == ("sliding_attention" if i % 2 == 0 else "full_attention") for i, t in enumerate(types)):
        return 2
    raise PlannerError(f"{r.where} has a layer_types pattern planner cannot model (it models all full, all sliding, "
                       "or sliding/full alternating from layer 0); fix layer_types.")


def _gpt_oss(r: Any, model_type: str, fields: dict, extra: dict) -> None:
    """gpt-oss (OpenAI gpt-oss model card, arXiv 2508.10925 sec. 2; transformers ``GptOssConfig``): top-k softmax
    router over ``num_local_experts`` experts of width ``intermediate_size``, biases on every linear, learned attention
    sinks, banded (sliding-window) attention on alternate layers."""
    fields["num_experts"] = r.int_("num_local_experts", "num_experts")
    fields["experts_per_token"] = r.int_("num_experts_per_tok", "experts_per_token")
    r.seen.add(r.prefix + "experts_per_token")
    fields["moe_ffn_hidden_size"] = fields["ffn_hidden_size"]
    fields["linear_bias"] = True  # GptOssExperts: gate_up_proj_bias and down_proj_bias; attention_bias true
    extra.pop("attention_bias", None), extra.pop("mlp_bias", None)  # no mlp_bias key: the experts' biases are fixed
    fields["attention_sinks"] = True
    fields["sliding_window"] = r.int_("sliding_window", default=128)  # GptOssConfig default
    fields["sliding_window_every"] = _layer_pattern(r)
    # gpt-oss's SwiGLU clamps gate and linear parts (swiglu_limit) and uses gate * sigmoid(1.702 * gate) * (up + 1):
    # the GEMM shapes are SwiGLU's, so planner costs it as swiglu
    extra["gated_activation"] = "gpt_oss_clamped_swiglu"


_FAMILIES = {"qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
             "gpt_oss": _gpt_oss}


def moe_fields(r: Any, model_type: str, fields: dict, extra: dict) -> None:
    """Add the MoE / MLA / sliding-window fields of ``model_type`` to ``fields`` (``r`` is hf_config's reader)."""
    if model_type == "mixtral":
        # MixtralSparseMoeBlock: every layer MoE, experts of width intermediate_size, softmax top-k router
        fields["num_experts"] = r.int_("num_local_experts")
        fields["experts_per_token"] = r.int_("num_experts_per_tok")
        fields["moe_ffn_hidden_size"] = fields["ffn_hidden_size"]
    else:
        _FAMILIES[model_type](r, model_type, fields, extra)
    _capacity(r, fields)
    _routing_extra(r, extra)
