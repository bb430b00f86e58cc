"""Per-GPU memory terms of mixture-of-experts layers and multi-head latent attention, for
:mod:`costmodel.memory.per_gpu` (which applies them per pipeline stage with its ZeRO / distributed-optimizer rules):
parameters split into non-expert and routed-expert parts, MoE and MLA activations, and the dispatcher's transient
buffers.

Sources
-------
* [MCORE-MOE] Megatron-Core MoE: ``megatron/core/transformer/moe/README.md`` ("The parallelism patterns of the
  shared experts follow the settings of the dense part, i.e., the attention module. The shared experts are not
  distributed but replicated in EP ranks"; expert capacity ``num_tokens_per_rank * topk * capacity_factor /
  num_experts``); ``megatron/core/distributed/distributed_data_parallel.py`` (dense parameters' grad buffers on
  ``intra_dp_cp_group``, "separate param+grad buffers for expert parallel params' grads" on
  ``intra_expt_dp_group``, so the distributed optimizer shards expert states over the expert data-parallel
  group, ``ParallelPlan.expert_dp``); ``moe/router.py`` TopKRouter (an [E, h] weight, not TP-split);
  ``moe/token_dispatcher.py`` (alltoall: permute, all-to-all over EP, all-gather over ETP, sort by local expert;
  allgather: all-gather of the tokens over the EP x ETP group); ``moe/moe_layer.py`` refuses TP > 1 without
  sequence parallelism in training. Expert FFN GEMM inputs and intermediates as the dense MLP's [KORTHIKANTI].
* [MCORE-MLA] Megatron-Core ``transformer/multi_latent_attention.py`` (MLASelfAttention) and
  ``models/gpt/gpt_layer_specs.py``: q/kv down projections replicated over TP (``backend.linear()``, TELinear
  ``parallel_mode='duplicated'``) on the sequence-parallel shard, then the q/kv norms; up projections
  column-parallel, output row-parallel (see costmodel/graph/attention_ops.py).
* [KORTHIKANTI] Korthikanti et al., arXiv 2205.05198, Sec. 4.1: per-layer activation terms (MLP: fc1 input, the
  activation's input and output); 2-byte activations.

Conventions as costmodel/memory/per_gpu.py (sizes in elements here unless a name says bytes; ``act_b`` bytes per
activation element).
"""

from __future__ import annotations

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.memory.moe_routing import rank_imbalance


def _mlp_params_per_gpu(model: ModelSpec, width: int, split: int) -> float:
    """One MLP of inner ``width`` split over ``split`` ranks: fc1 (and gate) column-, fc2 row-parallel."""
    f = width / split
    n = model.hidden_size * f * (3 if model.gated else 2)
    return n + ((2 * f if model.gated else f) + model.hidden_size if model.linear_bias else 0.0)


def _attention_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """Attention weights on one TP rank. MLA [MCORE-MLA]: W_DQ, [W_DKV; W_KR] and the q/kv norms replicated,
    the up projections and the output projection split; other attention as costmodel.memory.per_gpu's dense
    layer_params_per_gpu, with gpt-oss's per-head sink logits split with the heads."""
    h = model.hidden_size
    if model.is_mla:
        a, rope, ql, kl = model.num_heads / tp, model.qk_rope_head_dim, model.q_lora_rank, model.kv_lora_rank
        nope, v = model.head_dim - rope, model.v_head_dim or model.head_dim
        q = h * ql + ql + ql * a * (nope + rope) if ql else h * a * (nope + rope)
        return q + h * (kl + rope) + kl + kl * a * (nope + v) + a * v * h
    q = model.q_dim / tp
    kv = (model.num_kv_heads / tp if model.num_kv_heads >= tp else 1.0) * model.head_dim  # GQA: >= 1 KV head
    bias = (q + 2 * kv) + h if model.linear_bias else 0.0
    return h * (q + 2 * kv) + q * h + bias + (model.num_heads / tp if model.attention_sinks else 0.0)


