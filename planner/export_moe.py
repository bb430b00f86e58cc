"""Mixture-of-experts (and multi-head latent attention) settings of an exported plan: Megatron-LM flags, NeMo
keys, torchtitan keys.

Sources (names checked against the launcher's own source):

* Megatron-LM ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM, commit 000c4ac24f61, the commit
  :mod:`planner.export` cites), ``_add_moe_args``: ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size`` ("Default is None, which will be set to the value of
  --tensor-model-paralle-size"), ``--num-experts``, ``--moe-layer-freq`` (an integer or a Python list
  expression such as "([0]+[1]*23)", 1 = expert layer), ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size`` ("Shared expert total ffn hidden size ... num_shared_experts *
  ffn_size_of_each_shared_expert"), ``--moe-grouped-gemm``, ``--moe-router-topk``,
  ``--moe-router-score-function`` (softmax | sigmoid), ``--moe-router-force-load-balancing`` ("[Experimental]
  Force override routing to balance token distribution ... for benchmarking purposes only"),
  ``--moe-token-dispatcher-type`` (allgather | alltoall | flex; default allgather, so always written),
  ``--moe-enable-deepep`` ("Only works with flex token dispatcher"), ``--moe-expert-capacity-factor``
  ("None means no token will be dropped") and ``--overlap-moe-expert-parallel-comm``; ``_add_mla_args``:
  ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim`` ("q_head_dim = qk_head_dim + qk_pos_emb_head_dim"),
  ``--qk-pos-emb-head-dim``, ``--v-head-dim``, switched on by ``--multi-latent-attention``
  (``_add_network_size_args``, "Use multi-latent attention for model"). Router (``_add_moe_args``):
  ``--moe-router-pre-softmax`` ("softmax is before the top-k selection"; TransformerConfig requires it for top-1
  softmax routing), ``--moe-router-num-groups`` / ``--moe-router-group-topk`` (group-limited routing, "See
  DeepSeek-V3"), ``--moe-router-topk-scaling-factor``, ``--moe-router-enable-expert-bias`` (aux-loss-free balancing,
  sigmoid routers only: TransformerConfig.__post_init__), ``--moe-router-load-balancing-type`` (aux_loss |
  seq_aux_loss | ...), ``--moe-aux-loss-coeff``, ``--moe-input-jitter-eps``; Megatron-LM's own DeepSeek-V3 proxy
  config (tests/functional_tests/test_cases/mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release) sets the
  same group / scaling / bias / seq_aux_loss flags.
* NeMo: ``expert_model_parallel_size``, ``num_moe_experts``, ``moe_router_topk``, ``moe_grouped_gemm`` and
  ``moe_token_dispatcher_type`` as in NVIDIA/NeMo-Framework-Launcher
  ``launcher_scripts/conf/training/mixtral/mixtral_7b_8nodes_tp_1_pp_1_cp_1_ep_2_...yaml`` (commit e0b7c5d12ac8);
  the other keys are Megatron-Core ``TransformerConfig`` / ``ModelParallelConfig`` fields of the same names as
  the Megatron-LM flags (NeMo's model config passes them on, as for ``window_size`` in :mod:`planner.export`).
* torchtitan ``torchtitan/config/job_config.py`` (pytorch/torchtitan, commit 028a455c1e3c, the commit
  :mod:`planner.export_torchtitan` cites), ``Parallelism.expert_parallel_degree``: "when etp = tp: cp <= ep <=
  dp_shard * cp ...; when etp = 1: cp * tp <= ep <= dp_shard * cp * tp", and
  ``expert_tensor_parallel_degree`` ("we only support either etp = tp or etp = 1").
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from planner.export_arch import fmt_float, layer_pattern_text


def moe_layer_pattern(model: ModelSpec) -> list[int] | None:
    """1 (MoE) / 0 (dense) per layer when not every layer is MoE; None when every layer is (Megatron's default
    --moe-layer-freq 1)."""
    pattern = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    return None if all(pattern) else pattern


pattern_text = layer_pattern_text
"""A layer pattern as the run-length list expression --moe-layer-freq reads, e.g. '([0]*3+[1]*58)'."""


def megatron_router_args(model: ModelSpec) -> tuple[list[tuple[str, object]], list[str]]:
    """(flag, value or None) pairs of the router's scoring, grouping, scaling and load balancing as the model's
    config states them (none for dense), and notes on what Megatron-LM cannot state."""
    if not model.is_moe:
        return [], []
    ex, out, notes = model.extra, [], []
    norm = ex.get("norm_topk_prob")
    if model.router == "softmax" and (norm is False or model.experts_per_token == 1):
        # softmax over all experts, top-k without renormalising (Qwen1.5-MoE, DeepSeek-V2); top-1 needs it too
        out.append(("--moe-router-pre-softmax", None))
    elif model.router == "sigmoid" and norm is False:
        notes.append("norm_topk_prob: false, but Megatron-LM renormalises the sigmoid top-k scores (top-k > 1)")
    method = ex.get("topk_method")
    groups, topk_group = ex.get("n_group") or 0, ex.get("topk_group") or 0
    if method in GROUPED_TOPK_METHODS and groups > 1 and topk_group:
        out += [("--moe-router-num-groups", groups), ("--moe-router-group-topk", topk_group)]
    scale = ex.get("routed_scaling_factor")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1.0:
        out.append(("--moe-router-topk-scaling-factor", fmt_float(scale)))
    if method == "noaux_tc" and model.router == "sigmoid":
        # aux-loss-free balancing (DeepSeek-V3 sec. 2.1.2): a per-expert bias updated at Megatron's default rate
        # 1e-3, DeepSeek-V3's (--moe-router-bias-update-rate help)
        out.append(("--moe-router-enable-expert-bias", None))
    elif method == "noaux_tc":
        notes.append("topk_method: noaux_tc expert bias needs a sigmoid router in Megatron-LM (TransformerConfig)")
    out += _balance_loss(ex)
    jitter = ex.get("router_jitter_noise")
    if isinstance(jitter, (int, float)) and not isinstance(jitter, bool) and jitter > 0:
        out.append(("--moe-input-jitter-eps", fmt_float(jitter)))
    if ex.get("shared_expert_gate"):
        notes.append("shared_expert_gate: the sigmoid gate on the shared expert's output (Qwen2-MoE) has no "
                     "Megatron-LM flag at the pinned commit")
    return out, notes


GROUPED_TOPK_METHODS = ("group_limited_greedy", "noaux_tc")
"""DeepSeek ``topk_method`` values that pick ``topk_group`` of ``n_group`` expert groups first (DeepSeek-V2 sec.
2.2.2 device-limited routing; DeepSeek-V3 sec. 2.1.2 node-limited routing)."""


def _balance_loss(ex: dict) -> list[tuple[str, object]]:
    """The auxiliary load-balancing loss: DeepSeek's ``aux_loss_alpha`` (sequence-wise with ``seq_aux``), else the
    ``router_aux_loss_coef`` of Mixtral / Qwen / gpt-oss (Megatron's aux_loss, GShard/Switch)."""
    alpha = ex.get("aux_loss_alpha")
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        kind = "seq_aux_loss" if ex.get("seq_aux") else "aux_loss"
        return [("--moe-router-load-balancing-type", kind), ("--moe-aux-loss-coeff", fmt_float(alpha))]
    coef = ex.get("router_aux_loss_coef")
    if isinstance(coef, (int, float)) and not isinstance(coef, bool):
        return [("--moe-router-load-balancing-type", "aux_loss"), ("--moe-aux-loss-coeff", fmt_float(coef))]
    return []


def megatron_moe_args(model: ModelSpec, plan: ParallelPlan) -> list[tuple[str, object]]:
    """(flag, value or None) pairs of an MoE model's experts and the plan's expert layout (none for dense)."""
    if not model.is_moe:
        return []
    out: list[tuple[str, object]] = [("--num-experts", model.num_experts),
                                     ("--moe-router-topk", model.experts_per_token),
                                     ("--moe-ffn-hidden-size", model.expert_ffn)]
    if model.shared_ffn:
        out.append(("--moe-shared-expert-intermediate-size", model.shared_ffn))
    pattern = moe_layer_pattern(model)
    if pattern is not None:
        out.append(("--moe-layer-freq", pattern_text(pattern)))
    out.append(("--moe-router-score-function", model.router))
    out += megatron_router_args(model)[0]
    if model.capacity_factor > 0:
        out.append(("--moe-expert-capacity-factor", model.capacity_factor))
    out += [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.etp),
            ("--moe-token-dispatcher-type", plan.moe_dispatcher)]
    if plan.moe_dispatcher == "flex":
        out.append(("--moe-enable-deepep", None))
    if plan.moe_grouped_gemm:
        out.append(("--moe-grouped-gemm", None))
    if plan.moe_imbalance == 1.0:  # balanced routing asked for explicitly: the benchmarking switch that forces it
        out.append(("--moe-router-force-load-balancing", None))
    if plan.moe_overlap_comm:
        out.append(("--overlap-moe-expert-parallel-comm", None))
    return out


