"""The HBM traffic of overlapped collectives (costmodel.graph.contention), the ZeRO-3 root unit (costmodel.graph.zero3)
and separate projection GEMMs (Framework.separate_projections)."""

import pytest

from costmodel.core.specs.framework import get_framework
from costmodel.graph.build import build_graph
from costmodel.graph.contention import HBM_PASS_PREFIX, NCCL_HBM_PASSES
from costmodel.graph.conventions import busbw_factor
from planner.prediction import predict
from planner.requests import PlanRequest


def _resolved(**kw):
    base = dict(model="llama3-8b", gpu="h100-sxm", gpus=16, gbs=16, seq_len=4096)
    base.update(kw)
    return PlanRequest(**base).resolve()


def _layer(res):
    st = build_graph(res.model, res.plan).stages[0]
    return st.layer_ops, st.layer_overlap_ops, st.stage_ops


def test_overlapped_collectives_charge_three_times_their_link_bytes_to_the_layer_per_phase():
    ops, overlap, _ = _layer(_resolved(zero=3, cp=2, gpus=32))
    assert {o.name for o in overlap} >= {"cp.kv_exchange", "zero3.param_allgather", "zero3.grad_reducescatter"}
    charged = {o.phase: o for o in ops if o.name.startswith(HBM_PASS_PREFIX)}
    assert set(charged) == {o.phase for o in overlap}
    for phase, got in charged.items():
        want = sum(NCCL_HBM_PASSES * float(busbw_factor(c.kind, c.features[1])) * c.bytes * c.count
                   for c in overlap if c.phase == phase)
        assert got.bytes == pytest.approx(want) and got.count == 1


def test_no_overlapped_collective_no_charge():
    ops, overlap, _ = _layer(_resolved(zero=1))
    assert not overlap
    assert not [o for o in ops if o.name.startswith(HBM_PASS_PREFIX)]


def test_contention_slows_a_compute_bound_fsdp_step_by_its_bytes_at_hbm_bandwidth():
    res = _resolved(zero=3, framework="torchtitan")
    pred = predict(res.model, res.plan, res.hardware)
    rows = [r for r in pred.breakdown if r["operator"].startswith(HBM_PASS_PREFIX)]
    assert rows and sum(r["time_s"] for r in rows) > 0
    ops, _, _ = _layer(res)
    nbytes = sum(o.bytes * o.count for o in ops if o.name.startswith(HBM_PASS_PREFIX)) * res.model.num_layers
    # no faster than the GPU's datasheet HBM bandwidth
    assert sum(r["time_s"] for r in rows) >= nbytes / (res.hardware.gpu.hbm_bw_gbs * 1e9)


def test_zero3_root_unit_is_gathered_and_reduced_once_per_micro_batch_on_its_stages():
    res = _resolved(zero=3, pp=2)
    g = build_graph(res.model, res.plan)
    first, last = g.stages[0].stage_ops, g.stages[-1].stage_ops
    dp, tp = res.plan.dp * res.plan.cp, res.plan.tp
    ag = [o for o in first if o.name == "zero3.embedding.param_allgather"]
    rs = [o for o in first if o.name == "zero3.embedding.grad_reducescatter"]
    assert len(ag) == 1 and len(rs) == 1 and ag[0].phase.value == "fwd" and rs[0].phase.value == "bwd"
    assert ag[0].bytes == pytest.approx(res.model.embedding_params() / tp * 2)
    assert rs[0].bytes == pytest.approx(res.model.embedding_params() / tp
                                        * get_framework(res.plan.framework).grad_reduce_bytes)
    assert ag[0].features[1] == dp
    assert [o for o in last if o.name == "zero3.head.param_allgather"]
    assert not [o for o in last if o.name.startswith("zero3.embedding")]
    ddp = build_graph(*(lambda r: (r.model, r.plan))(_resolved(zero=1, pp=2))).stages[0].stage_ops
    assert not [o for o in ddp if o.name.startswith("zero3.")]


@pytest.mark.parametrize("tp", [1, 8])
def test_torchtitan_runs_separate_projection_gemms_with_the_fused_ones_flops(tp):
    titan = _resolved(framework="torchtitan", tp=tp, gpus=8, gbs=8)
    mega = _resolved(framework="megatron", tp=tp, gpus=8, gbs=8)
    t_ops, m_ops = _layer(titan)[0], _layer(mega)[0]

    def gemms(ops, prefix):
        return {o.name: o for o in ops if o.kind == "gemm" and o.phase.value == "fwd" and o.name.startswith(prefix)}

    tq, mq = gemms(t_ops, "qkv"), gemms(m_ops, "qkv")
    assert set(tq) == {"qkv.q", "qkv.k", "qkv.v"} and set(mq) == {"qkv"}
    d, model = titan.model.head_dim, titan.model
    assert tq["qkv.k"].features[1] == max(1, model.num_kv_heads // tp) * d
    assert sum(o.flops for o in tq.values()) == pytest.approx(mq["qkv"].flops)
    tu, mu = gemms(t_ops, "mlp_up"), gemms(m_ops, "mlp_up")
    assert set(tu) == {"mlp_up.w1", "mlp_up.w3"} and set(mu) == {"mlp_up"}
    assert sum(o.flops for o in tu.values()) == pytest.approx(mu["mlp_up"].flops)


def test_no_contention_where_communication_does_not_run_beside_compute():
    from dataclasses import replace

    from costmodel.core.specs.hardware import Hardware
    res = _resolved(zero=3, framework="torchtitan")
    serial = Hardware(gpu=res.hardware.gpu, cluster=replace(res.hardware.cluster, comm_overlaps_compute=False))
    rows = {r["operator"]: r["time_s"] for r in predict(res.model, res.plan, serial).breakdown}
    assert not [k for k, v in rows.items() if k.startswith(HBM_PASS_PREFIX) and v > 0]
    overlapped = {r["operator"]: r["time_s"] for r in predict(res.model, res.plan, res.hardware).breakdown}
    assert [k for k, v in overlapped.items() if k.startswith(HBM_PASS_PREFIX) and v > 0]
