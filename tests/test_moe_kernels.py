"""Grouped expert GEMMs (costmodel/cost/moe_kernels.py): the measured fused-MoE / per-expert-GEMM ratio, its table and
its use in the composition (MoE plans with grouped GEMMs only)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from costmodel.core.kinds import Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import resolve_model
from costmodel.cost import moe_kernels as MK
from costmodel.estimate import default_cost_model
from costmodel.graph.build import build_graph
from costmodel.graph.ops import Op
from costmodel.schedule.compose import cost_operators

TABLE = MK.load_table()


def test_table_regenerates_from_shared_data(shared_data):
    """`python -m costmodel.cost.moe_kernels` output equals the shipped table (same data, same cost model)."""
    assert json.loads(json.dumps(MK.fit(shared_data), sort_keys=True)) == json.loads(MK.TABLE_PATH.read_text())


def test_balanced_routing_matches_the_collector():
    """Token i -> experts (i + j ceil(E/k)) mod E: every expert gets tokens x k / E when that divides, and EP rank 0
    holds E/EP of them."""
    assert MK.local_loads(1024, 8, 128, 8) == {64: 16}
    loads = MK.local_loads(100, 8, 256, 4)                  # 800 copies over 256 experts: 3 or 4 each
    assert sum(m * n for m, n in loads.items()) in range(3 * 64, 4 * 64 + 1) and set(loads) <= {3, 4}
    assert MK.local_loads(1, 2, 8, 8) == {1: 1}             # expert 0 busy (token 0 picks 0 and 4)
    assert MK.local_loads(1, 2, 8, 4) == {1: 1}             # rank 0's experts 0, 1: only 0 busy


def test_rows_with_idle_experts_and_a100_triton_are_left_out():
    row = {"num_tokens": "8", "topk": "8", "num_experts": "128", "inter_size": "768", "moe_tp_size": "1"}
    assert not MK.usable(row)                               # 64 copies < 128 experts: some idle
    assert MK.usable({**row, "num_tokens": "16"})
    assert not MK.usable({**row, "num_tokens": "16", "inter_size": "770", "moe_tp_size": "4"})
    assert "a100_sxm_bf16_moe__sglang-0.5.10.csv" in TABLE["provenance"]["excluded"]
    assert all(not s["file"].startswith("a100") for s in TABLE["systems"].values())
    assert MK.system_of("a100-80gb", TABLE) is None


def _cell(system: str, i: int, j: int) -> float:
    return TABLE["systems"][system]["bins"][f"{i},{j}"]["ratio"]


@pytest.mark.parametrize("system", ["h100_sxm", "h200_sxm", "b200_sxm", "gb200"])
def test_measured_regimes(system):
    """What the data say (the reason the ratio is not one number): with >= 32 local experts and <= 64 tokens each
    the grouped kernel takes under half the per-expert GEMM chain (one launch and one weight stream instead of
    one per expert); with one local expert it takes over 1.5x (fixed routing / permute / finalize work); from
    1,024 tokens per expert and >= 8 local experts within 0.7-1.1x (compute bound)."""
    assert _cell(system, 0, 3) < 0.5 and _cell(system, 1, 3) < 0.5
    assert all(_cell(system, i, 0) > 1.5 for i in range(4))
    assert all(0.7 <= _cell(system, i, j) <= 1.1 for i in (4, 5) for j in (2, 3)
               if f"{i},{j}" in TABLE["systems"][system]["bins"])


def test_scaled_expert_time_follows_the_gemm_model_in_tokens_per_expert():
    """The ratio is interpolated in log(tokens per expert), so the scaled time has no step at a bin edge: over the
    training range (>= 256 tokens per expert) it drops, as m grows, at most 10 points more than the GEMM model
    under it already does (the H100 GEMM trees themselves drop up to 24 % at some m). Below 256 with one local
    expert the bins' ratio falls from 3.1 to 2.2 while the GEMMs are flat (weight-load bound): not monotone there."""
    hw = load_catalogue().resolve("h100-sxm")
    system = MK.system_of("h100-sxm", TABLE)
    ms = np.unique(np.geomspace(256, 16384, 200).astype(int))
    for n, k in ((3072, 2048), (28672, 4096), (4096, 14336), (1536, 2048)):
        ops = [Op("gemm", "moe.expert.up", Phase.FWD, (int(m), n, k), flops=2.0 * m * n * k) for m in ms]
        base = default_cost_model().predict(ops, hw).time_s
        for local in (1, 4, 16, 64):
            t = base * np.array([MK.ratio_for(system, m, local) for m in ms])
            drop, base_drop = (float(np.max(1 - x / np.maximum.accumulate(x))) for x in (t, base))
            assert drop <= base_drop + 0.10, (n, k, local, drop, base_drop)


