"""Interleaved schedule with micro-batches not a multiple of PP (Megatron-Core's micro-batch groups).

Megatron-Core schedules.py (forward_backward_pipelining_with_interleaving) runs micro-batches in groups of
N = microbatch_group_size_per_vp_stage (default PP) and needs PP <= N <= M and M % N either 0 or >= PP; the
NeMo llama31_405b recipe (TP8 PP9 VPP2 CP4 on 576 GPUs, GBS 512: M = 256) needs N = 13.
"""

from __future__ import annotations

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import get_preset as get_model
from costmodel.memory.per_gpu import inflight_microbatches
from costmodel.schedule.timeline import pipeline_time, simulate_1f1b
from planner.export import megatron_args, nemo_config


def _plan(gbs: int, pp: int, vpp: int, dp: int = 2, cp: int = 1, **kw) -> ParallelPlan:
    return ParallelPlan(gpus=8 * pp * dp * cp, gpus_per_node=8, cp=cp, gbs=gbs, seq_len=4096, tp=8,
                        pp=pp, vpp=vpp, mbs=1, **kw)


@pytest.mark.parametrize("m, pp, group", [(256, 8, 8), (256, 9, 13), (10, 4, 5), (9, 4, 5), (3, 4, None),
                                          (13, 4, 7), (14, 4, 5), (16, 4, 4)])
def test_group_follows_megatron_rule(m, pp, group):
    plan = _plan(gbs=2 * m, pp=pp, vpp=2)
    assert plan.num_microbatches == m
    assert plan.vpp_microbatch_group == group
    if group is not None:  # the rule itself, restated on the chosen N
        assert pp <= group <= m and (m % group == 0 or m % group >= pp)
        assert all(not (m % n == 0 or m % n >= pp) for n in range(pp, group))  # the smallest valid N


def test_plan_refuses_fewer_microbatches_than_stages():
    with pytest.raises(PlannerError, match="group size N"):
        _plan(gbs=6, pp=4, vpp=2).validate()
    _plan(gbs=2 * 13, pp=4, vpp=2).validate()  # 13 % 4 = 1, but N = 13 is valid


@pytest.mark.parametrize("m, p, v, n", [(10, 4, 2, 5), (256, 9, 2, 13), (13, 4, 2, 13), (12, 4, 3, 4)])
def test_simulated_schedule_with_groups_matches_closed_form(m, p, v, n):
    f, b = [1.0] * p, [2.0] * p
    assert simulate_1f1b(f, b, m, vpp=v, microbatch_group=n).makespan_s == pytest.approx(
        pipeline_time(f, b, m, vpp=v).time_s)


def test_an_invalid_group_leaves_dependency_bubbles():
    # M = 13, N = 4: the last group has 1 < PP micro-batches, which Megatron refuses because it stalls
    f, b = [1.0] * 4, [2.0] * 4
    assert simulate_1f1b(f, b, 13, vpp=2, microbatch_group=4).makespan_s > pipeline_time(f, b, 13, vpp=2).time_s


def test_larger_group_holds_more_warmup_activations():
    assert inflight_microbatches(9, 0, 256, vpp=2, group=13) > inflight_microbatches(9, 0, 256, vpp=2)
    assert inflight_microbatches(8, 0, 256, vpp=2, group=8) == inflight_microbatches(8, 0, 256, vpp=2)


def test_export_sets_the_group_only_when_it_is_not_pp():
    model = get_model("llama3-405b")
    odd = _plan(gbs=512, pp=9, vpp=2, dp=2, cp=4, layer_split=(14,) * 9)
    flags, _ = megatron_args(model, odd)
    i = flags.index("--microbatch-group-size-per-virtual-pipeline-stage")
    assert flags[i + 1] == "13"
    assert nemo_config(model, odd)[0]["model"]["microbatch_group_size_per_vp_stage"] == 13
    even = _plan(gbs=512, pp=8, vpp=2, layer_split=None)
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in megatron_args(get_model("llama3-70b"), even)[0]
