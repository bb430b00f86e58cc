"""The MoE operator graph (costmodel/graph/moe.py, costmodel/graph/build.py): expert GEMM shapes and FLOPs per rank,
dispatch and combine bytes and groups, routing imbalance and capacity, stages mixing dense and MoE layers, expert
gradient reduction over the expert data-parallel group, EP communication in the breakdown."""

import dataclasses
import math

import pytest

from costmodel.core.kinds import Category, Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.model import ModelSpec
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.build import build_graph, group_topology, layer_operators
from costmodel.graph.moe import flex_byte_factor, moe_block_operators, routing_imbalance, unpaired_fraction
from costmodel.memory.moe_routing import AUX_FREE_MAXVIO, AUX_LOSS_MAXVIO, MAXVIO_EXPERTS, expected_max_normal
from costmodel.schedule.compose import compose, cost_operators
from tests.helpers import plan

H, E, K, FE, SEQ, MBS = 512, 8, 2, 256, 1024, 2


def moe_model(**kw) -> ModelSpec:
    args = dict(name="tiny-moe", num_layers=8, hidden_size=H, num_heads=8, num_kv_heads=8, ffn_hidden_size=1024,
                vocab_size=1000, activation="swiglu", norm="rmsnorm", num_experts=E, experts_per_token=K,
                moe_ffn_hidden_size=FE, max_seq_len=SEQ)
    args.update(kw)
    return ModelSpec(**args)


def moe_plan(**kw):
    args = dict(gpus=8, gbs=16, seq=SEQ, mbs=MBS, ep=4, moe_imbalance=1.0)  # balanced unless asked
    args.update(kw)
    return plan(**args)


def _ops(ops, prefix):
    return [o for o in ops if o.name.startswith(prefix)]


def _fwd_expert_flops(ops):
    return sum(o.flops * o.count for o in ops if o.kind == "gemm" and o.name.startswith("moe.expert")
               and o.phase is Phase.FWD)


def test_expert_gemm_shapes_and_flops_per_rank():
    m, p = moe_model(), moe_plan(moe_imbalance=1.0)   # balanced routing
    p.validate(m)
    ops, overlap = moe_block_operators(m, p)
    assert overlap == []
    T = MBS * SEQ                      # TP 1: every local token is routed on this rank
    e_local = E // 4
    m_e = T * K // e_local             # balanced: received T*k rows over E/EP experts
    up = next(o for o in ops if o.name == "moe.expert.up")
    down = next(o for o in ops if o.name == "moe.expert.down")
    assert up.features == (m_e, 2 * FE, H) and up.count == e_local          # gated: gate + up
    assert down.features == (m_e, H, FE) and down.count == e_local
    assert next(o for o in ops if o.name == "moe.expert.up.dgrad").features == (m_e, H, 2 * FE)
    assert next(o for o in ops if o.name == "moe.expert.down.wgrad").features == (H, FE, m_e)
    # forward expert FLOPs per rank: 2 x (routed token copies) x h x (2 F_e + F_e)
    assert _fwd_expert_flops(ops) == 2 * T * K * H * 3 * FE
    router = next(o for o in ops if o.name == "moe.router")
    assert router.features == (T, E, H)


