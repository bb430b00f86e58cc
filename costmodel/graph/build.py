"""Operator graph: (model, plan) -> per-pipeline-stage operator lists with sharded shapes.

Shapes follow Megatron-LM (Shoeybi et al. 2019 §3: column-parallel QKV / MLP-up, row-parallel
attention-out / MLP-down; Korthikanti et al. 2022 §4.2.2 for sequence parallelism) and FlashAttention
(attention as one fused kernel per direction). Backward GEMMs are GEMMs: for a forward y = x W^T with
x:[m,k], W:[n,k], dgrad dx = dy W is (m, k, n) and wgrad dW = dy^T x is (n, k, m) in (M, N, K) order.

Rank order is Megatron's default tp-cp-dp-pp (tensor-parallel ranks adjacent), which decides which
collective groups cross NVLink-domain boundaries: a collective's features ``nodes`` / ``ranks_per_node``
(costmodel/core/kinds.py) count NVLink (scale-up) domains and ranks per domain (``plan.domain``: the node
on DGX/HGX-class clusters, the 72-GPU rack of 4-GPU trays on NVL72), so groups inside a domain get the
NVLink figures and groups across domains the scale-out network.

Every per-layer and per-stage operator here is per micro-batch and per GPU; DP/optimizer operators
are per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from costmodel.core.kinds import FEATURES, Category, Phase
from costmodel.core.specs.framework import attention_kernel, get_framework
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.attention_ops import (
    attention_core_ops,
    mla_attention_operators,
    mla_dims,
    mla_replicated_params,
    mla_tp_entry_bytes,
)
from costmodel.graph.block_variants import block_variant_ops, final_softcap_ops
from costmodel.graph.contention import contention_ops
from costmodel.graph.kernel_basis import (
    eager_extra_bytes,
    host_dispatch_s,
    megatron_loss_extra_bytes,
    python_layer_host_s,
)
from costmodel.graph.moe import dispatcher_notes, expert_params_per_gpu, moe_block_operators
from costmodel.graph.mtp_ops import mtp_operators
from costmodel.graph.opbuild import coll as _coll
from costmodel.graph.opbuild import elem_bytes, group_topology, hbm_pass, projection_gemms, recomputed, tp_boundary
from costmodel.graph.opbuild import gemm as _gemm
from costmodel.graph.opbuild import gemm_fwd_bwd as _gemm_fwd_bwd
from costmodel.graph.opbuild import mem as _mem
from costmodel.graph.ops import Op
from costmodel.graph.selective import module_recompute_ops, selective_modules
from costmodel.graph.zero3 import root_unit_ops, unit_collectives
from costmodel.memory.mtp import mtp_layer, mtp_params
from costmodel.memory.offload import grad_reduce_bytes, param_gather_bytes
from costmodel.memory.per_gpu import stage_host_offload
from costmodel.memory.zero_choice import zero_choice_notes

GRAD_REDUCE_BYTES = 4
"""Bytes per gradient element in the DP reduction: fp32 main gradients, as Megatron-LM's
--accumulate-allreduce-grads-in-fp32 (used by its GPT-3 example, examples/gpt3/train_gpt3_175b_distributed.sh)."""
ADAM_BYTES_PER_PARAM = 30
"""HBM traffic of one mixed-precision Adam step per parameter: reads fp32 param, grad, m, v (16 B),
writes fp32 param, m, v (12 B) and the bf16 model copy (2 B). Counted from the update rule
(Kingma & Ba 2015, Alg. 1) and Megatron's fp32-master-weights layout."""
ADAM_FLOPS_PER_PARAM = 12
"""Arithmetic of one Adam update per parameter (Alg. 1 of Kingma & Ba 2015, counted by hand)."""
CE_ALLREDUCES = 3
"""Megatron vocab-parallel cross-entropy all-reduces per step: max logit, sum of exp, target logit
(megatron/core/tensor_parallel/cross_entropy.py), each of tokens x 4 bytes."""


def domain_warnings(plan: ParallelPlan) -> list[str]:
    """Warnings for TP or CP groups that span NVLink domains (their collectives cross the scale-out network on
    every layer, e.g. TP=8 on 4-GPU Perlmutter nodes), and the MoE token dispatcher a plan was given by default
    (:func:`costmodel.graph.moe.dispatcher_notes`), and the ZeRO stage it was given by default
    (:func:`costmodel.memory.zero_choice.zero_choice_notes`)."""
    out = []
    d = plan.domain
    for name, size, stride in (("TP", plan.tp, 1), ("CP", plan.cp, plan.tp)):
        domains = group_topology(size, stride, d)[0]
        if domains > 1:
            out.append(f"{name}={size} groups span {domains} NVLink domains of {d} GPU{'s' * (d > 1)}: their per-layer "
                       f"communication crosses the scale-out network; keep {name}"
                       + (" x TP" if name == "CP" else "") + f" within {d} GPUs if you can")
    return out + dispatcher_notes(plan) + zero_choice_notes(plan)


