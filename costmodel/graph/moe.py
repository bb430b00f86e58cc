"""Operators of one mixture-of-experts (MoE) block: router, token dispatch, experts, combine, shared experts.

One MoE layer's MLP part for one micro-batch on one GPU, as Megatron-Core runs it
(NVIDIA/Megatron-LM ``megatron/core/transformer/moe/``: ``moe_layer.py`` MoELayer.forward, ``router.py``
TopKRouter, ``token_dispatcher.py`` MoEAlltoAllTokenDispatcher / MoEAllGatherTokenDispatcher /
MoEFlexTokenDispatcher, ``experts.py`` GroupedMLP / SequentialMLP, ``shared_experts.py`` SharedExpertMLP,
``moe_utils.py`` permute / unpermute / sort_chunks_by_idxs). The norm before the block and the residual add
after it stay in :func:`costmodel.graph.build.layer_operators`.

Tokens: each rank routes its local tokens T = b * s / CP, divided by TP with sequence parallelism (the MoE
layer's input is the sequence-parallel shard; Megatron-Core's MoELayer raises "During training, performance
may degrade if MoE and tensor parallelism are enabled without also enabling sequence parallelism", and
Megatron-LM's arguments.py requires SP for EP with TP > 1). Without SP and TP > 1 every TP rank routes all
b * s / CP tokens.

The expert grid is ordered tp-ep-dp-pp (Megatron-Core parallel_state.py, ``expert_tensor_and_model_parallel``
ranks adjacent): ETP ranks are adjacent, EP ranks ETP apart, so the EP group's topology is
``group_topology(EP, ETP, domain)`` and the ETP group's ``group_topology(ETP, 1, domain)``.

Routing imbalance: the busiest EP rank receives ``imbalance`` times the mean share of token copies and every rank
waits for the busiest at the combine, so the expert GEMMs are costed with the busiest rank's rows, spread evenly
over its local experts (:func:`routing_imbalance`; the default and its source in :mod:`costmodel.memory.moe_routing`).
Dispatch and combine bytes are the sender's (T x k tokens per rank, the
same on every rank); the busiest receiver's extra bytes are not modelled.

Not modelled (small next to the token traffic or not in the plan): the router's auxiliary loss and z-loss, the
dispatcher's token-count exchange (an all-gather / all-to-all of E integers per rank), the all-to-all of the
routing probabilities (T x k fp32 per rank, alongside the tokens in recent Megatron-Core), Qwen2-MoE's shared
expert gate (an h x 1 linear), the shared-expert overlap (--moe-shared-expert-overlap) and padding to capacity
(--moe-pad-expert-input-to-capacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from costmodel.core.kinds import Category, Phase
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.opbuild import elem_bytes, gemm, group_topology, tp_boundary
from costmodel.graph.ops import Op
from costmodel.memory.moe_routing import rank_imbalance

SCORE_FLOPS_PER_LOGIT = 5.0
"""Router scoring per logit: the same count as an attention softmax score
(costmodel.graph.build.SOFTMAX_FLOPS_PER_SCORE: scale, max, exp, sum, normalise); the top-k selection is comparisons,
inside the memory-bound pass."""

ACT_FLOPS_PER_INPUT_FWD = 8.0
ACT_FLOPS_PER_INPUT_BWD = 16.0
"""Activation FLOPs per input element, forward and backward: the counts of the dense MLP's activation operator
in costmodel/graph/build.py (layer_operators), so an expert's activation costs as a dense one of the same shape."""


def routing_imbalance(model: ModelSpec, plan: ParallelPlan) -> float:
    """Routed token copies of the busiest EP rank over the mean (:func:`costmodel.memory.moe_routing.rank_imbalance`:
    ``plan.moe_imbalance`` or the published default for the model's router, per expert, taken to the rank)."""
    return rank_imbalance(model, plan)


