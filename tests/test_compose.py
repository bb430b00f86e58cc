"""The composition's typed steps (costmodel.schedule.compose): stage times -> pipeline -> tail -> breakdown ->
metrics."""

import dataclasses

import pytest

from costmodel.core.kinds import COLLECTIVE_KINDS, Category, CostSource, Phase, describe_cost_sources
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.measured import FUSED_METHOD, MeasuredCostModel
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.build import build_graph
from costmodel.schedule.compose import (
    OperatorTimes,
    bucket_fraction,
    compose,
    compose_iteration_time,
    cost_operators,
    dp_overlap_window,
    stage_times,
)
from costmodel.schedule.timeline import pipeline_time
from planner.calibrate import identity
from planner.prediction import predict
from tests.helpers import llama, plan

ROOF = RooflineCostModel()


@pytest.fixture(scope="module")
def a100():
    return load_catalogue().resolve("a100-80gb")


def _all_ops(graph):
    ops = [o for st in graph.stages for lst in (st.layer_ops, st.stage_ops, st.iteration_ops, st.layer_overlap_ops)
           for o in lst]
    return ops + ([graph.p2p] if graph.p2p is not None else [])


def _deep_pipeline():
    """Few micro-batches on 8 stages and a large vocabulary: the last stage (LM head) is the slowest,
    and the bubble dominates."""
    m = llama(layers=32, vocab=128000)
    return m, plan(gpus=8, gbs=2, seq=2048, pp=8).validate(m)


def _composed(model, p, hw, cost_model=ROOF, calibration=None):
    graph = build_graph(model, p)
    times = cost_operators(graph, hw, cost_model)
    return graph, times, compose(model, p, hw, graph, times.time_s, calibration)


def test_bubble_is_the_pipeline_results_and_the_pipeline_is_the_timelines(a100):
    model, p = _deep_pipeline()
    graph, times, comp = _composed(model, p, a100)
    st = comp.stages
    assert comp.pipeline == pipeline_time(list(st.fwd_s), list(st.bwd_s), p.num_microbatches, p.vpp, st.p2p_s)
    assert comp.pipeline.bubble_s > 0
    assert comp.breakdown.bubble_s == comp.pipeline.bubble_s
    (bubble,) = [r for r in comp.breakdown.rows if r.category is Category.PIPELINE_BUBBLE]
    # rows are rescaled by one factor: the bubble row relates to the LM head's forward GEMM as the raw seconds do
    (head,) = [o for o in graph.stages[-1].stage_ops if o.name == "lm_head" and o.phase is Phase.FWD]
    (head_row,) = [r for r in comp.breakdown.rows if r.operator == "lm_head" and r.phase == "fwd"]
    head_s = times.time_s[head.key()] * head.count * p.num_microbatches
    assert bubble.time_s / head_row.time_s == pytest.approx(comp.pipeline.bubble_s / head_s, rel=1e-12)
    assert comp.bubble_fraction == comp.pipeline.bubble_s / comp.iteration_time_s
    assert comp.breakdown.bottleneck() == "pipeline bubble"


def test_critical_stage_is_the_one_with_the_largest_stage_time(a100):
    model, p = _deep_pipeline()
    graph, times, comp = _composed(model, p, a100)
    totals = [f + b for f, b in zip(comp.stages.fwd_s, comp.stages.bwd_s)]
    crit = totals.index(max(totals))
    assert crit == p.pp - 1  # the LM head stage
    assert comp.breakdown.stage == comp.pipeline.steady_stage == crit
    names = {r.operator for r in comp.breakdown.rows}
    assert "lm_head" in names and "embedding" not in names  # rows are the critical stage's operators
    # the tail is another notion, the stage whose tail ends last: here stage 0 (its backward ends last)
    finish = [s.finish_s for s in comp.tail.stages]
    assert comp.tail.ending_stage == finish.index(max(finish)) == 0