def test_etp_splits_experts_and_gathers_tokens_inside_the_etp_group():
    m = moe_model()
    p = moe_plan(tp=2, ep=2, sequence_parallel=True)       # ETP = TP = 2
    p.validate(m)
    ops, _ = moe_block_operators(m, p)
    T = MBS * SEQ // 2                                      # sequence-parallel shard
    received = T * K * 2                                    # x ETP after the ETP all-gather
    up = next(o for o in ops if o.name == "moe.expert.up")
    assert up.features == (received // (E // 2), 2 * FE // 2, H)
    assert _fwd_expert_flops(ops) == 2 * T * K * H * 3 * FE          # ETP: rows x2, width /2
    ag = next(o for o in ops if o.name == "moe.dispatch.etp_allgather" and o.phase is Phase.FWD)
    assert ag.kind == "all_gather" and ag.bytes == received * H * 2 and ag.features[1] == 2
    assert ag.features[2:] == group_topology(2, 1, 8)
    rs = next(o for o in ops if o.name == "moe.combine.etp_reducescatter" and o.phase is Phase.FWD)
    assert rs.kind == "reduce_scatter" and rs.bytes == ag.bytes


def test_alltoall_dispatch_and_combine_bytes_and_group():
    m, p = moe_model(), moe_plan(gpn=2)
    p.validate(m)
    ops, _ = moe_block_operators(m, p)
    a2a = [o for o in ops if o.kind == "all_to_all"]
    T = MBS * SEQ
    assert [(o.name, o.phase) for o in a2a] == [("moe.dispatch", Phase.FWD), ("moe.combine", Phase.FWD),
                                                ("moe.combine", Phase.BWD), ("moe.dispatch", Phase.BWD)]
    for o in a2a:
        assert o.bytes == T * K * H * 2                     # bf16 token copies per rank
        assert o.features == (T * K * H * 2, 4, 2, 2)       # EP=4 on 2-GPU NVLink domains: 2 domains x 2
        assert o.category is Category.EP_COMM
    # EP ranks are ETP apart (expert grid tp-ep-dp-pp): ETP=2 puts EP=2 on ranks 2 apart, in two 2-GPU domains
    p2 = moe_plan(gpn=2, tp=2, ep=2)
    p2.validate(m)
    a2a2 = [o for o in moe_block_operators(m, p2)[0] if o.kind == "all_to_all"]
    assert a2a2[0].features[1:] == (2, 2, 1)


def test_allgather_dispatcher_gathers_tokens_over_ep_x_etp():
    m, p = moe_model(), moe_plan(moe_dispatcher="allgather")
    p.validate(m)
    ops, _ = moe_block_operators(m, p)
    T = MBS * SEQ
    ag = next(o for o in ops if o.name == "moe.dispatch" and o.phase is Phase.FWD)
    assert ag.kind == "all_gather" and ag.bytes == T * 4 * H * 2 and ag.features[1] == 4
    rs = next(o for o in ops if o.name == "moe.combine" and o.phase is Phase.FWD)
    assert rs.kind == "reduce_scatter" and rs.bytes == ag.bytes
    assert not [o for o in ops if o.kind == "all_to_all"]
    # flex (DeepEP) inside one NVLink domain: one copy per destination EP rank, not per expert (E/EP = 2 experts
    # per rank: a token's 2 experts share a rank with probability 1/7)
    flex, _ = moe_block_operators(m, dataclasses.replace(p, moe_dispatcher="flex"))
    alltoall, _ = moe_block_operators(m, dataclasses.replace(p, moe_dispatcher="alltoall"))
    ranks_hit = 4 * (1 - math.comb(6, 2) / math.comb(8, 2))
    f2a = {o.key(): o for o in alltoall if o.kind == "all_to_all"}
    for o in (o for o in flex if o.kind == "all_to_all"):
        assert o.bytes == pytest.approx(next(a for a in f2a.values() if a.name == o.name).bytes * ranks_hit / 2)
    moved = ("moe.permute", "moe.unpermute", "moe.sort_chunks", "moe.unsort_chunks")
    assert ([o for o in flex if o.kind != "all_to_all" and o.name not in moved]
            == [o for o in alltoall if o.kind != "all_to_all" and o.name not in moved])


def test_flex_dispatcher_permutes_received_rows_once():
    """Megatron-Core token_dispatcher.py @d98e8a64: the all-to-all dispatcher permutes the T x k routed rows and sorts
    the received chunks by local expert (and back); DeepEP's dispatch kernel fuses the first permutation, then
    _DeepepManager permutes the received rows once by expert (and back); HybridEP's manager does no permute pass."""
    m, p = moe_model(), moe_plan(moe_dispatcher="alltoall")
    p.validate(m)
    T, k = MBS * SEQ, 2

    def passes(plan):
        ops, _ = moe_block_operators(m, plan)
        return sorted((o.name, o.phase.value, o.bytes) for o in ops
                      if o.name in ("moe.permute", "moe.unpermute", "moe.sort_chunks", "moe.unsort_chunks"))

    a2a = passes(p)
    assert len(a2a) == 8 and {n for n, _, _ in a2a} == {"moe.permute", "moe.unpermute", "moe.sort_chunks",
                                                          "moe.unsort_chunks"}
    deepep = passes(dataclasses.replace(p, moe_dispatcher="flex"))
    received = next(b for n, _, b in a2a if n == "moe.sort_chunks")  # the received rows' bytes (ETP 1)
    assert [n for n, _, _ in deepep] == ["moe.permute", "moe.permute", "moe.unpermute", "moe.unpermute"]
    assert all(b == received for _, _, b in deepep) and received == T * k * H * 2 * 2
    hybridep = dataclasses.replace(p, moe_dispatcher="flex", nvlink_domain=72)
    assert passes(hybridep) == []


def test_round_robin_routing_reaches_one_rank_per_token_when_aligned():
    """NeMo AutoModel's fake balanced gate sends token t to experts t k ... t k + k - 1: with k dividing the
    experts per rank every token's copies land on one rank (DeepSeek-V3 EP64: 4 experts per rank, k 8 -> 2
    ranks, one node); flex then moves 1/k (2/k) of the all-to-all's bytes."""
    from costmodel.graph.moe import round_robin_parts
    assert round_robin_parts(128, 8, 8) == 1.0            # Qwen3-30B EP8: 16 experts per rank
    assert round_robin_parts(256, 8, 64) == 2.0           # DeepSeek-V3 EP64: 4 per rank
    assert round_robin_parts(256, 8, 8) == 1.0            # ... and its 8 nodes of 32 experts
    assert round_robin_parts(12, 8, 4) == pytest.approx((3 + 3 + 4) / 3)   # unaligned: starts 0, 8, 4
    ds = moe_model(num_experts=256, experts_per_token=8)
    assert flex_byte_factor(ds, 8, 64, "round_robin") == pytest.approx(1 / 8)
    assert flex_byte_factor(ds, 1, 64, "round_robin") == pytest.approx(2 / 8)
    assert flex_byte_factor(ds, 1, 64, "random") == pytest.approx(64 * (1 - math.comb(252, 8) / math.comb(256, 8)) / 8)
    # the benchmark routers are balanced unless an imbalance is stated
    assert routing_imbalance(ds, moe_plan(ep=8, moe_imbalance=None, moe_routing="round_robin")) == 1.0
    assert routing_imbalance(ds, moe_plan(ep=8, moe_imbalance=None, moe_routing="random")) == 1.0


def test_flex_deduplicates_tokens_per_destination_domain():
    """Across NVLink domains DeepEP sends a token once per remote domain holding >= 1 of its k experts: bytes x
    N hit / k, hit = 1 - C(E - E/N, k) / C(E, k); the ETP collectives, compute and alltoall stay as they were."""
    m = moe_model(num_experts=16, experts_per_token=4)
    p = moe_plan(gpus=16, gbs=32, gpn=4, ep=16, moe_imbalance=1.0)     # EP16 over 4 domains of 4 GPUs
    p.validate(m)
    a2a, _ = moe_block_operators(m, p)
    flex, _ = moe_block_operators(m, dataclasses.replace(p, moe_dispatcher="flex"))
    hit = 1 - math.comb(12, 4) / math.comb(16, 4)                       # a given domain holds >= 1 of the 4
    assert flex_byte_factor(m, 4) == pytest.approx(4 * hit / 4) and 0 < 4 * hit / 4 < 1
    pairs = list(zip(a2a, flex))
    assert all(a.name == f.name for a, f in pairs) and len(a2a) == len(flex)
    moved = [(a, f) for a, f in pairs if a != f]
    assert moved and all(a.kind == f.kind == "all_to_all" for a, f in moved)
    assert all(f.bytes == pytest.approx(a.bytes * 4 * hit / 4) for a, f in moved)
    assert flex_byte_factor(m, 1) == 1.0
    # group-limited routing (DeepSeek-V3 config.json: 8 groups, 4 per token) over 8 domains, one group each:
    # a token reaches at most 4 domains, so fewer bytes than ungrouped routing
    ds = moe_model(num_experts=256, experts_per_token=8, extra={"n_group": 8, "topk_group": 4})
    plain = moe_model(num_experts=256, experts_per_token=8)
    assert flex_byte_factor(ds, 8) < flex_byte_factor(plain, 8)
    assert 8 * flex_byte_factor(ds, 8) <= 4 + 1e-9    # k x factor = expected domains hit <= topk_group


def test_imbalance_default_override_and_capacity():
    m = moe_model()
    base = _fwd_expert_flops(moe_block_operators(m, moe_plan(moe_imbalance=1.0))[0])
    assert routing_imbalance(m, moe_plan(moe_imbalance=1.0)) == 1.0
    # EP = E: the busiest rank holds the busiest expert alone
    assert routing_imbalance(m, moe_plan(ep=8, moe_imbalance=1.5)) == 1.5
    per8 = expected_max_normal(8) / expected_max_normal(MAXVIO_EXPERTS)   # the 64-expert MaxVio over 8 experts
    assert routing_imbalance(m, moe_plan(ep=8, moe_imbalance=None)) == pytest.approx(1 + AUX_LOSS_MAXVIO * per8)
    assert 0.30 < AUX_LOSS_MAXVIO * per8 < 0.32
    # EP = 4 (2 experts per rank): independent expert loads, rank = sum of 2, busiest of 4 ranks
    r = 1 + 0.5 * expected_max_normal(4) / (expected_max_normal(8) * math.sqrt(2))
    assert routing_imbalance(m, moe_plan(moe_imbalance=1.5)) == pytest.approx(r) and 1 < r < 1.5
    skew = _fwd_expert_flops(moe_block_operators(m, moe_plan(moe_imbalance=1.5))[0])
    assert skew == pytest.approx(r * base, rel=1e-3)
    capped = moe_model(capacity_factor=1.25)
    assert routing_imbalance(capped, moe_plan(ep=8, moe_imbalance=1.5)) == 1.25
    m_e = next(o for o in moe_block_operators(capped, moe_plan(ep=8, moe_imbalance=1.5))[0]
               if o.name == "moe.expert.up")
    assert m_e.features[0] == math.ceil(MBS * SEQ * K / 1 * 1.25)


def test_default_imbalance_follows_the_router_and_the_ep_split():
    """Default: Wang et al. 2024 Table 2 MaxVio_global per expert (aux-loss 0.52, aux-loss-free 0.04 for
    DeepSeek-V3's noaux_tc router, over 64 experts; for E experts x e(E) / e(64)), taken to the busiest rank; no
    imbalance without EP."""
    assert expected_max_normal(1) == 0.0 and expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi))
    m = moe_model()
    free = moe_model(extra={"topk_method": "noaux_tc"})
    per8 = expected_max_normal(8) / expected_max_normal(MAXVIO_EXPERTS)
    assert routing_imbalance(free, moe_plan(ep=8, moe_imbalance=None)) == pytest.approx(1 + AUX_FREE_MAXVIO * per8)
    big = moe_model(num_experts=64, experts_per_token=2)
    assert routing_imbalance(big, moe_plan(ep=64, gpus=64, gbs=128, moe_imbalance=None)) == \
        pytest.approx(1 + AUX_LOSS_MAXVIO)  # the published model's expert count: the published figure
    assert routing_imbalance(m, moe_plan(gpus=2, gbs=4, ep=1, moe_imbalance=None)) == 1.0
    ranks = [routing_imbalance(m, moe_plan(ep=ep, moe_imbalance=None)) for ep in (2, 4, 8)]
    assert 1.0 < ranks[0] < ranks[1] < ranks[2]