def domain_hit_probability(model: ModelSpec, domains: int, routing: str = "learned") -> float:
    """Probability that a given one of ``domains`` equal parts of the EP group (NVLink domains, or EP ranks) holds
    at least one of a token's k experts.

    ``learned`` / ``random`` routing (ParallelPlan.moe_routing): the k drawn uniformly without repetition from E:
    1 - C(E - E/N, k) / C(E, k). With group-limited routing stated in config.json (DeepSeek-V3 ``n_group`` groups,
    ``topk_group`` of them per token; Megatron-Core --moe-router-num-groups / --moe-router-group-topk, which its
    forced load balancing keeps: TransformerConfig moe_router_force_load_balancing "supports naive topk and
    group-limited topk") and whole groups per part (N divides n_group), the token's groups are drawn first: the
    number j of them in the part is hypergeometric, and the k experts are drawn from the g E/G experts of its g
    groups: 1 - sum_j P(j) C((g - j) E/G, k) / C(g E/G, k). ``round_robin``: :func:`round_robin_parts` / N."""
    E, k, N = model.num_experts, model.experts_per_token, domains
    if routing == "round_robin":
        return round_robin_parts(E, k, N) / N
    G, g = int(model.extra.get("n_group") or 0), int(model.extra.get("topk_group") or 0)
    if 1 < G and 0 < g < G and G % N == 0 and E % G == 0:
        per = E // G
        miss = sum(math.comb(G // N, j) * math.comb(G - G // N, g - j) / math.comb(G, g)
                   * math.comb((g - j) * per, k) / math.comb(g * per, k) for j in range(0, min(g, G // N) + 1))
        return 1.0 - miss
    return 1.0 - math.comb(E - E // N, k) / math.comb(E, k)


def round_robin_parts(experts: int, k: int, parts: int) -> float:
    """Mean number of the ``parts`` equal, contiguous expert ranges (EP ranks or NVLink domains in rank order:
    Megatron-Core and NeMo AutoModel place experts e E/EP ... on EP rank e) that a token's k experts touch when
    token t takes experts t k, ..., t k + k - 1 mod E: NeMo AutoModel's FakeBalancedGate
    (nemo_automodel/components/moe/layers.py @e4581201, noise 0: ``indices = arange(n_tokens * k).view(-1, k) %
    n_experts``). The starts t k mod E repeat with period E / gcd(E, k); averaged over one period."""
    size = experts // parts
    period = experts // math.gcd(experts, k)
    touched = 0
    for t in range(period):
        start = t * k % experts
        touched += len({((start + j) % experts) // size for j in range(k)})
    return touched / period


def flex_byte_factor(model: ModelSpec, domains: int, ranks: int = 1, routing: str = "learned") -> float:
    """Bytes of the flex (DeepEP / HybridEP) dispatch/combine over the all-to-all's, which sends every one of a
    token's k copies (Megatron-Core MoEAlltoAllTokenDispatcher: one row per token-expert pair).

    Across NVLink domains DeepEP sends each token once to every other domain holding at least one of its top-k
    experts and fans it out over NVLink there (deepseek-ai/DeepEP README, "normal kernels ... asymmetric-domain
    bandwidth forwarding, such as forwarding data from NVLink domain to RDMA domain"; DeepSeek-V3 report, arXiv
    2412.19437 sec. 3.2.2: each token is sent by IB once per target node, then forwarded by NVLink to the GPUs
    hosting its experts): N hit / k of the all-to-all's bytes, hit from :func:`domain_hit_probability` over the
    ``domains`` (scales the whole message: its network part dominates across domains; tests/test_measured.py
    checks the scaled all-to-all against DeepEP's measured 2- and 4-node combine). Inside one domain its
    intranode kernels send a token once to every EP rank holding one of its experts (DeepEP deep_ep/buffer.py
    get_dispatch_layout: ``num_tokens_per_rank``, ``is_token_in_rank``; the combine reduces per rank the same
    way): ``ranks`` hit / k, ``ranks`` = the EP group's size. ``routing`` is ParallelPlan.moe_routing."""
    k = model.experts_per_token
    parts = domains if domains > 1 else ranks
    if parts <= 1 or k <= 1:
        return 1.0
    return min(1.0, parts * domain_hit_probability(model, parts, routing) / k)


def _gemm3(name: str, m: int, n: int, k: int, dtype: str, count: float = 1.0) -> list[Op]:
    """Forward GEMM (m, n, k) plus dgrad (m, k, n) and wgrad (n, k, m), each ``count`` times (graph/build.py's
    order)."""
    return [gemm(name, Phase.FWD, m, n, k, dtype, count),
            gemm(name + ".dgrad", Phase.BWD, m, k, n, dtype, count),
            gemm(name + ".wgrad", Phase.BWD, n, k, m, dtype, count)]


def _copy(name: str, phase: Phase, rows: int, h: int, eb: int) -> Op:
    """A row gather/scatter of ``rows`` x ``h`` elements (token permute, unpermute, chunk sort): reads and writes
    each element once. Costed as the element-wise residual-add kernel (which reads two and writes one element)
    that moves the same bytes: 2/3 of the elements."""
    n = rows * h
    return Op("residual_add", name, phase, (max(1, math.ceil(2 * n / 3)),), flops=0.0, bytes=float(2 * eb * n),
              category=Category.COMPUTE)


def _act(name: str, phase: Phase, rows: int, width: int, out: int, gated: bool, eb: int, count: float = 1.0) -> Op:
    """The MLP activation over ``rows`` x ``width`` inputs (graph/build.py's formulas)."""
    fwd = phase is Phase.FWD
    nbytes = eb * ((rows * width + rows * out) if fwd else (2 * rows * width + rows * out))
    flops = (ACT_FLOPS_PER_INPUT_FWD if fwd else ACT_FLOPS_PER_INPUT_BWD) * rows * width
    return Op("activation", name, phase, (rows, width, int(gated)), flops=flops, bytes=float(nbytes), count=count,
              category=Category.COMPUTE)


@dataclass(frozen=True)
class _Block:
    """Shapes of one MoE layer on one GPU, one micro-batch (:func:`moe_block_operators`)."""

    tokens: int
    """b * s / CP: the layer's tokens on this rank (the shared experts' rows)."""
    T: int
    """Tokens this rank routes: ``tokens`` / TP with sequence parallelism."""
    h: int
    E: int
    k: int
    ep: int
    etp: int
    e_local: int
    """Routed experts per EP rank, E / EP."""
    f_e: int
    """One expert's FFN width on this rank, expert_ffn / ETP."""
    up_n: int
    """Width of the expert up GEMM (x2 gated)."""
    gated: bool
    eb: int
    dtype: str
    domain: int

    @property
    def received(self) -> int:
        """Token copies this rank's experts process (balanced): T x k (x ETP: gathered inside the ETP group)."""
        return self.T * self.k * self.etp


def _block(model: ModelSpec, plan: ParallelPlan) -> _Block:
    tokens = plan.mbs * (plan.seq_len // plan.cp)
    f_e = model.expert_ffn // plan.expert_tp
    return _Block(tokens=tokens, T=tokens // plan.tp if plan.sp else tokens, h=model.hidden_size,
                  E=model.num_experts, k=model.experts_per_token, ep=plan.ep, etp=plan.expert_tp,
                  e_local=model.num_experts // plan.ep, f_e=f_e, up_n=f_e * (2 if model.gated else 1),
                  gated=model.gated, eb=elem_bytes(plan.dtype), dtype=plan.dtype, domain=plan.domain)


def _coll(kind: str, name: str, phase: Phase, nbytes: float, size: int, topo: tuple[int, int]) -> list[Op]:
    """One EP-communication collective (category EP_COMM); none for a group of one."""
    if size <= 1:
        return []
    return [Op(kind, name, phase, (float(nbytes), size, topo[0], topo[1]), bytes=float(nbytes),
               category=Category.EP_COMM)]


def router_operators(b: _Block) -> list[Op]:
    """Router (router.py TopKRouter): a replicated h x E linear, plain torch (not TE), so bf16 under fp8; the
    scoring and top-k over T x E logits, forward and backward."""
    router_dtype = "bf16" if b.dtype in ("fp8", "fp8-block") else b.dtype
    n_logits = b.T * b.E
    return _gemm3("moe.router", b.T, b.E, b.h, router_dtype) + [
        Op("activation", "moe.router.topk", Phase.FWD, (b.T, b.E, 0), flops=SCORE_FLOPS_PER_LOGIT * n_logits,
           bytes=float(2 * b.eb * n_logits), category=Category.COMPUTE),
        Op("activation", "moe.router.topk", Phase.BWD, (b.T, b.E, 0), flops=SCORE_FLOPS_PER_LOGIT * n_logits,
           bytes=float(3 * b.eb * n_logits), category=Category.COMPUTE)]


def allgather_dispatch(b: _Block) -> list[Op]:
    """MoEAllGatherTokenDispatcher: all-gather of the T x EP x ETP tokens and their routing over the tp_ep group
    (each rank then keeps its experts' share), reduce-scatter back; backward the mirror image."""
    g = b.ep * b.etp
    topo = group_topology(g, 1, b.domain)
    gathered = b.T * g * b.h * b.eb
    routing = b.T * g * b.E * (4 + 1)            # routing probs (fp32) and routing map (bool) per token x expert
    return (_coll("all_gather", "moe.dispatch", Phase.FWD, gathered, g, topo)
            + _coll("all_gather", "moe.dispatch.routing", Phase.FWD, routing, g, topo)
            + _coll("reduce_scatter", "moe.combine", Phase.FWD, gathered, g, topo)
            + _coll("all_gather", "moe.combine", Phase.BWD, gathered, g, topo)
            + _coll("reduce_scatter", "moe.dispatch", Phase.BWD, gathered, g, topo))


def alltoall_dispatch(model: ModelSpec, plan: ParallelPlan, b: _Block) -> list[Op]:
    """All-to-all dispatch and combine over the EP group (every routed copy of every local token leaves once:
    T x k x h elements per rank), with ETP > 1 the all-gather / reduce-scatter of the received tokens inside the
    ETP group; backward the mirror image. The flex dispatcher (DeepEP / HybridEP) is the all-to-all with its
    bytes deduplicated per destination (:func:`flex_byte_factor`)."""
    ep_topo = group_topology(b.ep, b.etp, b.domain)
    etp_topo = group_topology(b.etp, 1, b.domain)
    a2a = float(b.T * b.k * b.h * b.eb)
    if plan.moe_dispatcher == "flex":
        a2a *= flex_byte_factor(model, ep_topo[0], b.ep, plan.moe_routing)
    etp_bytes = b.received * b.h * b.eb
    return (_coll("all_to_all", "moe.dispatch", Phase.FWD, a2a, b.ep, ep_topo)
            + _coll("all_gather", "moe.dispatch.etp_allgather", Phase.FWD, etp_bytes, b.etp, etp_topo)
            + _coll("reduce_scatter", "moe.combine.etp_reducescatter", Phase.FWD, etp_bytes, b.etp, etp_topo)
            + _coll("all_to_all", "moe.combine", Phase.FWD, a2a, b.ep, ep_topo)
            + _coll("all_to_all", "moe.combine", Phase.BWD, a2a, b.ep, ep_topo)
            + _coll("all_gather", "moe.combine.etp_reducescatter", Phase.BWD, etp_bytes, b.etp, etp_topo)
            + _coll("reduce_scatter", "moe.dispatch.etp_allgather", Phase.BWD, etp_bytes, b.etp, etp_topo)
            + _coll("all_to_all", "moe.dispatch", Phase.BWD, a2a, b.ep, ep_topo))


def flex_backend(plan: ParallelPlan) -> str:
    """The flex dispatcher's backend: HybridEP inside an NVLink domain larger than :data:`BIG_DOMAIN` (NVL72), DeepEP
    elsewhere (the recipes of :func:`default_dispatcher`; costmodel.cost.moe_kernels charges their SMs alike)."""
    return "hybridep" if plan.domain > BIG_DOMAIN else "deepep"


def permute_operators(b: _Block, dispatcher: str, backend: str = "deepep") -> list[Op]:
    """Token permute / unpermute (moe_utils.py permute, unpermute), forward and backward, as each dispatcher of
    NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py (@d98e8a64) runs them:

    * ``alltoall``: permute of the T x k routed rows before the all-to-all and unpermute after the combine, and with
      E/EP > 1 the sort of the received chunks by local expert and back (sort_chunks_by_idxs);
    * ``allgather``: each rank permutes its experts' share of the gathered tokens;
    * ``flex``: DeepEP's dispatch kernel sends the unpermuted tokens (the permutation is fused into it, "fused
      permutation and AlltoAll"), then _DeepepManager.get_permuted_hidden_states_by_experts permutes the received
      rows once by expert and get_restored_hidden_states_by_experts unpermutes them before the combine: one permute
      and one unpermute of the received rows, no chunk sort. HybridEP's manager returns the dispatched rows as they
      are (its kernels order them by expert): no permute pass."""
    if dispatcher == "flex" and backend == "hybridep":
        return []
    flex = dispatcher == "flex"
    rows = b.received if dispatcher == "allgather" or flex else b.T * b.k
    ops: list[Op] = []
    for phase in (Phase.FWD, Phase.BWD):
        ops.append(_copy("moe.permute", phase, rows, b.h, b.eb))
        ops.append(_copy("moe.unpermute", phase, rows, b.h, b.eb))
        if b.e_local > 1 and dispatcher == "alltoall":
            ops.append(_copy("moe.sort_chunks", phase, b.received, b.h, b.eb))
            ops.append(_copy("moe.unsort_chunks", phase, b.received, b.h, b.eb))
    return ops


def expert_operators(model: ModelSpec, plan: ParallelPlan, b: _Block) -> list[Op]:
    """The local experts (experts.py): E/EP experts, each (h -> up_n -> h) split over ETP, at the busiest rank's
    rows per expert m_e = ceil(R / (E/EP) x imbalance) (:func:`routing_imbalance`); GroupedMLP runs one
    activation over the concatenated rows of all local experts, SequentialMLP one per expert."""
    m_e = max(1, math.ceil(b.received / b.e_local * routing_imbalance(model, plan)))
    n = float(b.e_local)
    ops = _gemm3("moe.expert.up", m_e, b.up_n, b.h, b.dtype, count=n)
    if plan.moe_grouped_gemm:
        ops.append(_act("moe.expert.act", Phase.FWD, m_e * b.e_local, b.up_n, b.f_e, b.gated, b.eb))
        ops.append(_act("moe.expert.act", Phase.BWD, m_e * b.e_local, b.up_n, b.f_e, b.gated, b.eb))
    else:
        ops.append(_act("moe.expert.act", Phase.FWD, m_e, b.up_n, b.f_e, b.gated, b.eb, count=n))
        ops.append(_act("moe.expert.act", Phase.BWD, m_e, b.up_n, b.f_e, b.gated, b.eb, count=n))
    return ops + _gemm3("moe.expert.down", m_e, b.h, b.f_e, b.dtype, count=n)


def shared_expert_operators(model: ModelSpec, plan: ParallelPlan, b: _Block) -> list[Op]:
    """Shared experts (shared_experts.py SharedExpertMLP): a dense MLP of width ``model.shared_ffn`` on every
    local token, column/row tensor-parallel like the dense MLP; [] without shared experts."""
    if not model.shared_ffn:
        return []
    t = plan.tp
    fs = -(-model.shared_ffn // t)
    fs_up = fs * (2 if b.gated else 1)
    act = b.tokens * b.h * b.eb
    tp_topo = group_topology(t, 1, b.domain)
    return (tp_boundary("moe_shared_up", True, plan, act, tp_topo)
            + _gemm3("moe.shared.up", b.tokens, fs_up, b.h, b.dtype)
            + [_act("moe.shared.act", Phase.FWD, b.tokens, fs_up, fs, b.gated, b.eb),
               _act("moe.shared.act", Phase.BWD, b.tokens, fs_up, fs, b.gated, b.eb)]
            + _gemm3("moe.shared.down", b.tokens, b.h, fs, b.dtype)
            + tp_boundary("moe_shared_down", False, plan, act, tp_topo))


def overlapped_comm(plan: ParallelPlan, comm: list[Op]) -> list[Op]:
    """The EP collectives that run under another micro-batch's compute (--overlap-moe-expert-parallel-comm):
    ``comm``, plus with full recompute (and Megatron-Core's "moe" module recompute, costmodel.graph.selective [MOE])
    the forward dispatch/combine run again during the backward pass."""
    overlap = list(comm)
    if plan.recompute == "full" or (plan.recompute == "selective" and "moe" in plan.recompute_modules):
        overlap += [Op(o.kind, o.name + ".recompute", Phase.BWD, o.features, o.flops, o.bytes, o.dtype, o.count,
                       o.category) for o in comm if o.phase is Phase.FWD]
    return overlap


def moe_block_operators(model: ModelSpec, plan: ParallelPlan) -> tuple[list[Op], list[Op]]:
    """(operators, overlapped EP communication) of one MoE layer's MLP part, one micro-batch, one GPU.

    Forward order: router GEMM (T, E, h); scoring + top-k over T x E (:func:`router_operators`); permute of the
    T x k routed token copies (the all-to-all dispatcher's; the flex dispatcher's in :func:`permute_operators`);
    dispatch (:func:`alltoall_dispatch` / :func:`allgather_dispatch`); the local experts' chunk sort (E/EP > 1;
    :func:`permute_operators`); the expert GEMMs (:func:`expert_operators`); the mirror image back (chunk sort,
    ETP reduce-scatter, combine, unpermute). Backward runs the mirror of each step (combine-grad, then
    dispatch-grad). Shared experts: :func:`shared_expert_operators`.

    Experts per rank: E/EP, each split over ETP. Tokens received per rank R = T x k (x ETP with ETP > 1); one GEMM
    per local expert (count E/EP, the shape --moe-grouped-gemm also runs; costmodel.cost.moe_kernels rescales the
    ``moe.expert.*`` operators of grouped GEMMs).

    EP communication has category EP_COMM: in the operators, or, with ``plan.moe_overlap_comm``
    (--overlap-moe-expert-parallel-comm: one micro-batch's all-to-all runs under another's compute), in the
    overlapped list (:func:`overlapped_comm`), where only the part longer than the layer's compute is exposed
    (as the CP ring).
    """
    b = _block(model, plan)
    allgather = plan.moe_dispatcher == "allgather"
    comm = allgather_dispatch(b) if allgather else alltoall_dispatch(model, plan, b)
    ops = (router_operators(b) + permute_operators(b, plan.moe_dispatcher, flex_backend(plan))
           + expert_operators(model, plan, b)
           + shared_expert_operators(model, plan, b))
    if not plan.moe_overlap_comm:
        return ops + comm, []
    f = unpaired_fraction(plan)
    exposed = [replace(o, count=o.count * f) for o in comm] if f > 0 else []
    paired = [replace(o, count=o.count * (1.0 - f)) for o in comm] if f > 0 else comm
    return ops + exposed + sm_share_operators(plan), overlapped_comm(plan, paired)


def unpaired_fraction(plan: ParallelPlan) -> float:
    """Share of a rank's model-chunk forwards (and, mirrored, backwards) that --overlap-moe-expert-parallel-comm
    cannot pair with another micro-batch's backward, so their EP dispatch/combine stays exposed: the warm-up
    forwards and cool-down backwards of the schedule. NVIDIA/Megatron-LM megatron/core/pipeline_parallel/
    schedules.py @d98e8a64 get_pp_rank_microbatches: interleaved, (PP - r - 1) x 2 + (VPP - 1) x group + 1 warm-up
    chunks on PP rank r ("one extra micro-batch forward step before the 1f1b stages" with the overlap; group =
    ``microbatch_group_size_per_vp_stage``, default PP), of m x VPP; averaged over the ranks: PP - 1 + (VPP - 1) x
    group + 1 (without interleaving PP - r - 1, mean (PP - 1) / 2). Without pipelining
    (combined_1f1b_schedule_for_no_pipelining) the first forward and the last backward run alone: 1 of m. Capped at 1
    (every chunk in warm-up)."""
    m = max(plan.num_microbatches, 1)
    if plan.pp <= 1:
        return min(1.0, 1.0 / m)
    group = plan.vpp_microbatch_group or plan.pp
    warmup = plan.pp - 1 + (plan.vpp - 1) * group + 1 if plan.vpp > 1 else (plan.pp - 1) / 2
    return min(1.0, warmup / (m * plan.vpp))


SM_SHARE = "moe.overlap_sm_share"
"""Name of the placeholder operators (forward, backward) whose times costmodel.cost.moe_kernels sets to the compute the
overlapped flex dispatcher's kernels take from a layer (:func:`sm_share_operators`)."""


def sm_share_operators(plan: ParallelPlan) -> list[Op]:
    """With the flex dispatcher overlapped (--overlap-moe-expert-parallel-comm), its DeepEP / HybridEP kernels hold
    a fixed number of SMs while they run, which the compute they overlap loses: one placeholder per phase (zero
    bytes; a key no other operator has), costed by :func:`costmodel.cost.moe_kernels.apply` as that SM share of the
    phase's overlapped EP communication. [] otherwise (NCCL's all-to-all SMs are not charged)."""
    if plan.moe_dispatcher != "flex":
        return []
    return [Op("residual_add", SM_SHARE, phase, (0,), flops=0.0, bytes=0.0, dtype=plan.dtype,
               category=Category.COMPUTE) for phase in (Phase.FWD, Phase.BWD)]


def expert_params_per_gpu(model: ModelSpec, plan: ParallelPlan, moe_layers: int) -> float:
    """Routed-expert weights one GPU holds for ``moe_layers`` MoE layers: E/EP experts per layer, each / ETP."""
    return moe_layers * (model.num_experts // plan.ep) * model.expert_params() / plan.expert_tp


# ------------------------------------------------------------------------------------------ dispatcher default
AUTO_DISPATCHER = "auto"
"""Request value of the token dispatcher that :func:`default_dispatcher` resolves from the framework and the EP
group's placement."""

DISPATCHER_NOTE_KEY = "moe_dispatcher_default"
"""``ParallelPlan.extra`` key holding why the dispatcher was chosen when the request left it to the default."""

BIG_DOMAIN = 8
"""GPUs of an HGX/DGX node's NVLink domain (8 GPUs: H100, H200, B200 data sheets); larger domains are multi-node
NVLink racks (GB200 / GB300 NVL72), where the recipes run HybridEP even inside the domain."""


def default_dispatcher(framework: str, ep: int, etp: int, domain: int) -> tuple[str, str]:
    """(token dispatcher, why) a framework's published recipes use for an EP group of ``ep`` ranks ``etp`` apart on
    NVLink domains of ``domain`` GPUs.

    Megatron-Core / NeMo / Megatron-Bridge (framework ``megatron``): the EP group spans several NVLink domains ->
    ``flex`` (DeepEP, or HybridEP): NVIDIA-NeMo/Megatron-Bridge @067f987d src/megatron/bridge/recipes/deepseek/
    h100/deepseek_v3.py (1,024 H100, EP64: moe_flex_dispatcher_backend "hybridep"), perf_recipes/deepseek/b200/
    deepseek_v3.py (EP32 over 4 nodes: "deepep"); NVIDIA/NeMo @8cfedd72 scripts/performance/llm/
    pretrain_deepseek_v3.py (H100: "flex" with moe_enable_deepep); yanring/Megatron-MoE-ModelZoo Qwen3-235B H100
    EP32 tables (DeepEP). Inside one domain larger than :data:`BIG_DOMAIN` (NVL72) -> ``flex`` (HybridEP): every
    GB200 / GB300 Qwen3 and DeepSeek-V3 perf recipe of Megatron-Bridge @067f987d (perf_recipes/qwen/gb200/
    qwen3_moe.py, perf_recipes/deepseek/common.py: moe_flex_dispatcher_backend "hybridep"). Inside an 8-GPU node ->
    ``alltoall``: Megatron-Bridge @067f987d perf_recipes/qwen/b200/qwen3_moe.py (Qwen3-235B EP8 bf16 / fp8cs:
    moe_token_dispatcher_type "alltoall"), NeMo's MixtralConfig (moe_token_dispatcher_type "alltoall").
    Exceptions exist (Megatron-Bridge's Qwen3-235B H100 EP32 bf16 recipe keeps "alltoall"); state the dispatcher
    to override. Other stacks (torchtitan, PyTorch FSDP) -> ``alltoall``: torchtitan @b5bcd76c
    models/common/moe.py LocalTokenDispatcher (all_to_all_single); DeepEP / HybridEP only through overrides."""
    domains = group_topology(ep, etp, domain)[0]
    if framework != "megatron":
        return "alltoall", f"{framework}'s token dispatcher is an all-to-all (torchtitan LocalTokenDispatcher)"
    if domains > 1:
        return "flex", (f"EP={ep} spans {domains} NVLink domains of {domain} GPUs: Megatron-Core recipes run the "
                        "flex dispatcher (DeepEP / HybridEP) across domains")
    if domain > BIG_DOMAIN:
        return "flex", (f"EP={ep} inside one {domain}-GPU NVLink domain (multi-node NVLink): Megatron-Core GB200 / "
                        "GB300 recipes run the flex dispatcher (HybridEP)")
    return "alltoall", (f"EP={ep} inside one {domain}-GPU NVLink domain: Megatron-Core recipes run the all-to-all "
                        "dispatcher there")


def with_default_dispatcher(plan: ParallelPlan) -> ParallelPlan:
    """``plan`` with the token dispatcher of :func:`default_dispatcher` and its reason in ``extra`` (a plan built
    by the search, which does not choose a dispatcher); ``plan`` itself when it has no expert parallelism."""
    if plan.ep <= 1:
        return plan
    chosen, why = default_dispatcher(plan.framework, plan.ep, plan.expert_tp, plan.domain)
    return replace(plan, moe_dispatcher=chosen, extra={**plan.extra, DISPATCHER_NOTE_KEY: why})


def dispatcher_notes(plan: ParallelPlan) -> list[str]:
    """The note saying which token dispatcher a plan whose request left it to the default was given, and why."""
    why = plan.extra.get(DISPATCHER_NOTE_KEY) if isinstance(plan.extra, dict) else None
    if not why or plan.ep <= 1:
        return []
    return [f"MoE token dispatcher {plan.moe_dispatcher} assumed ({why}); state --moe-dispatcher to change it"]