def test_stage_times_sum_the_graphs_operators(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    graph = build_graph(m, p)
    times = cost_operators(graph, a100, ROOF).time_s
    st = stage_times(graph, times, a100)
    for i, stage in enumerate(graph.stages):
        def per(ops, phases):
            return sum(times[o.key()] * o.count for o in ops if o.phase in phases)
        fwd = stage.layers * per(stage.layer_ops, ("fwd",)) + per(stage.stage_ops, ("fwd",))
        bwd = stage.layers * per(stage.layer_ops, ("bwd", "recompute")) + per(stage.stage_ops, ("bwd", "recompute"))
        assert st.fwd_s[i] == pytest.approx(fwd, rel=1e-12) and st.bwd_s[i] == pytest.approx(bwd, rel=1e-12)
    assert st.fwd_s[0] != st.fwd_s[1]  # embedding vs LM head: different stages


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, sp=True), dict(tp=2, cp=2, recompute="full"), dict(zero=3),
                                dict(zero=1, pp=4), dict(tp=4, pp=2, sp=False)])
def test_graph_sets_category_and_phase_enums_on_every_operator(kw):
    kw = dict(kw)
    sp = kw.pop("sp", None)
    m = llama(layers=8)
    extra = {} if sp is None else {"sequence_parallel": sp}
    p = plan(gpus=32, gbs=64, seq=2048, **kw, **extra).validate(m)
    ops = _all_ops(build_graph(m, p))
    assert ops
    for o in ops:
        assert type(o.phase) is Phase and type(o.category) is Category, o
        if o.kind == "optimizer":
            assert o.category is Category.OPTIMIZER
        elif o.kind in COLLECTIVE_KINDS:
            assert o.category not in (Category.COMPUTE, Category.OPTIMIZER), o
        else:
            assert o.category is Category.COMPUTE, o
        assert (o.category is Category.TP_COMM) == o.name.startswith("tp."), o


def test_op_converts_and_checks_its_phase():
    from costmodel.graph.ops import Op

    assert Op("gemm", "g", "bwd", (1, 2, 3)).phase is Phase.BWD
    with pytest.raises(ValueError):
        Op("gemm", "g", "backward", (1, 2, 3))


