"""Build a :class:`ModelSpec` from a Hugging Face ``config.json``.

Each supported ``model_type`` has a small parser below that maps that family's key names onto the
ModelSpec fields (the MoE families' expert, MLA and sliding-window keys: :mod:`.hf_moe`). Defaults used when a
key is absent are the defaults of the matching ``transformers`` configuration class (``LlamaConfig``,
``GPT2Config``, ``MptConfig`` ...) unless a comment names another source. Keys that are parsed but have no
ModelSpec field (rotary fraction, Mistral's sliding window, rope scaling, MoE routing details, ...) are kept in
``ModelSpec.extra``; unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hf_moe import MOE_MODEL_TYPES, moe_fields
from costmodel.core.specs.model import ModelSpec

_MISSING = object()


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None for bools, non-numbers, NaN, +-inf and ints beyond float range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class _Reader:
    """Typed access to one config dict; every error names the file (``where``) and the field."""

    def __init__(self, data: dict, where: str, prefix: str = "", seen: set | None = None) -> None:
        self.data = data
        self.where = where
        self.prefix = prefix
        self.seen: set = set() if seen is None else seen
        """Keys (with prefix) a parser looked at: the rest were not read (see :func:`unread_keys`)."""

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        self.seen.update(self.prefix + k for k in keys)
        for key in keys:
            value = self.data.get(key)
            if value is not None:
                return key, value
        return keys[0], _MISSING

    def _missing(self, keys: tuple[str, ...]) -> PlannerError:
        alts = " or ".join(repr(self.prefix + k) for k in keys)
        return PlannerError(f"{self.where} lacks the required field {alts}; add it with the value from "
                            "the model's published config.json.")

    def _bad(self, key: str, value: Any, expected: str) -> PlannerError:
        return PlannerError(f"{self.where} field {self.prefix + key!r} is {value!r} but must be {expected}; "
                            "fix that value in the config.")

    def has(self, *keys: str) -> bool:
        return self._find(keys)[1] is not _MISSING

    def int_(self, *keys: str, default: Any = _MISSING) -> int:
        """A positive integer (bools, strings, floats and values <= 0 are refused)."""
        key, value = self._find(keys)
        if value is _MISSING:
            if default is _MISSING:
                raise self._missing(keys)
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._bad(key, value, "a positive integer")
        if value >= 2**53:  # beyond exact float range (IEEE 754 double): the engine computes in floats
            raise self._bad(key, value, "a positive integer below 2**53")
        return value

    def float_(self, *keys: str, default: Any = _MISSING, positive: bool = False) -> float:
        """A number (int or float, not bool); non-negative, or > 0 when ``positive``."""
        key, value = self._find(keys)
        if value is _MISSING:
            if default is _MISSING:
                raise self._missing(keys)
            return default
        number = _finite_float(value)
        if number is None or number < 0 or (positive and number == 0):
            raise self._bad(key, value, "a positive number" if positive else "a non-negative number")
        return number

    def bool_(self, *keys: str, default: bool) -> bool:
        key, value = self._find(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def str_(self, *keys: str, default: Any = _MISSING) -> str:
        key, value = self._find(keys)
        if value is _MISSING:
            if default is _MISSING:
                raise self._missing(keys)
            return default
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def sub(self, key: str) -> "_Reader":
        """A nested object such as MPT's ``attn_config`` (absent -> empty)."""
        self.seen.add(self.prefix + key)
        value = self.data.get(key)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self._bad(key, value, "a JSON object")
        return _Reader(value, self.where, prefix=f"{self.prefix}{key}.", seen=self.seen)

    def dropout(self, *keys: str, default: float = 0.0) -> bool:
        """True when any of the dropout probabilities is > 0."""
        values = [self.float_(k, default=default) for k in keys]  # every key read (and checked)
        return any(v > 0 for v in values)


