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
  (``_add_network_size_args``, "Use multi-latent attention for model"; read in a later arguments.py than
  000c4ac24f61, the flag those options belong to).
* NeMo: ``expert_model_parallel_size``, ``num_moe_experts``, ``moe_router_topk``, ``moe_grouped_gemm`` and
  ``moe_token_dispatcher_type`` as in NVIDIA/NeMo-Framework-Launcher
  ``launcher_scripts/conf/training/mixtral/mixtral_7b_8nodes_tp_1_pp_1_cp_1_ep_2_...yaml`` (commit e0b7c5d12ac8);
  the other keys are Megatron-Core ``TransformerConfig`` / ``ModelParallelConfig`` fields of the same names as
  the Megatron-LM flags (NeMo's model config passes them on, as for ``window_size`` in :mod:`planner.export`).
* torchtitan ``torchtitan/config/job_config.py`` (pytorch/torchtitan, commit 6404b932421f, the commit
  :mod:`planner.export_torchtitan` cites), ``Parallelism.expert_parallel_degree``: "only 'dp2ep' is supported,
  with the following constraints: context_parallel_degree <= expert_parallel_degree <=
  data_parallel_shard_degree * context_parallel_degree"; that version has no expert tensor-parallel key (the
  experts are split over TP like the dense layers).
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan


def moe_layer_pattern(model: ModelSpec) -> list[int] | None:
    """1 (MoE) / 0 (dense) per layer when not every layer is MoE; None when every layer is (Megatron's default
    --moe-layer-freq 1)."""
    pattern = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    return None if all(pattern) else pattern


def pattern_text(pattern: list[int]) -> str:
    """A layer pattern as the run-length list expression --moe-layer-freq reads, e.g. '([0]*3+[1]*58)'."""
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


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
    if model.mtp_layers:  # multi-token prediction depths (costmodel.mtp)
        out.append(("--mtp-num-layers", model.mtp_layers))
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
              "--mtp-num-layers": "mtp_num_layers"}


def nemo_moe_keys(model: ModelSpec, plan: ParallelPlan) -> dict:
    """NeMo model-config keys of :func:`megatron_mla_args` and :func:`megatron_moe_args` (moe_layer_freq as the 0/1
    list; the MLA keys are Megatron-Core MLATransformerConfig fields)."""
    out: dict = {}
    for flag, value in megatron_mla_args(model) + megatron_moe_args(model, plan):
        if flag == "--moe-layer-freq":
            out["moe_layer_freq"] = moe_layer_pattern(model)
        else:
            out[_NEMO_KEYS[flag]] = True if value is None else value
    return out


def torchtitan_moe(model: ModelSpec, plan: ParallelPlan, dp_shard: int) -> tuple[dict, list[str]]:
    """torchtitan parallelism keys and notes for the plan's experts (none for a dense model)."""
    if not model.is_moe:
        return {}, []
    notes = []
    keys: dict = {"expert_parallel_degree": plan.ep}
    if plan.ep > 1 and not (plan.cp <= plan.ep <= dp_shard * plan.cp):
        notes.append(f"torchtitan's expert parallelism borrows data_parallel_shard_degree x CP ranks (CP <= EP <= "
                     f"{dp_shard} x {plan.cp}); EP={plan.ep} needs FSDP over more ranks (ZeRO-3)")
    if plan.etp != plan.tp:
        notes.append(f"torchtitan (commit 6404b932421f) splits experts over TP={plan.tp} like the dense layers; "
                     f"ETP={plan.etp} has no key there")
    if plan.moe_dispatcher != "alltoall":
        notes.append(f"the {plan.moe_dispatcher} dispatcher is Megatron-Core's; torchtitan uses all-to-all")
    return keys, notes