def test_cost_sources_add_up_and_roofline_reports_all_roofline(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    graph = build_graph(m, p)
    n = len({o.key() for o in _all_ops(graph)})
    roof = cost_operators(graph, a100, ROOF)
    assert len(roof.time_s) == n and roof.source_counts() == {"roofline": n}
    measured = cost_operators(graph, a100, MeasuredCostModel(fallback=ROOF))
    counts = measured.source_counts()
    assert sum(counts.values()) == n
    assert counts.get("measured", 0) > 0 and counts.get("roofline", 0) > 0  # a100 has some regressors, not all
    assert list(counts.values()) == sorted(counts.values(), reverse=True)
    res = MeasuredCostModel(fallback=ROOF).predict(list({o.key(): o for o in _all_ops(graph)}.values()), a100)
    for method, src in zip(res.method, res.source):
        if src is CostSource.MEASURED:
            assert method.startswith("xgboost:") and " x " not in method and "(as GEMM)" not in method
        elif src is CostSource.DERIVED:
            assert method == FUSED_METHOD or (  # element-wise: the fused kernels measured on H100
                method.startswith("xgboost:") and (" x " in method or "(as " in method))  # as GEMM / ring twin
        else:
            assert not method.startswith("xgboost:")


def test_prediction_carries_cost_sources_and_the_header_text(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    roof = predict(m, p, a100, ROOF)
    (n,) = roof.cost_sources.values()
    assert roof.cost_sources == {"roofline": n} and describe_cost_sources(roof.cost_sources) == f"roofline {n} ops"
    default = predict(m, p, a100)
    assert sum(default.cost_sources.values()) == n
    text = describe_cost_sources(default.cost_sources, default.cost_model)
    assert text.startswith(next(iter(default.cost_sources)) + " ") and " ops" in text
    assert describe_cost_sources({}, "measured") == "measured" and describe_cost_sources({}) == "n/a"


def test_iteration_time_alone_equals_the_full_composition_with_constants(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    cal = identity({"overlap_efficiency": 0.3, "iteration_overhead_s": 0.25})
    graph, times, comp = _composed(m, p, a100, calibration=cal)
    _, _, plain = _composed(m, p, a100)
    assert compose_iteration_time(p, a100, graph, times.time_s, cal) == comp.iteration_time_s
    assert comp.tail.overhead_s == 0.25 and comp.iteration_time_s == comp.tail.synchronised_s + 0.25
    assert comp.iteration_time_s > plain.iteration_time_s + 0.25 - 1e-12  # less DP overlap, plus the overhead
    assert sum(r.time_s for r in comp.breakdown.rows) == pytest.approx(comp.iteration_time_s)
    assert [r.category for r in comp.breakdown.rows if r.operator.startswith("framework_overhead")] == \
        [Category.FRAMEWORK]


def test_operator_times_interval_and_scaling():
    t = OperatorTimes({("a",): 1.0, ("b",): 2.0})
    assert not t.has_interval and t.scaled(lambda d: {k: 2 * v for k, v in d.items()}).time_s == {("a",): 2.0,
                                                                                                   ("b",): 4.0}
    band = OperatorTimes({("a",): 1.0}, {("a",): 0.5}, {("a",): 1.5})
    doubled = band.scaled(lambda d: {k: 2 * v for k, v in d.items()})
    assert band.has_interval and (doubled.low_s, doubled.high_s) == ({("a",): 1.0}, {("a",): 3.0})
    assert not dataclasses.replace(band, low_s={("a",): 1.0}, high_s={("a",): 1.0}).has_interval


def test_megatron_buckets_grow_with_data_parallelism_and_expose_the_reduction():
    # Megatron-Core DDP: bucket_size = max(40M, 1M x DP) parameters; a stage's last bucket is what backward
    # cannot hide (and its first the forward waits for). At DP 2048 a 1.3B-parameter model is one bucket.
    m = llama(layers=24, hidden=2048, heads=16, kv=16, ffn=5504)
    small = plan(gpus=8, gbs=64, seq=2048).validate(m)
    wide = plan(gpus=2048, gpn=4, gbs=2048, seq=2048).validate(m)
    st_small, st_wide = build_graph(m, small).stages[0], build_graph(m, wide).stages[0]
    assert bucket_fraction(small, st_small) == pytest.approx(40e6 / st_small.params)
    assert bucket_fraction(wide, st_wide) == 1.0
    titan = dataclasses.replace(small, framework="torchtitan", zero=1)  # other stacks: dp_bucket_mb megabytes
    assert bucket_fraction(titan, st_small) == pytest.approx(40e6 / (st_small.params * 4))
    hw = load_catalogue().resolve("gh200", "jupiter-booster", 4)
    graph, times, comp = _composed(m, wide, hw)
    t_grad = sum(times.time_s[o.key()] * o.count for o in graph.stages[0].iteration_ops if o.phase is Phase.DP_COMM)
    assert wide.overlap_grad_reduce and comp.tail.stages[0].grad_reduce_s == pytest.approx(t_grad)


def test_interleaved_megatron_hides_the_dp_reduction_under_the_later_chunks(a100):
    # Megatron's interleaved schedule reduces each model chunk's gradients after that chunk's last micro-batch
    # (schedules.py grad_sync_func per chunk): the last micro-batch group of PP micro-batches per chunk hides all
    # chunks but the last one's share; without interleaving one micro-batch's backward is the window
    m = llama(layers=16, hidden=8192, heads=64, kv=8, ffn=28672)
    flat = plan(gpus=64, gbs=64, seq=4096, tp=8, pp=4).validate(m)  # DP 2 across nodes
    inter = dataclasses.replace(flat, vpp=4).validate(m)
    assert dp_overlap_window(flat, 16, 1.0) == 1.0
    assert dp_overlap_window(inter, 16, 1.0) == pytest.approx((1 + 3 * 4) / 4)
    assert dp_overlap_window(inter, 2, 1.0) == pytest.approx((1 + 3 * 2) / 4)  # fewer micro-batches than PP
    titan = dataclasses.replace(inter, framework="torchtitan")
    assert dp_overlap_window(titan, 16, 1.0) == 1.0  # Megatron's schedule only
    _, _, c_flat = _composed(m, flat, a100)
    _, _, c_inter = _composed(m, inter, a100)
    grad_flat, grad_inter = c_flat.tail.stages[0].grad_reduce_s, c_inter.tail.stages[0].grad_reduce_s
    assert grad_flat > 0 and grad_inter < grad_flat


def test_tp_comm_overlap_hides_tp_collectives_under_the_layer_compute(a100):
    # Transformer Engine userbuffers (ParallelPlan.tp_comm_overlap, needs SP): the layer's TP all-gathers and
    # reduce-scatters move to the overlapped list and are exposed only beyond the layer's compute
    m = llama(layers=4, hidden=8192, heads=64, kv=8, ffn=28672)
    base = plan(gpus=8, gbs=8, seq=4096, tp=8).validate(m)
    over = dataclasses.replace(base, tp_comm_overlap=True)
    g0, g1 = build_graph(m, base), build_graph(m, over)
    tp0 = [o for o in g0.stages[0].layer_ops if o.category is Category.TP_COMM and o.phase in (Phase.FWD, Phase.BWD)]
    assert tp0 and not any(o.category is Category.TP_COMM and o.phase in (Phase.FWD, Phase.BWD)
                           for o in g1.stages[0].layer_ops)
    assert {o.key() for o in tp0} <= {o.key() for o in g1.stages[0].layer_overlap_ops}
    _, _, c0 = _composed(m, base, a100)
    _, _, c1 = _composed(m, over, a100)
    assert c1.iteration_time_s < c0.iteration_time_s
    assert c1.breakdown.exposed_comm_s["tp"] < c0.breakdown.exposed_comm_s["tp"]
    no_sp = dataclasses.replace(over, sequence_parallel=False)  # userbuffers need sequence parallelism
    assert build_graph(m, no_sp).stages[0].layer_overlap_ops == build_graph(m, dataclasses.replace(
        base, sequence_parallel=False)).stages[0].layer_overlap_ops


def test_cp_ring_hides_only_under_the_attention_kernels(a100):
    # ring attention sends the next KV chunk while the current chunk's attention kernel runs, inside the attention
    # call: the ring's time beyond the attention kernels is exposed even where the layer's GEMMs would cover it
    from costmodel.schedule.compose import ATTENTION_KINDS, layer_and_stage_times

    m = llama(layers=4, hidden=4096, heads=32, kv=8, ffn=14336)
    p = plan(gpus=8, gpn=4, gbs=4, seq=8192, cp=8, recompute="none", zero=0).validate(m)  # the ring crosses nodes
    graph = build_graph(m, p)
    times = cost_operators(graph, a100, ROOF).time_s
    st = graph.stages[0]
    ring = [o for o in st.layer_overlap_ops if o.category is Category.CP_COMM]
    ring_f = sum(times[o.key()] * o.count for o in ring if o.phase is Phase.FWD)
    attn_f = sum(times[o.key()] * o.count for o in st.layer_ops if o.kind in ATTENTION_KINDS and o.phase is Phase.FWD)
    layer_f = sum(times[o.key()] * o.count for o in st.layer_ops if o.phase is Phase.FWD)
    assert attn_f < ring_f < layer_f  # the case that tells the two windows apart
    lt = layer_and_stage_times(st, times, True)
    assert lt.exposed_fwd_s == pytest.approx(ring_f - attn_f)
    assert layer_and_stage_times(st, times, False).exposed_fwd_s == pytest.approx(ring_f)  # no overlap at all


def test_zero2_warns_that_its_reduce_scatter_is_costed_once_per_iteration(a100):
    """ZeRO-2 with several micro-batches: the prediction says the gradients are reduce-scattered once per
    iteration and bounds what Megatron-FSDP's per-micro-batch reduce-scatter would add, (M - 1) x that time."""
    model = llama()
    for zero, mbs, expect in ((2, 1, True), (1, 1, False), (2, 4, False)):
        p = plan(gpus=16, gpn=8, gbs=64, zero=zero, mbs=mbs)  # DP 16: 4 micro-batches at MBS 1, 1 at MBS 4
        graph, times, comp = _composed(model, p, a100)
        text = [w for w in comp.warnings if w.startswith("ZeRO-2:")]
        assert bool(text) is expect, (zero, mbs, comp.warnings)
        if expect:
            once = max(sum(times.time_s[o.key()] * o.count for o in st.iteration_ops
                           if o.kind == "reduce_scatter" and o.phase is Phase.DP_COMM) for st in graph.stages)
            assert once > 0
            assert f"up to {3 * once:.3g} s more" in text[0] and "4 micro-batches" in text[0]