def layer_param_parts(model: ModelSpec, layer: int, tp: int, ep: int = 1,
                      etp: int | None = None) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters of layer ``layer`` on one GPU [MCORE-MOE]: attention, norms and the
    dense MLP or, in an MoE layer, the router (replicated) and the shared experts (split over TP like the dense
    MLP, replicated over EP) are non-expert; the routed experts are E / EP per GPU, each split over ETP
    (None = TP)."""
    dense = _attention_params_per_gpu(model, tp) + model.norm_params()
    if not model.is_moe_layer(layer):
        return dense + _mlp_params_per_gpu(model, model.ffn_hidden_size, tp), 0.0
    dense += model.router_params() + (_mlp_params_per_gpu(model, model.shared_ffn, tp) if model.shared_ffn else 0.0)
    expert = (model.num_experts // ep) * _mlp_params_per_gpu(model, model.expert_ffn, etp or tp)
    return dense, expert


def mla_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: float, act_b: float) -> float:
    """MLA's stored tensors [MCORE-MLA]: the latents c_Q (q-norm input and q_up input) and c_KV (kv-norm input
    and kv_up input) on the sequence shard (down projections replicated, run on T/t rows with SP), and the core's
    inputs Q and K (heads/t x (nope + rope)), V and its output O (heads/t x v_head_dim) on all T tokens; the
    up-projection outputs are split/concatenated views whose backward saves nothing."""
    sp_div = plan.tp if plan.sp else 1
    a = model.num_heads / plan.tp
    v = model.v_head_dim or model.head_dim
    latent = 2 * (model.q_lora_rank + model.kv_lora_rank) * tokens / sp_div
    return act_b * (latent + tokens * a * (2 * model.head_dim + 2 * v))


def moe_imbalance(model: ModelSpec, plan: ParallelPlan) -> float:
    """Routed token copies of the busiest EP rank over the mean: :func:`costmodel.memory.moe_routing.rank_imbalance`
    (``plan.moe_imbalance`` or the published default, per expert, capped at the capacity factor, taken to the
    rank), the count costmodel.graph.moe uses."""
    return rank_imbalance(model, plan)


def _moe_received_tokens(model: ModelSpec, plan: ParallelPlan, tokens: float) -> tuple[float, float]:
    """(local tokens T_in at the MoE layer, token copies R the busiest GPU's experts process). T_in = T / t (MoE with
    TP needs SP, [MCORE-MOE]); balanced, each GPU's experts receive T_in x k copies per EP rank and the ETP group
    all-gathers them: R = T_in k ETP x :func:`moe_imbalance` (costmodel.graph.moe's count)."""
    t_in = tokens / (plan.tp if plan.sp else 1)
    return t_in, t_in * model.experts_per_token * plan.expert_tp * moe_imbalance(model, plan)


def moe_mlp_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: float, act_b: float,
                             gemm_b: float | None = None) -> float:
    """The MLP part of an MoE layer, stored for backward [MCORE-MOE]: router scores (softmax/sigmoid output, kept
    by its backward) T_in x E and top-k probabilities T_in x k; on the R received token copies the expert fc1
    input (R x h: the permuted, exchanged and chunk-sorted tokens) and the fc1 output and activation output as
    the dense MLP's [KORTHIKANTI] (gated: 2 F_e/ETP + F_e/ETP per copy); the shared experts as a dense MLP of their
    width split over TP on all T tokens (their input is the norm output, counted in the sequence region). The GEMM
    inputs (fc1 and fc2 inputs) take ``gemm_b`` bytes per element (fp8 GEMMs save fp8 copies), the rest ``act_b``."""
    gemm_b = act_b if gemm_b is None else gemm_b
    t_in, received = _moe_received_tokens(model, plan, tokens)
    fe = model.expert_ffn / plan.expert_tp
    gate = 2 if model.gated else 1
    out = act_b * t_in * (model.num_experts + model.experts_per_token)
    out += received * (gemm_b * (model.hidden_size + fe) + act_b * fe * gate)
    if model.shared_ffn:
        out += tokens * model.shared_ffn / plan.tp * (act_b * gate + gemm_b)
    return out