def _moe_plan(**kw) -> ParallelPlan:
    return ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=4096, pp=4, ep=8, **kw)


def _times(model, plan, gpu):
    hw = load_catalogue().resolve(gpu)
    graph = build_graph(model, plan)
    return hw, graph, cost_operators(graph, hw, default_cost_model())


def test_compose_scales_only_expert_operators_of_grouped_gemm_plans():
    model = resolve_model("mixtral-8x7b")
    plan = _moe_plan()
    hw, graph, times = _times(model, plan, "h100-sxm")
    out = MK.apply(plan, hw, graph, times)
    ops = {o.key(): o for st in graph.stages for o in st.layer_ops}
    up = next(o for o in ops.values() if o.name == "moe.expert.up" and o.phase is Phase.FWD)
    factor = MK.training_factor(MK.system_of("h100-sxm", TABLE), up.features[0], up.count)
    assert factor == 1.0 and up.features[0] >= MK.M_COMPUTE_BOUND   # Mixtral EP8: 16,384 tokens on one expert
    small = replace(plan, ep=1, mbs=1)                    # 8 local experts, 1,024 tokens each
    hw, graph_s, times_s = _times(model, small, "h100-sxm")
    assert MK.apply(small, hw, graph_s, times_s).time_s == times_s.time_s
    tiny = ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=512, pp=4, ep=1)
    hw, graph, times = _times(model, tiny, "h100-sxm")                # 128 tokens per expert: floors
    out = MK.apply(tiny, hw, graph, times)
    ops = {o.key(): o for st in graph.stages for o in st.layer_ops}
    up = next(o for o in ops.values() if o.name == "moe.expert.up" and o.phase is Phase.FWD)
    factor = MK.training_factor(MK.system_of("h100-sxm", TABLE), up.features[0], up.count)
    assert factor == min(1.0, MK.ratio_for(MK.system_of("h100-sxm", TABLE), up.features[0], up.count)) < 1.0
    for k, v in times.time_s.items():
        expert = k in ops and ops[k].name.startswith("moe.expert")
        assert out.time_s[k] == (v * factor if expert else v)
        if times.low_s is not None and out.low_s is not None:
            assert out.low_s[k] == (times.low_s[k] * factor if expert else times.low_s[k])
    assert any("fused-MoE" in w and "training basis" in w for w in out.warnings)
    assert all(out.source[k] == "derived" for k in ops if ops[k].name.startswith("moe.expert") and k in out.source)
    # without grouped GEMMs (SequentialMLP: one GEMM chain per expert, what the graph costs) nothing changes
    plan_seq = replace(plan, moe_grouped_gemm=False)
    hw, graph, times = _times(model, plan_seq, "h100-sxm")
    assert MK.apply(plan_seq, hw, graph, times) is times