@dataclass
class StageGraph:
    """Operators of one pipeline stage (one GPU of it)."""

    index: int
    layers: int
    """Transformer layers on this stage (all virtual chunks together)."""
    layer_ops: list[Op]
    """One layer, one micro-batch: fwd, bwd and recompute operators incl. TP collectives."""
    stage_ops: list[Op]
    """Once per micro-batch on this stage: embedding (first) or final norm + LM head + loss (last)."""
    iteration_ops: list[Op]
    """Once per iteration: DP gradient reduction, parameter all-gather, optimizer step."""
    layer_overlap_ops: list[Op] = field(default_factory=list)
    """Per layer per micro-batch communication that overlaps the layer's compute (CP KV exchange,
    ZeRO-3 parameter gathers): only the part longer than the compute is exposed."""
    params: int = 0
    """Parameters held by this stage before TP sharding."""
    signature: tuple = ()
    """(first, last, layers) as set by :func:`build_graph` (with layers of several kinds: (first, last, layers,
    ((kind, layers of it), ...)), kind = (MoE, window)): stages with the same signature have the same operator
    lists (composition sums each distinct stage once); () = not shared with another stage."""
    expert_params: int = 0
    """Routed-expert weights among ``params`` (all experts of the stage's MoE layers, before EP/ETP sharding)."""
    host_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """CPU seconds to issue one layer's (forward, backward) and the stage's once-per-micro-batch (forward, backward)
    kernels one by one (costmodel.graph.kernel_basis.host_dispatch_s; 0 with CUDA graphs): the GPU runs them no
    faster."""


@dataclass
class OperatorGraph:
    stages: list[StageGraph]
    p2p: Op | None
    """Activation send between adjacent stages for one micro-batch (None when PP = 1)."""
    num_microbatches: int
    vpp: int
    host_offload: tuple = ()
    """Per stage, what host offloading moves (costmodel.memory.per_gpu.stage_host_offload): (optimizer parameters
    stepped on the host, activation bytes offloaded per micro-batch); () without offloading."""

    def distinct_stages(self) -> list[StageGraph]:
        """The stages with distinct operator lists (stages sharing a signature share their lists)."""
        seen: set[tuple] = set()
        out = []
        for st in self.stages:
            if st.signature:
                if st.signature in seen:
                    continue
                seen.add(st.signature)
            out.append(st)
        return out

    def distinct_operators(self) -> dict[tuple, Op]:
        """Every distinct operator of the step (by Op.key(), first occurrence): the distinct stages' layer, stage,
        iteration and overlapped operators, then the p2p send."""
        unique: dict[tuple, Op] = {}
        for st in self.distinct_stages():
            for lst in (st.layer_ops, st.stage_ops, st.iteration_ops, st.layer_overlap_ops):
                for o in lst:
                    unique.setdefault(o.key(), o)
        if self.p2p is not None:
            unique.setdefault(self.p2p.key(), self.p2p)
        return unique


def _p2p(name: str, phase: Phase, nbytes: float, cross_node: bool, category: Category, count: float = 1.0) -> Op:
    """A point-to-point send between two ranks, inside one node or across two."""
    topo = (2, 1) if cross_node else (1, 2)
    return Op("send_recv", name, phase, (float(nbytes), 2, *topo), bytes=float(nbytes), count=count,
              category=category)


def _rms(model: ModelSpec) -> int:
    """The norm feature ``rms`` (costmodel/graph/ops.py): 1 for RMSNorm, 0 for LayerNorm."""
    return 1 if model.norm == "rmsnorm" else 0


SOFTMAX_FLOPS_PER_SCORE = 5.0
"""Scale, mask, max, exp and normalise per attention score (a count of the kernel's arithmetic)."""


def unfused_attention(b: int, s: int, s_full: int, heads: int, d: int, dtype: str, dropout: bool,
                      recompute_core: bool) -> list[Op]:
    """Attention before FlashAttention (Megatron-LM 2019-2022), one layer and micro-batch on one rank.

    The kernels Korthikanti et al. 2022 §5 list for the attention core: the QK^T batched GEMM, the fused
    scale-mask-softmax, the softmax dropout and the attention-over-V batched GEMM, over the full s x S score
    matrix (no causal skipping). The batched GEMMs are costed as one GEMM stacked over the b x heads batch
    (rows M = b * heads * s); the softmax and dropout are element-wise passes over the M x S scores, costed by
    the element-wise activation model (M rows of width S): softmax reads and writes a 2-byte score, dropout
    also writes a 1-byte mask. Backward: four GEMMs (dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q) and the
    two passes' backward. Selective recompute re-runs the core's forward in backward (Korthikanti §5)."""
    EB = elem_bytes(dtype)
    m = b * heads * s
    n_scores = float(m * s_full)
    drop = 1.25 if dropout else 0.0  # a dropout pass moves 5 bytes per score vs the softmax's 4

    def passes(phase: Phase, name: str, count: float, fwd: bool) -> Op:
        per = 2 * EB if fwd else 3 * EB
        return Op("activation", name, phase, (m, s_full, 0), flops=SOFTMAX_FLOPS_PER_SCORE * n_scores,
                  bytes=per * n_scores, count=count, category=Category.COMPUTE)

    fwd = [_gemm("attention.scores", Phase.FWD, m, s_full, d, dtype),
           passes(Phase.FWD, "attention.softmax", 1.0 + drop, True),
           _gemm("attention.context", Phase.FWD, m, d, s_full, dtype)]
    bwd = [_gemm("attention.scores.grad", Phase.BWD, m, s_full, d, dtype),
           passes(Phase.BWD, "attention.softmax", 1.0 + drop, False),
           _gemm("attention.context.grad", Phase.BWD, m, d, s_full, dtype, count=3.0)]
    return fwd + bwd + (recomputed(fwd) if recompute_core else [])