def megatron_mla_args(model: ModelSpec) -> list[tuple[str, object]]:
    """(flag, value or None) pairs of multi-head latent attention (none for other attention)."""
    if not model.is_mla:
        return []
    out: list[tuple[str, object]] = [("--multi-latent-attention", None)]
    if model.q_lora_rank:
        out.append(("--q-lora-rank", model.q_lora_rank))
    return out + [("--kv-lora-rank", model.kv_lora_rank), ("--qk-head-dim", model.head_dim - model.qk_rope_head_dim),
                  ("--qk-pos-emb-head-dim", model.qk_rope_head_dim),
                  ("--v-head-dim", model.v_head_dim or model.head_dim)]


_NEMO_KEYS = {"--multi-latent-attention": "multi_latent_attention", "--q-lora-rank": "q_lora_rank",
              "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim",
              "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim", "--v-head-dim": "v_head_dim",
              "--num-experts": "num_moe_experts", "--moe-router-topk": "moe_router_topk",
              "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
              "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
              "--moe-router-score-function": "moe_router_score_function",
              "--moe-expert-capacity-factor": "moe_expert_capacity_factor",
              "--expert-model-parallel-size": "expert_model_parallel_size",
              "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
              "--moe-token-dispatcher-type": "moe_token_dispatcher_type", "--moe-enable-deepep": "moe_enable_deepep",
              "--moe-grouped-gemm": "moe_grouped_gemm",
              "--moe-router-force-load-balancing": "moe_router_force_load_balancing",
              "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
              "--moe-router-pre-softmax": "moe_router_pre_softmax", "--moe-router-num-groups": "moe_router_num_groups",
              "--moe-router-group-topk": "moe_router_group_topk",
              "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
              "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
              "--moe-router-load-balancing-type": "moe_router_load_balancing_type",
              "--moe-aux-loss-coeff": "moe_aux_loss_coeff", "--moe-input-jitter-eps": "moe_input_jitter_eps"}