def test_training_factor_is_one_when_compute_bound_and_capped_below():
    """Training basis: 1 from M_COMPUTE_BOUND tokens per expert (DeepGEMM grouped = dense), the measured fused
    ratio capped at 1 up to M_WEIGHT_BOUND, continuous and between the two in between."""
    sys_ = MK.system_of("b200", TABLE)
    for local in (1, 2, 16, 64):
        ms = np.geomspace(8, 8192, 60)
        f = np.array([MK.training_factor(sys_, m, local) for m in ms])
        assert np.all(f <= 1.0) and np.all(f[ms >= MK.M_COMPUTE_BOUND] == 1.0)
        assert np.all(np.abs(np.diff(f)) < 0.2)
    assert MK.training_factor(sys_, 16, 1) == 1.0          # one local expert: the fused kernel's extra work
    assert MK.training_factor(sys_, 16, 64) == MK.ratio_for(sys_, 16, 64) < 0.5
    assert MK.training_factor(None, 16, 64) == 1.0


def test_same_die_borrows_and_other_dies_say_so():
    model = resolve_model("mixtral-8x7b")
    plan = ParallelPlan(gpus=64, gpus_per_node=8, gbs=256, seq_len=512, pp=4, ep=1)
    hw, graph, times = _times(model, plan, "gh200")
    assert any("borrowed from h100-sxm" in w for w in MK.apply(plan, hw, graph, times).warnings)
    hw, graph, times = _times(model, plan, "a100-80gb")
    out = MK.apply(plan, hw, graph, times)
    assert out.time_s == times.time_s and any("no fused-MoE measurement" in w for w in out.warnings)


def test_dense_graph_is_untouched():
    model = resolve_model("llama-7b")
    plan = ParallelPlan(gpus=8, gpus_per_node=8, gbs=64, seq_len=4096)
    hw, graph, times = _times(model, plan, "h100-sxm")
    assert MK.apply(plan, hw, graph, times) is times


def test_a_key_shared_with_a_dense_operator_is_not_scaled():
    plan = _moe_plan()
    hw = load_catalogue().resolve("h100-sxm")
    up = Op("gemm", "moe.expert.up", Phase.FWD, (2048, 4096, 1024), count=16.0)
    twin = replace(up, name="moe.shared.up", count=1.0)
    other = Op("gemm", "moe.expert.down", Phase.FWD, (2048, 1024, 2048), count=16.0)
    factors, _ = MK.grouped_gemm_factors(plan, hw, [up, twin, other])
    assert up.key() not in factors and factors[other.key()] == MK.training_factor(MK.system_of("h100-sxm", TABLE),
                                                                                  2048, 16)


def test_overlapped_flex_dispatcher_takes_its_sms_from_the_compute():
    """--overlap-moe-expert-parallel-comm with the flex dispatcher: DeepEP's kernels hold 20 of an H100's 132 SMs
    while they run, so each phase's placeholder costs 20/132 of that phase's overlapped EP communication; none
    without overlap or with the all-to-all dispatcher."""
    from costmodel.core.kinds import Category
    from costmodel.cost.moe_kernels import FLEX_SMS, gpu_sms
    from costmodel.estimate import estimate
    from costmodel.graph.moe import SM_SHARE
    from planner.requests import PlanRequest

    req = PlanRequest(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=32, ep=32, mbs=1, gbs=64, moe_dispatcher="flex",
                      moe_overlap_comm=True)
    res = req.resolve()
    est = estimate(res.model, res.plan, res.hardware, cost_model=default_cost_model())
    graph, times = est.graph, est.costed.time_s
    st = graph.distinct_stages()[0]
    for ph in (o for o in st.layer_ops if o.name == SM_SHARE):
        comm = sum(times[o.key()] * o.count for o in st.layer_overlap_ops
                   if o.category is Category.EP_COMM and o.phase is ph.phase)
        assert comm > 0 and times[ph.key()] == pytest.approx(FLEX_SMS["deepep"] / 132 * comm / ph.count)
    assert gpu_sms("h100-sxm") == 132 and gpu_sms("gb300") == 160 and gpu_sms("a100-80gb") is None
    plain = PlanRequest(model="qwen3-30b-a3b", gpu="h100-sxm", gpus=32, ep=32, mbs=1, gbs=64,
                        moe_dispatcher="alltoall", moe_overlap_comm=True).resolve()
    assert not [o for o in build_graph(plain.model, plain.plan).stages[0].layer_ops if o.name == SM_SHARE]