def op_sac_recompute(ops: list[Op], tokens: int, h: int, q: int, kv: int, f: int, gated: bool,
                     dtype: str) -> list[Op]:
    """What torchtitan's per-op selective activation checkpointing re-runs in backward, per layer: every
    element-wise forward op (not in its save list) and every second matmul of the block in execution order
    (wq, wk, wv, wo, w1, [w3,] w2: wk, wo and w3, or w2 without a gate), per torchtitan's
    parallelize_llama.py ``_custom_policy`` ("Saves output of all compute ops, except every second mm")."""
    elementwise = recomputed(o for o in ops if o.kind in ("norm", "rope", "activation", "residual_add"))
    mms = [_gemm("qkv.k", Phase.RECOMPUTE, tokens, kv, h, dtype),
           _gemm("attn_out", Phase.RECOMPUTE, tokens, h, q, dtype),
           _gemm("mlp_up.w3", Phase.RECOMPUTE, tokens, f, h, dtype) if gated
           else _gemm("mlp_down", Phase.RECOMPUTE, tokens, h, f, dtype)]
    return elementwise + mms


def eager_elementwise(ops: list[Op]) -> list[Op]:
    """The extra time of PyTorch eager over fused kernels, one residual-add-equivalent HBM pass per norm, RoPE and
    gated-activation operator of ``ops`` (same phase and count), for frameworks with ``compiled=False``: the pass
    brings the operator to the eager / fused time ratio measured on H100 for torchtitan's implementation
    (costmodel.graph.kernel_basis.eager_extra_bytes). Forward ones are re-run by recomputation like the operators they
    belong to."""
    out: list[Op] = []
    for op in ops:
        if op.kind not in ("norm", "rope", "activation") or op.phase not in (Phase.FWD, Phase.BWD):
            continue
        if op.kind == "activation" and not dict(zip(FEATURES[op.kind], op.features))["gated"]:
            continue  # a plain activation is one kernel in eager too
        nbytes = eager_extra_bytes(op.kind, op.phase is Phase.BWD, op.bytes)
        out.append(hbm_pass(f"eager.{op.name}", op.phase, nbytes, op.dtype, op.count, op.category))
    return out


def fsdp2_copies(model: ModelSpec, plan: ParallelPlan, dtype: str) -> list[Op]:
    """FSDP2's copy-out after its parameter all-gathers and copy-in before its gradient reduce-scatter, one layer
    and micro-batch (``Framework.fsdp2_copy_bytes``); backward phase, so no recomputation re-runs it."""
    per_param = get_framework(plan.framework).fsdp2_copy_bytes
    if not per_param or plan.zero != 3 or plan.dp * plan.cp <= 1:
        return []
    return [hbm_pass("fsdp2.copies", Phase.BWD, per_param * model.params_per_layer() / plan.tp, dtype)]


@dataclass(frozen=True)
class _LayerDims:
    """Local shapes of one transformer layer on one GPU for one micro-batch."""

    eb: int
    """Bytes per activation element (plan.dtype)."""
    b: int
    s_full: int
    """Sequence length of the whole sample."""
    s: int
    """Local sequence with context parallelism."""
    tokens: int
    sp_tokens: int
    """Tokens held outside the TP region (split by TP with sequence parallelism)."""
    h: int
    d: int
    heads: int
    kv_heads: int
    """Local KV heads (replicated when TP > KV heads)."""
    f: int
    """Local FFN width."""
    tp_topo: tuple[int, int]
    act: int
    """Bytes of the full [s, b, h] activation inside the TP region."""

    @property
    def norm_bytes(self) -> int:
        return self.sp_tokens * self.h * self.eb


