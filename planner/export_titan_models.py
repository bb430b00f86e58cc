"""Which torchtitan model (``[model] name``) and flavor build a ModelSpec: torchtitan's model registry and flavor
tables at pytorch/torchtitan commit 028a455c1e3c (2025-11-14), the commit :mod:`planner.export_torchtitan` cites.

Sources (that commit): ``torchtitan/models/__init__.py`` (``_supported_models``: deepseek_v3, flux, llama3,
llama3_ft, llama4, qwen3), ``torchtitan/models/llama3/__init__.py`` (``llama3_args``; TransformerModelArgs: vocab
128256, norm_eps 1e-5, RoPEScalingArgs factor 8 / low 1 / high 4 / 8192 original positions applied always, FFN
hidden = compute_ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier): 8B 14336, 70B 28672, 405B 53248),
``torchtitan/models/qwen3/__init__.py`` (``qwen3_args``; Qwen3ModelArgs norm_eps 1e-6, qk_norm; MoEArgs route_norm
True, route_scale 1.0; TrainSpec ``pipelining_fn=None``), ``torchtitan/models/deepseek_v3/__init__.py``
(``deepseekv3_args``; DeepSeekV3ModelArgs norm_eps 1e-5, rope_theta 10000, no multi-token prediction;
``n_expert_groups`` is read by nothing: "node-limited routing is not supported yet"), ``torchtitan/models/moe/moe.py``
(MoEArgs ``load_balance_coeff`` 1e-3: the aux-loss-free expert bias is on by default). Llama 4 (``llama4``) is
registered too; planner reads no Llama 4 config, so no model maps onto it.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.core.errors import PlannerError
from costmodel.core.specs.model import ModelSpec
from planner.export_arch import Architecture

TORCHTITAN_COMMIT = "028a455c1e3c"


@dataclass(frozen=True)
class Flavor:
    """One torchtitan flavor: the shapes that must equal the model's, and the details whose differences become
    notes (register a flavor with the model's values to train it exactly)."""

    shape: dict
    detail: dict


def _llama3(hidden, layers, heads, ffn) -> Flavor:
    return Flavor({"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": 8, "head_dim": hidden // heads,
                   "ffn": ffn, "vocab": 128256},
                  {"rope_theta": 500000.0, "norm_eps": 1e-5, "tied": False, "qk_norm": False,
                   "rope_scaling": "llama3 x8.0"})


def _qwen3(hidden, layers, heads, kv, ffn, tied=False, rope=1000000.0, moe=None) -> Flavor:
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv, "head_dim": 128, "ffn": ffn,
             "vocab": 151936}
    detail = {"rope_theta": rope, "norm_eps": 1e-6, "tied": tied, "qk_norm": True, "rope_scaling": None}
    if moe is not None:  # (experts, top-k, expert FFN): no shared experts, every layer MoE, softmax, route_norm
        shape.update(experts=moe[0], top_k=moe[1], expert_ffn=moe[2], shared=0, first_dense=0, router="softmax")
        detail.update(route_norm=True, route_scale=1.0, groups=None, mtp=0)
    return Flavor(shape, detail)


def _dsv3(hidden, layers, heads, ffn, vocab, moe, first, q_lora, router, route_norm, scale, groups) -> Flavor:
    shape = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads, "head_dim": 192, "ffn": ffn,
             "vocab": vocab, "experts": moe[0], "top_k": moe[1], "expert_ffn": moe[2], "shared": moe[3],
             "first_dense": first, "router": router, "q_lora": q_lora, "kv_lora": 512, "rope_dim": 64, "v_dim": 128}
    return Flavor(shape, {"rope_theta": 10000.0, "norm_eps": 1e-5, "tied": False, "qk_norm": False,
                          "route_norm": route_norm, "route_scale": scale, "groups": groups, "mtp": 0})


TORCHTITAN_MODELS: dict[str, dict[str, Flavor]] = {
    "llama3": {"8B": _llama3(4096, 32, 32, 14336), "70B": _llama3(8192, 80, 64, 28672),
               "405B": _llama3(16384, 126, 128, 53248)},
    "qwen3": {"0.6B": _qwen3(1024, 28, 16, 8, 3072, tied=True), "1.7B": _qwen3(2048, 28, 16, 8, 6144, tied=True),
              "4B": _qwen3(2560, 36, 32, 8, 9728, tied=True), "8B": _qwen3(4096, 36, 32, 8, 12288),
              "14B": _qwen3(5120, 40, 40, 8, 17408), "32B": _qwen3(5120, 64, 64, 8, 25600),
              "30B-A3B": _qwen3(2048, 48, 32, 4, 6144, moe=(128, 8, 768)),
              "235B-A22B": _qwen3(4096, 94, 64, 4, 12288, rope=5000000.0, moe=(128, 8, 1536))},
    "deepseek_v3": {
        "16B": _dsv3(2048, 27, 16, 10944, 102400, (64, 6, 1408, 2), 1, 0, "softmax", False, 1.0, None),
        "236B": _dsv3(5120, 60, 128, 12288, 102400, (160, 6, 1536, 2), 1, 1536, "softmax", False, 16.0, (8, 3)),
        "671B": _dsv3(7168, 61, 128, 18432, 129280, (256, 8, 2048, 1), 3, 1536, "sigmoid", True, 2.5, (8, 4))},
}
"""torchtitan model name -> flavor -> Flavor (the commit's flavor tables, see the module docstring)."""

FAMILIES = {"llama": "llama3", "qwen3": "qwen3", "qwen3_moe": "qwen3", "deepseek_v2": "deepseek_v3",
            "deepseek_v3": "deepseek_v3"}