# ----------------------------------------------------------------- shared mappings
_GELU_NAMES = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate", "quick_gelu",
               "gelu_python")
_SQUARED_RELU_NAMES = ("relu2", "squared_relu", "relu_squared")


def _activation(r: _Reader, name: str, key: str, gated: bool, extra: dict) -> str:
    """Map an HF activation name to a ModelSpec activation.

    Gated MLPs (Llama family, gate_proj * act(up_proj)) all become ``swiglu``: with SiLU that is
    exactly SwiGLU; with another gate function the weight and GEMM shapes are the same, so it is the
    closest ModelSpec choice and the real name is kept in ``extra['gated_activation']``.
    """
    extra["hidden_act"] = name
    low = name.lower()
    if gated:
        if low not in ("silu", "swish"):
            extra["gated_activation"] = name
        return "swiglu"
    if low in _SQUARED_RELU_NAMES:
        return "squared_relu"
    if low in _GELU_NAMES:
        return "gelu"
    if low == "relu":
        return "relu"
    raise PlannerError(f"{r.where} field {key!r} is {name!r}, an activation planner cannot model; use one of "
                       f"silu (gated), {', '.join(_GELU_NAMES[:3])}, relu, relu2.")


def _rope_theta(r: _Reader, extra: dict) -> float | None:
    """RoPE base from ``rope_theta`` (transformers < 5), ``rope_parameters.rope_theta`` (transformers 5),
    ``rope_scaling.rope_theta`` (configs saved during the rename) or GPT-NeoX's ``rotary_emb_base``."""
    theta = None
    if r.has("rope_theta"):
        theta = r.float_("rope_theta", positive=True)
    for container in ("rope_parameters", "rope_scaling"):
        sub = r.sub(container)
        if sub.data:
            rest = {k: v for k, v in sub.data.items() if k != "rope_theta"}
            if rest and not (set(rest) == {"rope_type"} and rest["rope_type"] == "default"):
                extra[container] = rest
            if theta is None and sub.has("rope_theta"):
                theta = sub.float_("rope_theta", positive=True)
    if theta is None and r.has("rotary_emb_base"):
        theta = r.float_("rotary_emb_base", positive=True)
    return theta


# ------------------------------------------------------------------ family parsers
# Each returns (ModelSpec keyword arguments, extra).