def _layer_dims(model: ModelSpec, plan: ParallelPlan) -> _LayerDims:
    eb = elem_bytes(plan.dtype)
    t = plan.tp
    b, s_full = plan.mbs, plan.seq_len
    s = s_full // plan.cp
    tokens = b * s
    h = model.hidden_size
    return _LayerDims(eb=eb, b=b, s_full=s_full, s=s, tokens=tokens, sp_tokens=tokens // t if plan.sp else tokens,
                      h=h, d=model.head_dim, heads=model.num_heads // t, kv_heads=max(1, model.num_kv_heads // t),
                      f=model.ffn_hidden_size // t, tp_topo=group_topology(t, 1, plan.domain), act=tokens * h * eb)


def _norm_ops(name: str, dims: _LayerDims, rms: int) -> list[Op]:
    """Forward and backward of one layer norm / RMSNorm over the tokens held outside the TP region."""
    n, h = dims.sp_tokens, dims.h
    return [_mem("norm", name, Phase.FWD, (n, h, rms), 2 * dims.norm_bytes, 8.0 * n * h),
            _mem("norm", name, Phase.BWD, (n, h, rms), 4 * dims.norm_bytes, 16.0 * n * h)]


def _residual_add(dims: _LayerDims) -> Op:
    n = dims.sp_tokens * dims.h
    return _mem("residual_add", "residual_add", Phase.FWD, (n,), 3 * dims.norm_bytes, n)


def _flash_attention(dims: _LayerDims) -> list[Op]:
    """Causal flash attention, one fused kernel per direction."""
    b, s, s_full, heads, kv_heads, d = dims.b, dims.s, dims.s_full, dims.heads, dims.kv_heads, dims.d
    attn_feat = (b, s, s_full, heads, kv_heads, d, 1)
    # FLOPs of causal flash attention on this rank: QK^T and PV over the visible half of the s x S matrix.
    attn_flops = 4.0 * b * s * s_full * heads * d * 0.5
    qkvo_bytes = dims.eb * dims.tokens * (2 * heads + 2 * kv_heads) * d
    # Backward: dQ, dK, dV plus the recomputed scores: 2.5x the forward matmul FLOPs (FlashAttention-2
    # paper, Dao 2023 §3.1 counts 5 matmuls backward vs 2 forward).
    return [_mem("attention_fwd", "attention", Phase.FWD, attn_feat, qkvo_bytes, attn_flops),
            _mem("attention_bwd", "attention", Phase.BWD, attn_feat, 2 * qkvo_bytes, 2.5 * attn_flops)]


def _mha_attention(model: ModelSpec, plan: ParallelPlan, dims: _LayerDims, window: int) -> list[Op]:
    """Multi-/grouped-query attention from the TP entry to the attention core: QKV projections, RoPE, core."""
    tokens, heads, kv_heads, d, eb = dims.tokens, dims.heads, dims.kv_heads, dims.d, dims.eb
    ops = tp_boundary("qkv", True, plan, dims.act, dims.tp_topo)
    ops += projection_gemms("qkv", tokens, dims.h, (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)),
                            get_framework(plan.framework).separate_projections, plan.dtype)
    if model.position_embedding == "rope":
        rope_elems = tokens * (heads + kv_heads) * d
        ops.append(_mem("rope", "rope", Phase.FWD, (tokens, heads + kv_heads, d), 2 * rope_elems * eb,
                        3.0 * rope_elems))
        ops.append(_mem("rope", "rope", Phase.BWD, (tokens, heads + kv_heads, d), 2 * rope_elems * eb,
                        3.0 * rope_elems))
    if attention_kernel(plan) == "unfused":
        ops += unfused_attention(dims.b, dims.s, dims.s_full, heads, d, plan.dtype, model.dropout,
                                 plan.recompute == "selective" and "core_attn" in selective_modules(plan))
    elif window:
        ops += attention_core_ops(dims.b, dims.s, dims.s_full, heads, kv_heads, d, plan.dtype, window=window)
    else:
        ops += _flash_attention(dims)
    return ops


def _attention_block(model: ModelSpec, plan: ParallelPlan, dims: _LayerDims, window: int) -> tuple[list[Op], list[Op]]:
    """(operators, overlapped communication) of the attention block: norm, attention (multi-head latent
    attention for MLA models), the context-parallel KV ring, the output projection and the residual add."""
    ops = _norm_ops("attn_norm", dims, _rms(model))
    overlap: list[Op] = []
    if model.is_mla:
        # multi-head latent attention (costmodel.graph.attention_ops: Megatron-Core MLASelfAttention), its TP entry
        # gathers the compressed latents instead of [s, b, h]
        ops.extend(tp_boundary("qkv", True, plan, mla_tp_entry_bytes(model, plan), dims.tp_topo))
        ops += mla_attention_operators(model, plan, window)
        nope, rope_d, v_d = mla_dims(model)
        kv_width = dims.heads * (nope + rope_d + v_d)   # every local head has its own K (nope + rope) and V
    else:
        ops += _mha_attention(model, plan, dims, window)
        kv_width = 2 * dims.kv_heads * dims.d
    cp = plan.cp
    if cp > 1:
        # ring attention (Megatron CP): cp-1 KV-chunk exchanges forward, and K/V plus dK/dV backward,
        # each overlapped with the attention compute of the previous chunk.
        kv_chunk = dims.eb * dims.tokens * kv_width
        cross = group_topology(cp, plan.tp, plan.domain)[0] > 1
        overlap.append(_p2p("cp.kv_exchange", Phase.FWD, kv_chunk, cross, Category.CP_COMM, count=cp - 1))
        overlap.append(_p2p("cp.kv_exchange", Phase.BWD, 2 * kv_chunk, cross, Category.CP_COMM, count=cp - 1))
    if not model.is_mla:  # MLA's output projection is in mla_attention_operators
        ops += _gemm_fwd_bwd("attn_out", dims.tokens, dims.h, dims.heads * dims.d, plan.dtype)
    ops += tp_boundary("attn_out", False, plan, dims.act, dims.tp_topo)
    ops.append(_residual_add(dims))
    return ops, overlap


def _dense_mlp(model: ModelSpec, plan: ParallelPlan, dims: _LayerDims) -> list[Op]:
    """The dense MLP from the TP entry to the TP exit: up (and gate) projection, activation, down projection."""
    tokens, f, eb = dims.tokens, dims.f, dims.eb
    separate = get_framework(plan.framework).separate_projections
    ops = tp_boundary("mlp_up", True, plan, dims.act, dims.tp_topo)
    up_n = f * (2 if model.gated else 1)
    ops += projection_gemms("mlp_up", tokens, dims.h, (("w1", f), ("w3", f)) if model.gated else (("w1", f),),
                            separate and model.gated, plan.dtype)
    act_in = tokens * up_n
    act_out = tokens * f
    ops.append(_mem("activation", f"act.{model.activation}", Phase.FWD, (tokens, up_n, int(model.gated)),
                    eb * (act_in + act_out), 8.0 * act_in))
    ops.append(_mem("activation", f"act.{model.activation}", Phase.BWD, (tokens, up_n, int(model.gated)),
                    eb * (2 * act_in + act_out), 16.0 * act_in))
    ops += _gemm_fwd_bwd("mlp_down", tokens, dims.h, f, plan.dtype)
    ops += tp_boundary("mlp_down", False, plan, dims.act, dims.tp_topo)
    return ops