_FLOAT_FLAGS = ("--moe-router-topk-scaling-factor", "--moe-aux-loss-coeff", "--moe-input-jitter-eps")


def nemo_moe_keys(model: ModelSpec, plan: ParallelPlan) -> dict:
    """NeMo model-config keys of :func:`megatron_mla_args` and :func:`megatron_moe_args` (moe_layer_freq as the 0/1
    list; the MLA keys are Megatron-Core MLATransformerConfig fields)."""
    out: dict = {}
    for flag, value in megatron_mla_args(model) + megatron_moe_args(model, plan):
        if flag == "--moe-layer-freq":
            out["moe_layer_freq"] = moe_layer_pattern(model)
        elif isinstance(value, str) and flag != "--moe-router-load-balancing-type" and flag in _FLOAT_FLAGS:
            out[_NEMO_KEYS[flag]] = float(value)
        else:
            out[_NEMO_KEYS[flag]] = True if value is None else value
    return out


def torchtitan_moe(model: ModelSpec, plan: ParallelPlan, dp_shard: int) -> tuple[dict, list[str]]:
    """torchtitan parallelism keys and notes for the plan's experts (none for a dense model)."""
    if not model.is_moe:
        return {}, []
    notes = []
    keys: dict = {"expert_parallel_degree": plan.ep}
    if plan.etp == plan.tp:
        low, high = plan.cp, dp_shard * plan.cp
    elif plan.etp == 1:
        keys["expert_tensor_parallel_degree"] = 1
        low, high = plan.cp * plan.tp, dp_shard * plan.cp * plan.tp
    else:
        low = high = plan.ep
        notes.append(f"torchtitan supports ETP = TP ({plan.tp}) or 1 (expert_tensor_parallel_degree); ETP={plan.etp} "
                     "has no setting there")
    if plan.ep > 1 and not (low <= plan.ep <= high):
        notes.append(f"torchtitan's expert parallelism borrows data_parallel_shard_degree x CP (x TP with ETP 1) ranks "
                     f"({low} <= EP <= {high}); EP={plan.ep} needs FSDP over more ranks (ZeRO-3)")
    if plan.moe_dispatcher != "alltoall":
        notes.append(f"the {plan.moe_dispatcher} dispatcher is Megatron-Core's; torchtitan uses all-to-all")
    return keys, notes