"""config.json model_type -> the torchtitan model that builds it."""


def facts(model: ModelSpec, arch: Architecture) -> tuple[dict, dict]:
    """(shape, detail) of ``model`` in the terms of :class:`Flavor`."""
    ex = model.extra
    shape = {"layers": model.num_layers, "hidden": model.hidden_size, "heads": model.num_heads,
             "kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "ffn": model.ffn_hidden_size,
             "vocab": model.vocab_size}
    sc = arch.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    detail = {"rope_theta": model.rope_theta, "norm_eps": arch.norm_eps, "tied": model.tied_embeddings,
              "qk_norm": arch.qk_norm, "rope_scaling": f"{kind} x{float(sc.get('factor', 1.0))}" if kind else None}
    if model.is_moe:
        shape.update(experts=model.num_experts, top_k=model.experts_per_token, expert_ffn=model.expert_ffn,
                     shared=model.num_shared_experts, first_dense=model.first_dense_layers, router=model.router)
        grouped = ex.get("topk_method") in ("group_limited_greedy", "noaux_tc") and (ex.get("n_group") or 0) > 1
        detail.update(route_norm=ex.get("norm_topk_prob", True) is not False,
                      route_scale=float(ex.get("routed_scaling_factor") or 1.0),
                      groups=(ex["n_group"], ex["topk_group"]) if grouped else None, mtp=arch.mtp_layers)
    if model.is_mla:
        shape.update(q_lora=model.q_lora_rank, kv_lora=model.kv_lora_rank, rope_dim=model.qk_rope_head_dim,
                     v_dim=model.v_head_dim or model.head_dim)
        detail.pop("rope_scaling")  # YaRN applies only past the 4096 original positions (DeepSeekV3ModelArgs)
    return shape, detail


def family(model: ModelSpec, arch: Architecture) -> str | None:
    """The torchtitan model for ``model`` (its config family, else its features), None when torchtitan has none."""
    model_type = model.extra.get("model_type")
    if model_type is not None:
        return FAMILIES.get(model_type)
    if model.is_mla:
        return "deepseek_v3"
    if arch.qk_norm:
        return "qwen3"
    return None if model.is_moe else "llama3"


def moe_refusal(model: ModelSpec, arch: Architecture) -> str | None:
    """Why torchtitan cannot build this MoE model (one line), or None."""
    if not model.is_moe:
        return None
    name = family(model, arch)
    if name is None:
        what = model.extra.get("model_type") or "this expert layout"
        return (f"torchtitan (commit {TORCHTITAN_COMMIT}) has no model for {model.name} ({what}; its MoE models are "
                "deepseek_v3, qwen3 and llama4): export it --to megatron or --to nemo")
    if name == "qwen3" and (model.num_shared_experts or model.first_dense_layers or model.moe_layer_freq != 1):
        return (f"torchtitan's qwen3 (commit {TORCHTITAN_COMMIT}) has MoE in every layer and no shared experts; "
                f"{model.name} has {model.num_shared_experts} shared, {model.first_dense_layers} dense-first, MoE "
                f"every {model.moe_layer_freq}: export it --to megatron or --to nemo")
    return None


DETAIL_FIELDS = {"rope_theta": "rope_theta", "norm_eps": "norm_eps", "tied": "tied_embeddings", "qk_norm": "qk_norm",
                 "rope_scaling": "rope_scaling", "route_norm": "norm_topk_prob", "route_scale": "routed_scaling_factor",
                 "groups": "n_group", "mtp": "num_nextn_predict_layers"}
"""Flavor detail -> the ModelSpec field or config.json key it states (the tag of its note)."""


def _routing_notes(model: ModelSpec) -> list[str]:
    """What torchtitan's MoE does differently from the model's routing, whatever the flavor."""
    ex, notes = model.extra, []
    if ex.get("topk_method") in ("group_limited_greedy", "noaux_tc") and (ex.get("n_group") or 0) > 1:
        notes.append(f"n_group: torchtitan (commit {TORCHTITAN_COMMIT}) reads n_expert_groups nowhere (\"node-limited "
                     f"routing is not supported yet\"): tokens route over all {model.num_experts} experts, not the "
                     f"top {ex.get('topk_group')} of {ex['n_group']} groups")
    for key in ("router_aux_loss_coef", "aux_loss_alpha"):
        if isinstance(ex.get(key), (int, float)):
            notes.append(f"{key}: torchtitan balances experts with its aux-loss-free expert bias (MoEArgs "
                         f"load_balance_coeff 1e-3), not the model's auxiliary loss ({ex[key]})")
    return notes


def match(model: ModelSpec, arch: Architecture) -> tuple[str, str | None, list[str]]:
    """(torchtitan model name, flavor or None, notes on the flavor's differing details); PlannerError when torchtitan
    has no model for this MoE architecture."""
    refusal = moe_refusal(model, arch)
    if refusal is not None:
        raise PlannerError(refusal)
    name = family(model, arch) or "llama3"
    shape, detail = facts(model, arch)
    notes = _routing_notes(model) if model.is_moe else []
    for flavor, spec in TORCHTITAN_MODELS.get(name, {}).items():
        if spec.shape == shape:
            notes += [f"{DETAIL_FIELDS[key]}: torchtitan's {name} {flavor} flavor has {spec.detail[key]!r}, the model "
                      f"{'not stated' if detail.get(key) is None else repr(detail[key])}; register a flavor with the "
                      "model's value to train it exactly" for key in spec.detail if detail.get(key) != spec.detail[key]]
            return name, flavor, notes
    return name, None, notes