def moe_dispatch_working_bytes(model: ModelSpec, plan: ParallelPlan, act_b: float) -> float:
    """Transient dispatcher buffers of the MoE layer in flight (once per stage, not per micro-batch) [MCORE-MOE]:
    alltoall/flex: the T_in x k permuted copies awaiting the all-to-all plus the R received rows before the chunk
    sort (the mirror image in the combine); allgather: the tokens gathered over the EP x ETP group, T_in x EP x
    ETP x h. DeepEP's pre-registered NVLink/RDMA buffers (flex) are not modelled."""
    tokens = plan.seq_len / plan.cp * plan.mbs
    t_in, received = _moe_received_tokens(model, plan, tokens)
    if plan.moe_dispatcher == "allgather":
        rows = t_in * plan.ep * plan.expert_tp
    else:
        rows = t_in * model.experts_per_token + received
    return act_b * rows * model.hidden_size


def selective_cuts(model: ModelSpec, plan: ParallelPlan, moe: bool, tokens: float, act_b: float,
                   mlp_bytes: float, gemm_b: float | None = None) -> float:
    """Bytes one layer stops storing under Megatron-Core's ``plan.recompute_modules`` (costmodel.graph.selective's
    sources; each module keeps its input). ``mlp_bytes``: the layer's stored MLP part as costmodel.memory.per_gpu counts
    it (dense MLP, or :func:`moe_mlp_activation_bytes` in an MoE layer).
      layernorm: the output of each separate norm (MoE pre-MLP norm, MLA input norm), h per local token;
      mlp (dense layers): the whole MLP part and the fused pre-MLP norm's output (fc1 input);
      moe (MoE layers): the whole MLP part (its input, the pre-MLP norm output, stays);
      moe_act: the expert activation's output (fc2 input, F_e/ETP per received copy);
      shared_experts: the shared experts' fc1 output and activation output;
      mla_up_proj: the up projections' and RoPE's outputs, the core's inputs Q, K, V ([MCORE-MLA]).
    Terms of a module already cut by a wider one are not cut twice. GEMM inputs (the fc1 input, the expert fc2
    input, the shared experts' fc2 input) take ``gemm_b`` bytes per element, the rest ``act_b``."""
    mods = plan.recompute_modules
    if plan.recompute != "selective" or not mods:
        return 0.0
    gemm_b = act_b if gemm_b is None else gemm_b
    sp_div = plan.tp if plan.sp else 1
    norm_out = tokens * model.hidden_size / sp_div
    gate = 2 if model.gated else 1
    cut = 0.0
    if "layernorm" in mods:
        cut += act_b * norm_out * ((1 if moe else 0) + (1 if model.is_mla else 0))
    if not moe and "mlp" in mods:
        cut += mlp_bytes + gemm_b * norm_out
    elif moe and "moe" in mods:
        cut += mlp_bytes
    elif moe:
        if "moe_act" in mods:
            cut += gemm_b * _moe_received_tokens(model, plan, tokens)[1] * model.expert_ffn / plan.expert_tp
        if "shared_experts" in mods and model.shared_ffn:
            cut += tokens * model.shared_ffn / plan.tp * (act_b * gate + gemm_b)
    if model.is_mla and "mla_up_proj" in mods:
        cut += act_b * tokens * model.num_heads / plan.tp * (2 * model.head_dim + (model.v_head_dim or model.head_dim))
    return cut


def offloaded_moe_bytes(model: ModelSpec, plan: ParallelPlan, tokens: float, act_b: float, gemm_b: float) -> float:
    """Bytes of one MoE layer and micro-batch that Megatron-Core's fine-grained activation offloading moves to the
    host (``plan.offload_modules``): ``expert_fc1`` the experts' fc1 input (R received copies x h, saved as the GEMM
    input), ``moe_act`` the activation function's input (R x F_e/ETP, x 2 gated)."""
    mods = plan.offload_modules
    received = _moe_received_tokens(model, plan, tokens)[1]
    out = gemm_b * received * model.hidden_size if "expert_fc1" in mods else 0.0
    if "moe_act" in mods:
        out += act_b * received * model.expert_ffn / plan.expert_tp * (2 if model.gated else 1)
    return out