def _recompute_ops(ops: list[Op], model: ModelSpec, plan: ParallelPlan, dims: _LayerDims, moe: bool) -> list[Op]:
    """The operators the backward pass re-runs under the plan's recomputation."""
    fw = get_framework(plan.framework)
    if plan.recompute == "full":
        return recomputed(ops)
    # selective recompute of the attention core costs nothing extra here: FlashAttention's backward
    # kernel recomputes the scores itself (its cost is inside attention_bwd).
    if plan.recompute == "selective" and fw.selective_recompute == "op":
        sac = op_sac_recompute(ops, dims.tokens, dims.h, dims.heads * dims.d, dims.kv_heads * dims.d, dims.f,
                               model.gated, plan.dtype)
        # an MoE layer has no dense MLP matmul to re-run (its experts' element-wise ops are in the list)
        return [o for o in sac if not o.name.startswith("mlp_")] if moe else sac
    if plan.recompute == "selective" and plan.recompute_modules:  # Megatron-Core --recompute-modules
        return module_recompute_ops(ops, model, plan, moe)
    return []


def layer_operators(model: ModelSpec, plan: ParallelPlan, moe: bool = False,
                    window: int = 0) -> tuple[list[Op], list[Op]]:
    """(operators, overlapped communication) for one transformer layer and one micro-batch: with ``moe`` an MoE
    layer of an MoE model, its MLP replaced by :func:`costmodel.graph.moe.moe_block_operators`; else a dense layer.
    ``window`` > 0: the layer attends over a sliding window of that many keys
    (:func:`costmodel.graph.attention_ops.attention_core_ops`). MLA models (``model.is_mla``) get
    :func:`costmodel.graph.attention_ops.mla_attention_operators` for the attention block."""
    dims = _layer_dims(model, plan)
    ops, overlap = _attention_block(model, plan, dims, window)
    ops += _norm_ops("mlp_norm", dims, _rms(model))
    if moe:
        moe_ops, moe_overlap = moe_block_operators(model, plan)
        ops += moe_ops
        overlap += moe_overlap
    else:
        ops += _dense_mlp(model, plan, dims)
    ops.append(_residual_add(dims))
    ops = block_variant_ops(ops, model, dims.sp_tokens, plan.dtype)

    if not get_framework(plan.framework).compiled:
        ops += eager_elementwise(ops)  # PyTorch eager: element-wise chains of separate kernels
    if not moe:
        ops += fsdp2_copies(model, plan, plan.dtype)
    ops += _recompute_ops(ops, model, plan, dims, moe)
    if plan.zero == 3:
        overlap += _zero3_gathers(model, plan, moe)
    if plan.tp_comm_overlap and plan.sp:
        # Transformer Engine userbuffers (Megatron --tp-comm-overlap, which requires sequence parallelism; TE
        # transformer_engine/pytorch/module/base.py initialize_ub): the layer's TP all-gathers and reduce-scatters
        # run chunked under its GEMMs, so they are exposed only beyond the layer's compute
        under_gemms = [o.category is Category.TP_COMM and o.phase in (Phase.FWD, Phase.BWD) for o in ops]
        overlap += [o for o, hidden in zip(ops, under_gemms) if hidden]
        ops = [o for o, hidden in zip(ops, under_gemms) if not hidden]
    ops += contention_ops(overlap, plan.dtype)  # the overlapped collectives' HBM traffic (costmodel.graph.contention)
    return ops, overlap


def _zero3_gathers(model: ModelSpec, plan: ParallelPlan, moe: bool) -> list[Op]:
    """FSDP: all-gather one layer's parameter shard before forward and again before backward, reduce-scatter its
    gradients after backward; prefetched, so overlapped with layer compute. Non-expert weights over DP x CP (TP
    shards); an MoE layer's routed-expert weights (E/EP experts, / ETP) over the expert data-parallel group."""
    t = plan.tp
    if not model.is_moe:
        groups = [("zero3", model.params_per_layer() / t, plan.dp * plan.cp, t)]
    elif not moe:
        dense = model.attention_params() + model.norm_params() + model.mlp_params(model.ffn_hidden_size)
        groups = [("zero3", dense / t, plan.dp * plan.cp, t)]
    else:
        experts = model.num_experts * model.expert_params()
        groups = [("zero3", (model.params_per_layer() - experts) / t, plan.dp * plan.cp, t),
                  ("zero3.expert", expert_params_per_gpu(model, plan, 1), plan.expert_dp,
                   plan.expert_tp * plan.ep)]
    return [op for prefix, params, group, stride in groups
            for op in unit_collectives(prefix, params, group, stride, plan)]


