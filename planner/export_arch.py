"""The architecture fields a launcher needs, read once from a ModelSpec and the config.json fields kept in its
``extra`` (norm epsilon, QKV-only bias, sliding window, partial rotary), and torchtitan's Llama 3 flavors.

``planner.export`` writes these into every target; ``tests/test_export_fields.py`` checks that none is dropped.
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
    rotary_percent: float | None
    """Fraction of each head's channels that RoPE rotates, when not all (GPT-NeoX: 0.25)."""
    notes: tuple[str, ...]
    """What no launcher flag expresses exactly (written into every export as a comment)."""


_EPS_KEYS = ("norm_eps", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")
_ROTARY_KEYS = ("rotary_pct", "partial_rotary_factor")


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def architecture(model: ModelSpec) -> Architecture:
    """The launcher-relevant fields of ``model`` (see :class:`Architecture`)."""
    ex = model.extra if isinstance(model.extra, dict) else {}
    notes: list[str] = []
    eps = next((e for e in (_number(ex.get(k)) for k in _EPS_KEYS) if e is not None), None)
    attn_bias, mlp_bias = ex.get("attention_bias"), ex.get("mlp_bias")
    qkv_bias = not model.linear_bias and ex.get("qkv_bias") is True
    if attn_bias is True and mlp_bias is False:
        # Llama-style attention_bias: Q, K, V and the output projection carry a bias, the MLP none
        qkv_bias = True
        notes.append("the attention output projection also carries a bias, which --add-qkv-bias / qkv_bias "
                     "does not add")
    elif attn_bias is False and mlp_bias is True:
        notes.append("only the MLP carries a bias; the export enables bias on every linear layer")
    window = ex.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0 or ex.get("use_sliding_window") is False:
        window = None
    elif isinstance(ex.get("max_window_layers"), int) and ex["max_window_layers"] > 0:
        notes.append(f"sliding-window attention applies only from layer {ex['max_window_layers']} on "
                     "(max_window_layers); the export applies it to every layer")
    rotary = next((r for r in (_number(ex.get(k)) for k in _ROTARY_KEYS) if r is not None), None)
    if model.position_embedding != "rope" or rotary == 1.0:
        rotary = None
    return Architecture(norm_eps=eps, qkv_bias=qkv_bias, sliding_window=window, rotary_percent=rotary,
                        notes=tuple(notes))


def fmt_float(x: float) -> str:
    """Shortest text that reads back as ``x`` (1e-06, 0.25, 500000.0 -> '1e-06', '0.25', '500000.0')."""
    return repr(float(x))


# ------------------------------------------------------------------------------------------- torchtitan
TORCHTITAN_LLAMA3_FLAVORS = {
    # flavor: (dim, n_layers, n_heads, n_kv_heads, FFN hidden) of torchtitan's llama3_configs
    # (pytorch/torchtitan torchtitan/models/llama3/__init__.py); FFN hidden = compute_ffn_hidden_dim(dim,
    # multiple_of, ffn_dim_multiplier): 8B (4096, 1024, 1.3) -> 14336, 70B (8192, 4096, 1.3) -> 28672,
    # 405B (16384, 4096, 1.2) -> 53248. All: rope theta 500000, norm eps 1e-5 (TransformerModelArgs default),
    # vocabulary 128256 (the Llama 3 tokenizer), untied output, no bias, SwiGLU, RMSNorm.
    "8B": (4096, 32, 32, 8, 14336),
    "70B": (8192, 80, 64, 8, 28672),
    "405B": (16384, 126, 128, 8, 53248),
}
TORCHTITAN_ROPE_THETA = 500000.0
TORCHTITAN_VOCAB = 128256
TORCHTITAN_NORM_EPS = 1e-5


def torchtitan_unsupported(model: ModelSpec, arch: Architecture) -> list[str]:
    """Architecture features torchtitan's Llama 3 model (the one --model.name llama3 builds) lacks."""
    out = []
    if model.activation != "swiglu":
        out.append(f"activation {model.activation} (torchtitan's llama3 uses SwiGLU)")
    if model.norm != "rmsnorm":
        out.append(f"{model.norm} (torchtitan's llama3 uses RMSNorm)")
    if model.position_embedding != "rope":
        out.append(f"{model.position_embedding} position embeddings (torchtitan's llama3 uses RoPE)")
    if model.linear_bias or arch.qkv_bias:
        out.append("linear-layer biases (torchtitan's llama3 has none)")
    if model.tied_embeddings:
        out.append("tied input/output embeddings (torchtitan's llama3 unties them)")
    if arch.sliding_window is not None:
        out.append(f"sliding-window attention ({arch.sliding_window} tokens)")
    if arch.rotary_percent is not None:
        out.append(f"partial rotary embeddings ({arch.rotary_percent:g} of each head)")
    if model.is_moe:
        out.append(f"mixture-of-experts layers ({model.num_experts} experts, top-{model.experts_per_token}; "
                   "torchtitan's llama3 is dense: use one of its MoE model families)")
    return out


def torchtitan_flavor(model: ModelSpec, arch: Architecture) -> str | None:
    """The torchtitan llama3 flavor that builds exactly ``model``, else None."""
    if torchtitan_unsupported(model, arch) or model.vocab_size != TORCHTITAN_VOCAB:
        return None
    if model.rope_theta != TORCHTITAN_ROPE_THETA or (arch.norm_eps not in (None, TORCHTITAN_NORM_EPS)):
        return None
    if model.head_dim * model.num_heads != model.hidden_size:
        return None
    dims = (model.hidden_size, model.num_layers, model.num_heads, model.num_kv_heads, model.ffn_hidden_size)
    return next((name for name, d in TORCHTITAN_LLAMA3_FLAVORS.items() if d == dims), None)


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
    return ", ".join(parts)


# ------------------------------------------------------------------------------------- shared by exports
def is_uneven(plan: ParallelPlan) -> bool:
    """The plan's pipeline stages hold different numbers of layers."""
    return plan.pipeline_layout is not None or (plan.layer_split is not None and len(set(plan.layer_split)) > 1)


def header(title: str, model: ModelSpec, plan: ParallelPlan, hardware: Hardware,
           prediction: "Prediction | None") -> list[str]:
    """Comment lines opening every export: what, where, the layout, the architecture, the prediction."""
    lines = [f"# {title} for {model.name} on {plan.world_size} x {hardware.gpu.name} "
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