def test_overlap_moves_ep_comm_to_the_overlapped_list():
    m = moe_model()
    p = moe_plan(moe_overlap_comm=True, gbs=64)  # DP 8 x MBS 2: 4 micro-batches, PP 1
    ops, overlap = moe_block_operators(m, p)
    assert {o.name for o in overlap} == {"moe.dispatch", "moe.combine"}
    # without pipelining the first forward and the last backward have no partner: 1 of 4 stays exposed
    assert unpaired_fraction(p) == 0.25
    exposed = [o for o in ops if o.category is Category.EP_COMM]
    assert [o.key() for o in exposed] == [o.key() for o in overlap]
    assert all(o.count == 0.25 for o in exposed) and all(o.count == 0.75 for o in overlap)
    # one micro-batch: nothing to pair with, all of it exposed
    ops1, overlap1 = moe_block_operators(m, moe_plan(moe_overlap_comm=True))
    assert all(o.count == 1.0 for o in ops1 if o.category is Category.EP_COMM)
    assert all(o.count == 0.0 for o in overlap1)
    # full recompute re-runs the forward dispatch/combine in backward
    _, rec = moe_block_operators(m, moe_plan(moe_overlap_comm=True, recompute="full", gbs=64))
    assert len(rec) == len(overlap) + 2 and all(o.phase is Phase.BWD for o in rec[len(overlap):])


