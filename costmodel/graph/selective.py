"""Megatron-Core's selective recompute by module (--recompute-granularity selective --recompute-modules ...,
``ParallelPlan.recompute_modules``): which forward operators of a layer run again in backward.

Sources (NVIDIA/Megatron-LM):
* [CFG] @002526d81b81 ``megatron/core/transformer/transformer_config.py`` ``recompute_modules``: "core_attn":
  the core attention; "moe_act": the MoE MLP activation function; "layernorm": the input_layernorm and
  pre_mlp_layernorm; "mla_up_proj": the MLA up projection and RoPE applying parts; "mlp": the dense MLP
  submodule; "moe": the MoE layer; "shared_experts": the shared experts in the MoE layer. "moe_act", "layernorm"
  and "mla_up_proj" use output-discarding checkpointing, the others normal checkpointing (the module's input is
  kept, everything inside it is re-run). Default ["core_attn"].
* [LAYER] ``megatron/core/transformer/transformer_layer.py``: "layernorm" applies only to norms that are not
  ``IdentityOp``, "mlp" only to layers whose MLP is not a ``MoELayer``. In the Transformer Engine layer spec
  (``models/gpt/gpt_layer_specs.py``) a dense layer's norms are fused into ``TELayerNormColumnParallelLinear``
  (linear_qkv, linear_fc1) and its input_layernorm / pre_mlp_layernorm are ``IdentityOp``; MLA layers have a
  separate input norm (``input_layernorm=TENorm``) and MoE layers a separate pre-MLP norm. So "layernorm" re-runs
  the MLA input norm and the MoE pre-MLP norm, and "mlp" of a dense layer re-runs the fused pre-MLP norm too.
* [MOE] @001199898c4b ``megatron/core/transformer/moe/moe_layer.py`` MoELayer.forward: with "moe" the whole
  ``custom_forward`` (shared experts, router, dispatch all-to-all / all-gather, experts, combine) runs under
  ``tensor_parallel.checkpoint``, so its backward re-runs the dispatch and combine communication too;
  "shared_experts" checkpoints ``self.shared_experts`` alone.

Time only here; the activations each module stops storing are ``costmodel.memory.moe_memory.selective_cuts``.
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.opbuild import recomputed
from costmodel.graph.ops import Op

DEFAULT_MODULES = ("core_attn",)
"""Megatron-Core's default --recompute-modules ([CFG])."""


def selective_modules(plan: ParallelPlan) -> tuple[str, ...]:
    """The modules ``recompute='selective'`` recomputes: ``plan.recompute_modules`` or :data:`DEFAULT_MODULES`."""
    return plan.recompute_modules or DEFAULT_MODULES


def _module_prefixes(model: ModelSpec, modules: tuple[str, ...], moe: bool) -> tuple[str, ...]:
    """Operator-name prefixes (costmodel.graph.build / moe / attention_ops names) of the modules re-run in one layer."""
    out: list[str] = []
    if "layernorm" in modules:
        out += ["mlp_norm"] if moe else []
        out += ["attn_norm"] if model.is_mla else []
    if "mlp" in modules and not moe:
        out += ["mlp_norm", "mlp_up", "act.", "mlp_down", "tp.mlp_up.", "tp.mlp_down."]
    if moe and "moe" in modules:
        out += ["moe.", "tp.moe_shared_"]
    if moe and "shared_experts" in modules:
        out += ["moe.shared.", "tp.moe_shared_"]
    if moe and "moe_act" in modules:
        out += ["moe.expert.act"]
    if "mla_up_proj" in modules and model.is_mla:
        out += ["mla.q_up", "mla.q_proj", "mla.kv_up", "mla.rope"]
    return tuple(out)


def module_recompute_ops(ops: list[Op], model: ModelSpec, plan: ParallelPlan, moe: bool) -> list[Op]:
    """The forward operators of ``ops`` (one layer, one micro-batch) that ``plan.recompute_modules`` re-runs in
    backward (phase RECOMPUTE), each once even when two modules cover it. Eager HBM passes
    (``opbuild.HBM_PASS`` + "eager." + name) follow their operator. The attention core ("core_attn") is the
    caller's: free with FlashAttention (its backward recomputes the scores), re-run with unfused attention."""
    prefixes = _module_prefixes(model, selective_modules(plan), moe)
    if not prefixes:
        return []

    def chosen(name: str) -> bool:
        base = name.split("eager.", 1)[1] if name.startswith("hbm.eager.") else name
        return base.startswith(prefixes)

    return recomputed(o for o in ops if chosen(o.name))