def _llama_like(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """llama, mistral, qwen2, qwen3 (dense, with QK-norm): gated SiLU MLP, RMSNorm, RoPE, GQA; and on the same
    base the MoE families of
    :mod:`.hf_moe` (mixtral, qwen2_moe, qwen3_moe, deepseek_v2/v3 with MLA, gpt_oss)."""
    extra: dict = {}
    heads = r.int_("num_attention_heads")
    fields = dict(
        num_layers=r.int_("num_hidden_layers"),
        hidden_size=r.int_("hidden_size"),
        num_heads=heads,
        num_kv_heads=r.int_("num_key_value_heads", default=heads),
        head_dim=r.int_("head_dim", default=0),
        ffn_hidden_size=r.int_("intermediate_size"),
        vocab_size=r.int_("vocab_size"),
        norm="rmsnorm",
        position_embedding="rope",
        max_seq_len=r.int_("max_position_embeddings"),
        tied_embeddings=r.bool_("tie_word_embeddings", default=False),
        dropout=r.dropout("attention_dropout"),
    )
    fields["activation"] = _activation(r, r.str_("hidden_act", default="silu"), "hidden_act", True, extra)
    if model_type in ("qwen2", "qwen2_moe"):
        # Qwen2 (and Qwen2-MoE) has a bias on the Q/K/V projections only (Qwen2Attention, bias=True); the output and
        # MLP projections have none. The closest ModelSpec choice is no bias (the QKV bias is
        # (a + 2 a_kv) d_head values per layer, < 0.01 % of the weights).
        fields["linear_bias"] = False
        extra["qkv_bias"] = True
    else:
        attn_bias = r.bool_("attention_bias", default=False)
        mlp_bias = r.bool_("mlp_bias", default=False)
        fields["linear_bias"] = attn_bias or mlp_bias
        if attn_bias != mlp_bias:
            extra.update(attention_bias=attn_bias, mlp_bias=mlp_bias)
    if model_type == "qwen3":
        extra["qk_norm"] = True  # Qwen3Attention: RMSNorm over each head's q and k (q_norm, k_norm)
    if model_type in MOE_MODEL_TYPES:
        moe_fields(r, model_type, fields, extra)
    for key in ("sliding_window", "rms_norm_eps", "use_sliding_window", "max_window_layers"):
        if r.data.get(key) is not None:
            extra[key] = r.data[key]
    if model_type == "qwen3" and r.data.get("use_sliding_window") is False:
        # sliding_window / max_window_layers act only with use_sliding_window (Qwen3Attention): not warned about
        r.seen.update(r.prefix + k for k in ("sliding_window", "max_window_layers"))
    return fields, extra


def _nemotron(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """Nemotron / Minitron: squared-ReLU MLP (no gate), LayerNorm1P, partial RoPE, GQA."""
    extra: dict = {}
    heads = r.int_("num_attention_heads")
    fields = dict(
        num_layers=r.int_("num_hidden_layers"),
        hidden_size=r.int_("hidden_size"),
        num_heads=heads,
        num_kv_heads=r.int_("num_key_value_heads", default=heads),
        # Older Minitron uploads call the per-head width kv_channels (Megatron's name).
        head_dim=r.int_("head_dim", "kv_channels", default=0),
        ffn_hidden_size=r.int_("intermediate_size"),
        vocab_size=r.int_("vocab_size"),
        # NemotronLayerNorm1P is a LayerNorm with weight and bias (weight stored as w - 1).
        norm="layernorm",
        position_embedding="rope",
        max_seq_len=r.int_("max_position_embeddings"),
        tied_embeddings=r.bool_("tie_word_embeddings", default=False),
        linear_bias=r.bool_("attention_bias", default=False) or r.bool_("mlp_bias", default=False),
        dropout=r.dropout("attention_dropout"),
    )
    fields["activation"] = _activation(r, r.str_("hidden_act", default="relu2"), "hidden_act", False, extra)
    extra["partial_rotary_factor"] = r.float_("partial_rotary_factor", "rope_percent", default=0.5)
    return fields, extra


def _gpt_neox(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """GPT-NeoX / Pythia: GELU MLP with bias, LayerNorm, partial RoPE, parallel residual."""
    extra: dict = {}
    fields = dict(
        num_layers=r.int_("num_hidden_layers"),
        hidden_size=r.int_("hidden_size"),
        num_heads=r.int_("num_attention_heads"),
        ffn_hidden_size=r.int_("intermediate_size"),
        vocab_size=r.int_("vocab_size"),
        norm="layernorm",
        position_embedding="rope",
        max_seq_len=r.int_("max_position_embeddings"),
        tied_embeddings=r.bool_("tie_word_embeddings", default=False),
        # The MLP linears always carry a bias; attention_bias (default True) covers QKV/dense.
        linear_bias=True,
        dropout=r.dropout("attention_dropout", "hidden_dropout", "attention_probs_dropout_prob",
                          "hidden_dropout_prob"),
    )
    fields["num_kv_heads"] = fields["num_heads"]
    fields["activation"] = _activation(r, r.str_("hidden_act", default="gelu"), "hidden_act", False, extra)
    extra["rotary_pct"] = r.float_("rotary_pct", "partial_rotary_factor", default=0.25)
    extra["use_parallel_residual"] = r.bool_("use_parallel_residual", default=True)
    return fields, extra


def _gpt2(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """GPT-2: GELU MLP with bias, LayerNorm, learned positions, tied LM head."""
    extra: dict = {}
    hidden = r.int_("n_embd", "hidden_size")
    fields = dict(
        num_layers=r.int_("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        num_heads=r.int_("n_head", "num_attention_heads"),
        ffn_hidden_size=r.int_("n_inner", default=4 * hidden),  # GPT2MLP: n_inner or 4 * n_embd
        vocab_size=r.int_("vocab_size"),
        norm="layernorm",
        position_embedding="learned",
        max_seq_len=r.int_("n_positions", "n_ctx", default=1024),  # GPT2Config default n_positions
        tied_embeddings=r.bool_("tie_word_embeddings", default=True),
        linear_bias=True,
        # GPT2Config defaults resid/embd/attn_pdrop to 0.1.
        dropout=r.dropout("resid_pdrop", "embd_pdrop", "attn_pdrop", default=0.1),
    )
    fields["num_kv_heads"] = fields["num_heads"]
    fields["activation"] = _activation(r, r.str_("activation_function", default="gelu_new"),
                                       "activation_function", False, extra)
    return fields, extra


def _bloom(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """BLOOM: GELU MLP (4h, fixed in BloomMLP) with bias, LayerNorm, ALiBi, tied LM head."""
    extra: dict = {"embedding_layernorm": True}
    hidden = r.int_("hidden_size", "n_embed")
    fields = dict(
        num_layers=r.int_("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        num_heads=r.int_("n_head", "num_attention_heads"),
        ffn_hidden_size=4 * hidden,  # BloomMLP: dense_h_to_4h, no config key
        vocab_size=r.int_("vocab_size"),
        activation="gelu",  # bloom_gelu_forward (tanh GELU), not configurable
        norm="layernorm",
        position_embedding="alibi",
        # BLOOM configs carry no context length; 2048 is the training sequence length of
        # Le Scao et al. 2022 (BLOOM, arXiv 2211.05100).
        max_seq_len=r.int_("seq_length", default=2048),
        tied_embeddings=r.bool_("tie_word_embeddings", default=True),
        linear_bias=True,
        dropout=r.dropout("attention_dropout", "hidden_dropout"),
    )
    fields["num_kv_heads"] = fields["num_heads"]
    return fields, extra


def _mpt(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """MPT: GELU MLP (expansion_ratio * d_model), LayerNorm, ALiBi or learned positions, no bias."""
    extra: dict = {}
    attn = r.sub("attn_config")
    ffn_cfg = r.sub("ffn_config")
    d_model = r.int_("d_model")
    heads = r.int_("n_heads")
    ratio = r.float_("expansion_ratio", default=4.0, positive=True)  # MptConfig default 4
    ffn = ratio * d_model
    if not ffn.is_integer():
        raise PlannerError(f"{r.where} gives expansion_ratio={ratio} for d_model={d_model}, which is not a "
                           "whole MLP width; fix expansion_ratio or set ffn_config.ffn_hidden_size.")
    attn_type = attn.str_("attn_type", default="multihead_attention")
    if attn_type == "multiquery_attention":
        kv_heads = 1
    elif attn_type == "grouped_query_attention":
        kv_heads = attn.int_("kv_n_heads")
    else:
        kv_heads = heads
    if attn.bool_("alibi", default=False):
        position = "alibi"
    elif r.bool_("learned_pos_emb", default=True):
        position = "learned"
    else:
        position = "none"
    gated = ffn_cfg.str_("ffn_type", default="mptmlp") == "mptglu"
    act_name = ffn_cfg.sub("ffn_act_fn").str_("name", default="gelu")
    norm_type = r.str_("norm_type", default="low_precision_layernorm")
    fields = dict(
        num_layers=r.int_("n_layers"),
        hidden_size=d_model,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=ffn_cfg.int_("ffn_hidden_size", default=int(ffn)),
        vocab_size=r.int_("vocab_size"),
        norm="rmsnorm" if "rmsnorm" in norm_type else "layernorm",
        position_embedding=position,
        max_seq_len=r.int_("max_seq_len", default=2048),  # MptConfig default max_seq_len
        # MPT always uses the token embedding as LM head (MptForCausalLM ties them).
        tied_embeddings=r.bool_("tie_word_embeddings", default=True),
        linear_bias=not r.bool_("no_bias", default=True),  # MptConfig default no_bias=True
        dropout=r.dropout("resid_pdrop", "emb_pdrop") or attn.dropout("attn_pdrop"),
    )
    fields["activation"] = _activation(r, act_name, "ffn_config.ffn_act_fn.name", gated, extra)
    extra["norm_type"] = norm_type
    if attn.data.get("clip_qkv") is not None:
        extra["clip_qkv"] = attn.data["clip_qkv"]
    return fields, extra


def _softcap(r: _Reader, key: str, default: float) -> float:
    """A soft-capping value: Gemma2Config's default when the key is absent, 0 (none) when it is null."""
    r.seen.add(r.prefix + key)
    if key in r.data and r.data[key] is None:
        return 0.0
    return r.float_(key, default=default)


def _gemma2(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """Gemma 2 (Gemma Team 2024, arXiv 2408.00118 sec. 2; transformers ``Gemma2Config``): GeGLU MLP (tanh GELU
    gate), RMSNorm before and after each sub-layer (4 per block), RoPE, GQA, head_dim independent of the width,
    sliding-window attention (4096) on every other layer from layer 0 (``is_sliding = not layer_idx % 2``), attention
    and final logit soft-capping, tied embeddings scaled by sqrt(hidden)."""
    extra: dict = {"scale_embeddings": True}
    heads = r.int_("num_attention_heads")
    fields = dict(
        num_layers=r.int_("num_hidden_layers"),
        hidden_size=r.int_("hidden_size"),
        num_heads=heads,
        num_kv_heads=r.int_("num_key_value_heads", default=heads),
        head_dim=r.int_("head_dim", default=256),  # Gemma2Config default
        ffn_hidden_size=r.int_("intermediate_size"),
        vocab_size=r.int_("vocab_size"),
        norm="rmsnorm",
        position_embedding="rope",
        max_seq_len=r.int_("max_position_embeddings", default=8192),
        tied_embeddings=r.bool_("tie_word_embeddings", default=True),
        linear_bias=r.bool_("attention_bias", default=False),
        dropout=r.dropout("attention_dropout"),
        norms_per_layer=4,
        attn_logit_softcap=_softcap(r, "attn_logit_softcapping", 50.0),
        final_logit_softcap=_softcap(r, "final_logit_softcapping", 30.0),
        sliding_window=r.int_("sliding_window", "sliding_window_size", default=4096),
        sliding_window_every=2,
    )
    r.seen.add(r.prefix + "sliding_window_size")  # the older name of sliding_window, the same value
    name = r.str_("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    fields["activation"] = _activation(r, name, "hidden_activation", True, extra)
    extra["query_pre_attn_scalar"] = r.float_("query_pre_attn_scalar", default=256.0, positive=True)
    return fields, extra


def _falcon(r: _Reader, model_type: str) -> tuple[dict, dict]:
    """Falcon (transformers ``FalconConfig``, ``FalconAttention`` / ``FalconDecoderLayer``; n_layer / n_head /
    n_head_kv are the names of its first uploads): GELU MLP of ffn_hidden_size (default 4h), LayerNorm, RoPE (or ALiBi),
    no bias, tied LM head. KV heads: num_kv_heads with new_decoder_architecture (Falcon-40B), else 1 with multi_query
    (Falcon-7B), else every head. Parallel attention + MLP (parallel_attn) reading one input norm, or two with
    new_decoder_architecture (ln_attn, ln_mlp; num_ln_in_parallel_attn)."""
    extra: dict = {}
    heads = r.int_("num_attention_heads", "n_head")
    hidden = r.int_("hidden_size")
    new_arch = r.bool_("new_decoder_architecture", default=False)
    kv_cfg = r.int_("num_kv_heads", "n_head_kv", default=heads)
    multi_query = r.bool_("multi_query", default=True)  # FalconAttention ignores it with new_decoder_architecture
    kv = kv_cfg if new_arch else (1 if multi_query else heads)
    parallel = r.bool_("parallel_attn", default=True)
    norms = r.int_("num_ln_in_parallel_attn", default=2 if new_arch else 1) if parallel else 2
    fields = dict(
        num_layers=r.int_("num_hidden_layers", "n_layer"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=r.int_("ffn_hidden_size", default=4 * hidden),
        vocab_size=r.int_("vocab_size"),
        norm="layernorm",
        position_embedding="alibi" if r.bool_("alibi", default=False) else "rope",
        max_seq_len=r.int_("max_position_embeddings", default=2048),  # FalconConfig default
        tied_embeddings=r.bool_("tie_word_embeddings", default=True),
        linear_bias=r.bool_("bias", default=False),
        dropout=r.dropout("attention_dropout", "hidden_dropout"),
        parallel_attention=parallel,
        norms_per_layer=norms,
    )
    fields["activation"] = _activation(r, r.str_("activation", default="gelu"), "activation", False, extra)
    return fields, extra


_PARSERS: dict[str, Callable[[_Reader, str], tuple[dict, dict]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "gemma2": _gemma2,
    "falcon": _falcon,
    "mixtral": _llama_like,
    "qwen2_moe": _llama_like,
    "qwen3_moe": _llama_like,
    "deepseek_v2": _llama_like,
    "deepseek_v3": _llama_like,
    "gpt_oss": _llama_like,
    "nemotron": _nemotron,
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
    "bloom": _bloom,
    "mpt": _mpt,
}
SUPPORTED_MODEL_TYPES = tuple(_PARSERS)


# -------------------------------------------------------------------- entry point
DEFAULT_ROPE_THETA = {"gemma2": 10000.0, "falcon": 10000.0}
"""RoPE base of the config classes that default it (Gemma2Config rope_theta=10000.0, FalconConfig rope_theta=10000.0)
when a config.json states none."""

NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "layernorm_epsilon")
"""config.json names of the norm epsilon (Llama/Mistral/Qwen2, GPT-NeoX, GPT-2/BLOOM, Nemotron, NeMo-style)."""

IRRELEVANT_KEYS = frozenset({
    # bookkeeping and tokenizer / generation settings of transformers' PretrainedConfig: they do not
    # change the network a training step runs
    "architectures", "auto_map", "transformers_version", "torch_dtype", "use_cache", "use_bfloat16",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "forced_bos_token_id", "forced_eos_token_id", "tokenizer_class", "id2label", "label2id", "problem_type",
    "finetuning_task", "task_specific_params", "prefix", "return_dict", "use_return_dict", "output_attentions",
    "output_hidden_states", "output_scores", "return_dict_in_generate", "torchscript", "pruned_heads",
    "chunk_size_feed_forward", "tf_legacy_loss", "bad_words_ids", "begin_suppress_tokens", "suppress_tokens",
    "diversity_penalty", "do_sample", "early_stopping", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_return_sequences", "repetition_penalty",
    "temperature", "top_k", "top_p", "typical_p", "remove_invalid_values", "exponential_decay_length_penalty",
    "encoder_no_repeat_ngram_size", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "cross_attention_hidden_size", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout",
    # initialisation and numerics: same kernels, same time
    "initializer_range", "init_std", "initializer_factor", "layer_norm_eps", "layer_norm_epsilon",
    "rms_norm_eps", "norm_eps", "layernorm_epsilon", "pretraining_tp", "scale_attn_weights",
    "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "use_sliding_window", "logit_scale",
    "attention_softmax_in_fp32", "slow_but_exact", "offset_alibi", "embedding_fraction",
    "apply_residual_connection_post_layernorm", "unk_token_id", "tokenizer_name", "verbose", "init_device",
    "init_config", "output_router_logits",
    # inference-time cache layout (Gemma 2's hybrid sliding/global KV cache)
    "cache_implementation",
    # kernel-fusion hints of the code base the model was trained with (planner costs its own kernels)
    "bias_dropout_fusion", "masked_softmax_fusion", "skip_bias_add", "skip_bias_add_qkv",
})
"""config.json keys that do not affect a training step's time or memory: ignored without a warning.
Any other key no parser reads is ignored with a warning naming it (:func:`unread_keys`)."""


def unread_keys(data: dict, seen: set) -> list[str]:
    """Top-level keys of ``data`` that no parser read and that are not known to be irrelevant."""
    return sorted(k for k, v in data.items() if isinstance(k, str) and k not in seen and k not in IRRELEVANT_KEYS
                  and not k.startswith("_") and v is not None)


def load_json(path: Path) -> dict:
    """Read a config.json (a folder means its config.json); errors name the path and JSON position."""
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PlannerError(f"model config file {path} does not exist; give a preset name (see `planner models`) "
                           "or the path of a Hugging Face config.json.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"cannot read model config {path} ({exc}); check the file.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlannerError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "fix the file or download the config.json again.") from None
    except RecursionError:
        raise PlannerError(f"{path} is nested too deeply to be a config.json; fix the file or download the "
                           "config.json again.") from None
    if not isinstance(data, dict):
        raise PlannerError(f"{path} holds a JSON {type(data).__name__}, not an object; "
                           "give a Hugging Face config.json.")
    return data


def from_hf_config(cfg: dict | str | Path, name: str | None = None) -> ModelSpec:
    """Parse a Hugging Face ``config.json`` (path, folder holding one, or the parsed dict)."""
    if isinstance(cfg, dict):
        data, where = cfg, "inline config.json dict"
        default_name = str(cfg.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    elif isinstance(cfg, (str, Path)):
        path = Path(cfg).expanduser()
        data, where = load_json(path), str(path)
        default_name = path.name if path.is_dir() else (path.parent.name if path.name == "config.json" else path.stem)
    else:
        raise PlannerError(f"model config must be a dict, a path or a preset name, not {type(cfg).__name__}; "
                           "pass the path of a config.json.")
    r = _Reader(data, where)
    model_type = r.str_("model_type")
    parser = _PARSERS.get(model_type)
    if parser is None:
        raise PlannerError(f"{where} has model_type {model_type!r}, which planner cannot read; supported types "
                           f"are {', '.join(SUPPORTED_MODEL_TYPES)}.")
    fields, extra = parser(r, model_type)
    extra["model_type"] = model_type
    # norm epsilon under any family's name, for launcher exports (planner.export_arch)
    key = next((k for k in NORM_EPS_KEYS if isinstance(data.get(k), (int, float))
                and not isinstance(data.get(k), bool)), None)
    if key is not None:
        try:
            eps = float(data[key])
        except OverflowError:
            eps = math.inf
        if not 0.0 < eps < 1.0:
            raise PlannerError(f"{where}: {key}={data[key]!r} must be a small positive number (e.g. 1e-5); fix "
                               "the config.json.")
        extra["norm_eps"] = eps
    rope_theta = _rope_theta(r, extra) if fields["position_embedding"] == "rope" else None
    if rope_theta is None and fields["position_embedding"] == "rope":
        rope_theta = DEFAULT_ROPE_THETA.get(model_type)
    unread = unread_keys(data, r.seen)
    if unread:
        extra["unread_keys"] = unread
    return ModelSpec(name=name or default_name or model_type, rope_theta=rope_theta, source=where,
                     extra=extra, **fields)