def test_unpaired_fraction_follows_megatron_warmup():
    """schedules.py @d98e8a64: interleaved warm-up (PP - r - 1) x 2 + (VPP - 1) x group + 1 chunks on rank r (mean
    PP - 1 + (VPP - 1) x group + 1) of M x VPP; e.g. PP 8, VPP 4, M 128 (the ModelZoo's Qwen3-235B H100 overlap
    run): 32 of 512."""
    m = moe_model(num_layers=32)
    p = moe_plan(gpus=64, pp=8, vpp=4, gbs=1024, mbs=1, ep=8, moe_overlap_comm=True)  # DP 8: M = 128
    p.validate(m)
    assert p.num_microbatches == 128 and unpaired_fraction(p) == 32 / 512
    few = moe_plan(gpus=64, pp=8, vpp=4, gbs=64, mbs=1, ep=8, moe_overlap_comm=True)  # M = 8: all in warm-up
    assert unpaired_fraction(few) == 1.0
    plain = moe_plan(gpus=64, pp=8, gbs=1024, mbs=1, ep=8, moe_overlap_comm=True)  # no interleaving: (PP - 1) / 2
    assert unpaired_fraction(plain) == 3.5 / 128


def test_shared_experts_are_a_tp_sharded_mlp():
    m = moe_model(num_shared_experts=2, shared_expert_ffn_hidden_size=384)
    p = moe_plan(tp=2, ep=2)
    p.validate(m)
    ops, _ = moe_block_operators(m, p)
    up = next(o for o in ops if o.name == "moe.shared.up")
    assert up.features == (MBS * SEQ, 2 * 768 // 2, H)          # all b*s tokens inside the TP region
    assert {o.kind for o in ops if o.name.startswith("tp.moe_shared")} == {"all_gather", "reduce_scatter"}
    assert not _ops(moe_block_operators(moe_model(), p)[0], "moe.shared")


def test_layer_operators_moe_variant_replaces_the_mlp():
    m, p = moe_model(), moe_plan(recompute="full")
    dense, _ = layer_operators(m, p)
    moe, _ = layer_operators(m, p, moe=True)
    assert _ops(dense, "mlp_up") and not _ops(moe, "mlp_up")
    assert _ops(moe, "moe.expert.up") and not _ops(dense, "moe.")
    rec = [o for o in moe if o.phase is Phase.RECOMPUTE]
    assert [o.name for o in rec] == [o.name for o in moe if o.phase is Phase.FWD]


def _layer_sum(ops, attr="flops"):
    return sum(getattr(o, attr) * o.count for o in ops)


def test_stages_mixing_dense_and_moe_layers_sum_exactly():
    m = moe_model(first_dense_layers=3)                          # DeepSeek-like: layers 0-2 dense
    p = moe_plan(pp=2, ep=4)
    p.validate(m)
    g = build_graph(m, p)
    dense, _ = layer_operators(m, p)
    moe, _ = layer_operators(m, p, moe=True)
    idx = p.stage_layer_indices(m.num_layers)
    for st, layers in zip(g.stages, idx):
        n_moe = sum(m.is_moe_layer(i) for i in layers)
        expect = (len(layers) - n_moe) * _layer_sum(dense) + n_moe * _layer_sum(moe)
        assert st.layers * _layer_sum(st.layer_ops) == pytest.approx(expect, rel=1e-12)
        assert st.params == sum(m.layer_params(i) for i in layers) + (m.embedding_params() if st.index == 0 else 0) \
            + (m.head_params() if st.index == p.pp - 1 else 0)
        assert st.signature[-1] == tuple(sorted({(True, 0): n_moe, (False, 0): len(layers) - n_moe}.items()
                                                 if n_moe < len(layers) else {(True, 0): n_moe}.items()))
    assert g.stages[0].signature != g.stages[1].signature       # 3 dense + 1 MoE vs 4 MoE
    # moe_layer_freq 2: every other layer MoE
    m2 = moe_model(moe_layer_freq=2)
    g2 = build_graph(m2, moe_plan(pp=1))
    assert g2.stages[0].layers * _layer_sum(g2.stages[0].layer_ops) == \
        pytest.approx(4 * _layer_sum(dense) + 4 * _layer_sum(moe), rel=1e-12)


def test_expert_gradients_reduce_over_expert_dp():
    m = moe_model()
    p = moe_plan(gpus=16, gbs=32, tp=2, ep=2, zero=1)             # DP 8, expert DP = 16 / (2*2*1) = 4
    p.validate(m)
    g = build_graph(m, p)
    it = {o.name: o for o in g.stages[0].iteration_ops}
    expert_gpu = m.num_layers * (E // 2) * m.expert_params() / 2
    rs = it["dp.expert.grad_reducescatter"]
    assert rs.features[1] == p.expert_dp == 4
    assert rs.features[2:] == group_topology(4, 2 * 2, 8)
    assert rs.bytes == expert_gpu * 4                             # fp32 main gradients
    router = m.num_layers * H * E                                 # replicated over TP (router.py), reduced whole
    non_expert = (g.stages[0].params - m.num_layers * E * m.expert_params()) / 2 + router - router / 2
    assert it["dp.grad_reducescatter"].bytes == non_expert * 4 and it["dp.grad_reducescatter"].features[1] == 8
    # with SP each TP rank's router gradient covers its sequence shard: all-reduced over TP once per iteration
    ar = it["tp.replicated_grad_allreduce"]
    assert ar.bytes == router * 4 and ar.features[1] == 2
    assert it["optimizer.adam"].features == (round(non_expert / 8 + expert_gpu / 4),)
    assert g.stages[0].expert_params == m.num_layers * E * m.expert_params()


def test_zero3_gathers_expert_weights_over_expert_dp():
    m = moe_model()
    p = moe_plan(gpus=16, gbs=32, ep=4, zero=3)                   # DP 16, expert DP 4
    p.validate(m)
    _, overlap = layer_operators(m, p, moe=True)
    gathers = {o.name: o for o in overlap if o.phase is Phase.FWD and o.kind == "all_gather"}
    assert gathers["zero3.expert.param_allgather"].features[1] == 4
    assert gathers["zero3.expert.param_allgather"].bytes == (E // 4) * m.expert_params() * 2
    assert gathers["zero3.param_allgather"].features[1] == 16


def test_breakdown_shows_moe_rows_and_ep_comm():
    hw = load_catalogue().resolve("h100-sxm")
    m = moe_model()
    for overlap in (False, True):
        p = moe_plan(gpus=16, gbs=32, gpn=8, ep=8, moe_overlap_comm=overlap)
        p.validate(m)
        g = build_graph(m, p)
        times = cost_operators(g, hw, RooflineCostModel())
        comp = compose(m, p, hw, g, times.time_s)
        names = {r.operator for r in comp.breakdown.rows}
        assert "ep" in comp.breakdown.exposed_comm_s
        if not overlap:
            assert {"moe.router", "moe.dispatch", "moe.expert.up", "moe.combine"} <= names
            ep_rows = sum(r.time_s for r in comp.breakdown.rows if r.category is Category.EP_COMM)
            assert ep_rows > 0 and comp.breakdown.exposed_comm_s["ep"] > 0
        else:  # one micro-batch per step: no other micro-batch to overlap with, all of it exposed
            assert "moe.dispatch" in names and "moe.expert.up" in names
    dense = moe_model(num_experts=0, experts_per_token=0)
    p = plan(gpus=16, gbs=32)
    g = build_graph(dense, p)
    comp = compose(dense, p, hw, g, cost_operators(g, hw, RooflineCostModel()).time_s)
    assert "ep" not in comp.breakdown.exposed_comm_s