def _embedding_ops(model: ModelSpec, plan: ParallelPlan) -> list[Op]:
    EB = elem_bytes(plan.dtype)
    t = plan.tp
    tokens = plan.mbs * plan.seq_len // plan.cp
    h = model.hidden_size
    v = -(-model.vocab_size // t)
    out = tokens * h * EB
    ops = [_mem("embedding", "embedding", Phase.FWD, (tokens, h, v), 2 * out),
           _mem("embedding", "embedding", Phase.BWD, (tokens, h, v), 3 * out)]
    if t > 1:
        topo = group_topology(t, 1, plan.domain)
        kind = "reduce_scatter" if plan.sp else "all_reduce"
        ops.append(_coll(kind, f"tp.embedding.{kind.replace('_', '')}", Phase.FWD, out, t, topo, Category.TP_COMM))
    return ops


def cross_entropy_ops(plan: ParallelPlan, tokens: int, v: int) -> list[Op]:
    """The loss on ``tokens`` x ``v`` logits as one fused kernel (costmodel.graph.kernel_basis.graph_bytes: the forward
    reads the 2-byte logits, the backward reads them and writes their gradient) where the plan fuses it
    (``ParallelPlan.cross_entropy_fusion``, else ``Framework.compiled_loss``); otherwise plus the HBM traffic of the
    framework's chain: Megatron-Core's vocab-parallel cross entropy (``Framework.vocab_parallel_loss``: its fp32 passes,
    costmodel.graph.kernel_basis.MEGATRON_LOSS_BYTES) or PyTorch's eager F.cross_entropy(logits.float()) at the measured
    eager / fused ratio (costmodel.graph.kernel_basis.eager_extra_bytes: 6x the fused kernel's time on H100)."""
    ops = [_mem("cross_entropy", "cross_entropy", Phase.FWD, (tokens, v), 2.0 * tokens * v, 5.0 * tokens * v),
           _mem("cross_entropy", "cross_entropy", Phase.BWD, (tokens, v), 4.0 * tokens * v, 2.0 * tokens * v)]
    fw = get_framework(plan.framework)
    fused = plan.cross_entropy_fusion
    if fused if fused is not None else fw.compiled_loss:
        return ops
    if fw.vocab_parallel_loss:
        return ops + [hbm_pass("megatron.cross_entropy", o.phase,
                               megatron_loss_extra_bytes(o.backward, o.bytes, float(tokens * v)), plan.dtype)
                      for o in ops]
    return ops + [hbm_pass("eager.cross_entropy", o.phase, eager_extra_bytes("cross_entropy", o.backward, o.bytes),
                           plan.dtype) for o in ops]


def head_dtype(plan: ParallelPlan) -> str:
    """The output layer's GEMM dtype: bf16 in a Megatron FP8 plan, which builds it as a plain
    tensor_parallel.ColumnParallelLinear outside Transformer Engine's fp8_autocast unless an MXFP8 output projection is
    asked for (megatron/core/models/gpt/gpt_model.py @d98e8a64: TELMHeadColumnParallelLinear only when
    is_mxfp8_output_proj_active). PyTorch-native stacks convert it like every nn.Linear (torchtitan's float8
    filter_fqns defaults to an empty list): the plan's dtype."""
    return "bf16" if plan.dtype in ("fp8", "fp8-block") and plan.framework == "megatron" else plan.dtype


def _head_ops(model: ModelSpec, plan: ParallelPlan) -> list[Op]:
    EB = elem_bytes(plan.dtype)
    t = plan.tp
    tokens = plan.mbs * plan.seq_len // plan.cp
    h = model.hidden_size
    v = -(-model.vocab_size // t)
    sp_tokens = tokens // t if plan.sp else tokens
    norm_bytes = sp_tokens * h * EB
    rms = _rms(model)
    ops = [_mem("norm", "final_norm", Phase.FWD, (sp_tokens, h, rms), 2 * norm_bytes, 8.0 * sp_tokens * h),
           _mem("norm", "final_norm", Phase.BWD, (sp_tokens, h, rms), 4 * norm_bytes, 16.0 * sp_tokens * h)]
    topo = group_topology(t, 1, plan.domain)
    act = tokens * h * EB
    ops += tp_boundary("lm_head", True, plan, act, topo)
    ops += _gemm_fwd_bwd("lm_head", tokens, v, h, head_dtype(plan))
    ops += final_softcap_ops(model, tokens, v, plan.dtype)
    ops += cross_entropy_ops(plan, tokens, v)
    if t > 1:
        ops.append(Op("all_reduce", "tp.cross_entropy.allreduce", Phase.FWD, (float(tokens * 4), t, *topo),
                      bytes=float(tokens * 4), count=CE_ALLREDUCES, category=Category.TP_COMM))
    return ops


def _grad_reduction(prefix: str, params_gpu: float, group: int, topo: tuple[int, int], plan: ParallelPlan) -> list[Op]:
    """Per-iteration gradient reduction (and distributed-optimizer all-gather) of ``params_gpu`` over ``group``."""
    ops: list[Op] = []
    if group > 1:
        gbytes = params_gpu * grad_reduce_bytes(plan)
        if plan.zero == 0:
            ops.append(_coll("all_reduce", f"{prefix}.grad_allreduce", Phase.DP_COMM, gbytes, group, topo,
                             Category.DP_COMM))
        elif plan.zero in (1, 2):
            ops.append(_coll("reduce_scatter", f"{prefix}.grad_reducescatter", Phase.DP_COMM, gbytes, group, topo,
                             Category.DP_COMM))
            # the distributed optimizer's all-gather is data-parallel communication (phase zero_comm)
            ops.append(_coll("all_gather", f"{prefix}.param_allgather", Phase.ZERO_COMM,
                             params_gpu * param_gather_bytes(plan), group, topo, Category.DP_COMM))
        # zero == 3: gradients are reduce-scattered per layer (layer_overlap_ops)
    return ops


def _iteration_ops(model: ModelSpec, plan: ParallelPlan, stage_params: int, first: bool, last: bool,
                   moe_layers: int = 0, replicated: int = 0) -> list[Op]:
    """DP gradient reduction, distributed-optimizer parameter all-gather, optimizer step (per iteration).

    With ``moe_layers`` MoE layers on the stage, their routed experts' weights (E/EP experts per layer, / ETP)
    are reduced over the expert data-parallel group (Megatron-Core parallel_state.py ``expert_data_parallel``,
    ranks ETP x EP apart in the tp-ep-dp-pp expert grid) and their optimizer shard is / expert DP; the rest over
    DP x CP as for dense models.

    ``replicated``: weights of the stage every TP rank holds whole (MLA down projections and their norms, MoE
    routers: :func:`_tp_replicated_params`); with sequence parallelism each TP rank's gradient of them covers its
    own sequence shard, so they are all-reduced over TP once per iteration (Megatron-Core finalize_model_grads,
    ``_allreduce_non_tensor_model_parallel_grads``, for parameters marked ``sequence_parallel``), and they count
    whole, not / TP, in the DP reduction and optimizer shard."""
    t, cp = plan.tp, plan.cp
    group = plan.dp * cp          # gradients are reduced over DP x CP (Megatron's data-parallel-with-CP group)
    expert_gpu = expert_params_per_gpu(model, plan, moe_layers) if moe_layers else 0.0
    params_gpu = (stage_params - moe_layers * model.num_experts * model.expert_params()) / t if moe_layers \
        else stage_params / t
    ops: list[Op] = []
    if replicated and t > 1:
        params_gpu += replicated - replicated / t
        if plan.sp:
            rbytes = float(replicated * grad_reduce_bytes(plan))
            ops.append(_coll("all_reduce", "tp.replicated_grad_allreduce", Phase.DP_COMM, rbytes, t,
                             group_topology(t, 1, plan.domain), Category.TP_COMM))
    ops += _grad_reduction("dp", params_gpu, group, group_topology(group, t, plan.domain), plan)
    if moe_layers:
        edp = plan.expert_dp
        topo = group_topology(edp, plan.expert_tp * plan.ep, plan.domain)
        ops += _grad_reduction("dp.expert", expert_gpu, edp, topo, plan)
    if (model.tied_embeddings or model.mtp_layers) and plan.pp > 1 and (first or last):
        # Megatron keeps the tied embedding (or the one MTP shares, costmodel.memory.mtp) on the first and last stage
        # and all-reduces its gradient.
        nbytes = model.vocab_size * model.hidden_size / t * GRAD_REDUCE_BYTES
        topo = group_topology(2, plan.tp * plan.cp * plan.dp * (plan.pp - 1), plan.domain)
        ops.append(_coll("all_reduce", "pp.embedding_grad_allreduce", Phase.DP_COMM, nbytes, 2, topo, Category.PP_COMM))
    shard = params_gpu / group if plan.zero >= 1 else params_gpu
    if moe_layers:
        shard += expert_gpu / plan.expert_dp if plan.zero >= 1 else expert_gpu
    shard *= 1.0 - plan.optimizer_offload_fraction  # the rest is stepped on the host (costmodel.memory.offload)
    ops.append(Op("optimizer", "optimizer.adam", Phase.OPTIMIZER, (round(shard),),
                  flops=ADAM_FLOPS_PER_PARAM * shard, bytes=ADAM_BYTES_PER_PARAM * shard, category=Category.OPTIMIZER))
    return ops


def _tp_replicated_params(model: ModelSpec, layers: int, moe_layers: int) -> int:
    """Weights of ``layers`` layers (``moe_layers`` of them MoE) that TP does not split: MLA's down projections and
    norms (:func:`costmodel.graph.attention_ops.mla_replicated_params`) and the MoE routers (Megatron-Core router.py: a
    plain h x E weight on every TP rank). 0 for other models (their norm weights are left out as before)."""
    return layers * mla_replicated_params(model) + moe_layers * model.router_params()


def _mix(parts: list[tuple[list[Op], int]], n: int) -> list[Op]:
    """One average layer of a stage whose ``n`` layers come in kinds (list, layers of that kind): each list's counts
    scaled by its share, so layers x the per-layer sum is exactly the sum over the stage's layers."""
    return [replace(o, count=o.count * k / n) for ops, k in parts for o in ops]


def _layer_kind(model: ModelSpec, i: int) -> tuple[bool, int]:
    """(MoE, sliding window or 0) of layer ``i``: what decides its operators."""
    return model.is_moe_layer(i), model.sliding_window if model.uses_sliding_window(i) else 0


def _stage_kinds(model: ModelSpec, plan: ParallelPlan) -> tuple[list, dict]:
    """(per stage (kind counts, MoE layers, parameters), {kind counts: (layer ops, overlap ops)}) for a model whose
    layers differ (MoE: DeepSeek-V3's first three layers are dense, moe_layer_freq; gpt-oss's alternating sliding
    window): a stage's lists are the average of its layers (:func:`_mix`)."""
    per_stage = []
    for idx in plan.stage_layer_indices(model.num_layers):
        counts: dict[tuple[bool, int], int] = {}
        for i in idx:
            kind = _layer_kind(model, i)
            counts[kind] = counts.get(kind, 0) + 1
        per_stage.append((tuple(sorted(counts.items())), sum(model.is_moe_layer(i) for i in idx),
                          sum(model.layer_params(i) for i in idx)))
    variants: dict[tuple[bool, int], tuple[list[Op], list[Op]]] = {}
    lists: dict[tuple, tuple[list[Op], list[Op]]] = {}
    for kinds, _, _ in per_stage:
        if kinds in lists:
            continue
        for kind, _ in kinds:
            if kind not in variants:
                variants[kind] = layer_operators(model, plan, moe=kind[0], window=kind[1])
        if len(kinds) == 1:
            lists[kinds] = variants[kinds[0][0]]
        else:
            n = sum(k for _, k in kinds)
            lists[kinds] = (_mix([(variants[kind][0], k) for kind, k in kinds], n),
                            _mix([(variants[kind][1], k) for kind, k in kinds], n))
    return per_stage, lists


def _host_dispatch(plan: ParallelPlan, layer_ops: list[Op], stage_ops: list[Op]) -> tuple[float, float, float, float]:
    """StageGraph.host_s of a stage (costmodel.graph.kernel_basis.host_dispatch_s on the plan's framework; a stack
    running its layers as PyTorch modules at least costmodel.graph.kernel_basis.host_layer_s per layer)."""
    fw = get_framework(plan.framework)
    hf, hb = host_dispatch_s(layer_ops, fw.compiled, plan.cuda_graphs)
    if fw.python_layers:
        hf, hb = python_layer_host_s(hf, hb)
    return (hf, hb, *host_dispatch_s(stage_ops, fw.compiled, plan.cuda_graphs))


def build_graph(model: ModelSpec, plan: ParallelPlan) -> OperatorGraph:
    """Per-stage operator lists for ``plan`` (validated by the caller). Where layers differ (MoE models, sliding
    windows on some layers) a stage holds the average of its layers (:func:`_stage_kinds`) and its signature adds
    the count of each kind of layer."""
    splits = plan.stage_layers(model.num_layers)
    varied = model.is_moe or (model.sliding_window > 0 and model.sliding_window_every > 0)
    if varied:
        kinds_per_stage, kind_lists = _stage_kinds(model, plan)
    else:
        layer_ops, overlap = layer_operators(model, plan)
    emb, head = _embedding_ops(model, plan), _head_ops(model, plan)
    if model.mtp_layers:  # the MTP depths run on the last stage, once per micro-batch (costmodel.graph.mtp_ops)
        kind = _layer_kind(model, mtp_layer(model))
        head = head + mtp_operators(model, plan, *layer_operators(model, plan, moe=kind[0], window=kind[1]),
                                    list(emb), list(head))
    emb += root_unit_ops("embedding", model.embedding_params(), plan)
    head += root_unit_ops("head", model.head_params(), plan)
    stages: list[StageGraph] = []
    # stages with the same role and layer count share their operator lists and a signature, so
    # composition sums each distinct stage once (a 16-stage pipeline has at most 3 distinct kinds of stage)
    shared: dict[tuple, tuple[list, list, tuple[float, float, float, float]]] = {}
    for i, n_layers in enumerate(splits):
        first, last = i == 0, i == plan.pp - 1
        n_moe, kinds = 0, ()
        if varied:
            kinds, n_moe, params = kinds_per_stage[i]
            layer_ops, overlap = kind_lists[kinds]
        else:
            params = n_layers * model.params_per_layer()
        if first:
            params += model.embedding_params()
        if last:
            params += model.head_params() + mtp_params(model)
            n_moe += model.mtp_layers * model.is_moe_layer(mtp_layer(model))
            if (model.tied_embeddings or model.mtp_layers) and plan.pp > 1:  # the last stage's embedding copy
                params += model.vocab_size * model.hidden_size
        key: tuple = (first, last, n_layers, kinds) if varied else (first, last, n_layers)
        if key not in shared:
            stage_ops: list[Op] = (emb if first else []) + (head if last else [])
            replicated = _tp_replicated_params(model, n_layers, n_moe) if varied or model.is_mla else 0
            shared[key] = (stage_ops, _iteration_ops(model, plan, params, first, last, n_moe, replicated),
                           _host_dispatch(plan, layer_ops, stage_ops))
        stage_ops, iteration_ops, host = shared[key]
        stages.append(StageGraph(i, n_layers, layer_ops, stage_ops, iteration_ops, overlap, params, key,
                                 n_moe * model.num_experts * model.expert_params(), host))
    p2p = None
    if plan.pp > 1:
        tokens = plan.mbs * plan.seq_len // plan.cp
        nbytes = tokens * model.hidden_size * elem_bytes(plan.dtype) / (plan.tp if plan.sp else 1)
        stride = plan.tp * plan.cp * plan.dp
        p2p = _p2p("pp.p2p", Phase.PP_COMM, nbytes, stride >= plan.domain, Category.PP_COMM)
    return OperatorGraph(stages, p2p, plan.num_microbatches, plan.vpp, stage_host_offload(model, plan))
