import pytest

from costmodel.core.errors import PlanError
from tests.helpers import llama, plan


def test_valid_plan_derives_dp_and_microbatches():
    p = plan(gpus=64, gpn=8, gbs=512, tp=2, pp=4, mbs=2).validate(llama())
    assert p.dp == 8
    assert p.num_microbatches == 512 // (2 * 8)
    assert p.num_nodes == 8
    assert p.stage_layers(32) == (8, 8, 8, 8)


def test_error_lists_every_problem_and_every_factor():
    bad = plan(gpus=48, gpn=8, gbs=100, tp=3, pp=5, vpp=3, mbs=2)
    with pytest.raises(PlanError) as exc:
        bad.validate(llama())
    msg = str(exc.value)
    for needle in ("heads=32 must be a multiple of TP=3", "layers=32 with VPP=3",
                   "must divide GPUs=48", "KV heads=32"):
        assert needle in msg, needle
    for factor in ("GPUs=48", "TP=3", "PP=5", "CP=1", "DP=", "VPP=3", "MBS=2", "GBS=100", "seq_len=2048"):
        assert factor in msg, factor


def test_gbs_divisibility_message():
    with pytest.raises(PlanError, match=r"GBS=100 must be a multiple of MBS\*DP = 1\*8 = 8"):
        plan(gpus=8, gbs=100).validate(llama())


def test_gqa_kv_heads_and_tp():
    m = llama(heads=64, kv=8, hidden=8192, ffn=28672, layers=8)
    plan(gpus=16, gpn=8, gbs=16, tp=16).validate(m)  # tp > kv heads: KV replicated, allowed
    with pytest.raises(PlanError, match="KV heads=8 and TP=3"):
        plan(gpus=24, gpn=8, gbs=24, tp=3).validate(llama(heads=24, kv=8, hidden=3072, ffn=8190, layers=8))


@pytest.mark.parametrize("field,value", [("gpus", 0), ("tp", -1), ("mbs", 0),
                                         ("seq_len", -5), ("zero", 4), ("recompute", "some"), ("dtype", "int8")])
def test_bad_values(field, value):
    kw = dict(gpus=8, gpus_per_node=8, gbs=8, seq_len=1024)
    kw[field] = value
    from costmodel.core.specs.plan import ParallelPlan
    with pytest.raises(PlanError):
        ParallelPlan(**kw).validate(llama())


def test_uneven_layer_split():
    m = llama(layers=30)
    # no split given: valid (Megatron's first/last-stage split; predict chooses one), count-based default
    assert plan(gpus=32, gpn=8, gbs=64, pp=4).validate(m).stage_layers(30) == (7, 8, 8, 7)
    with pytest.raises(PlanError, match="layers=30 are fewer than PP"):
        plan(gpus=32, gpn=32, gbs=64, pp=32).validate(m)
    p = plan(gpus=32, gpn=8, gbs=64, pp=4, layer_split=(8, 8, 7, 7)).validate(m)
    assert p.stage_layers(30) == (8, 8, 7, 7)
    with pytest.raises(PlanError, match="layer_split"):
        plan(gpus=32, gpn=8, gbs=64, pp=4, layer_split=(8, 8, 8, 8)).validate(m)


def test_interleaved_needs_a_valid_microbatch_group():
    # Megatron-Core: PP <= N <= M with M % N == 0 or >= PP (tests/test_microbatch_group.py has the rule)
    with pytest.raises(PlanError, match="interleaved"):
        plan(gpus=4, gpn=4, gbs=3, pp=4, vpp=2).validate(llama())
    assert plan(gpus=4, gpn=4, gbs=6, pp=4, vpp=2).validate(llama()).vpp_microbatch_group == 6


def test_moe_imbalance_bounded_by_experts_over_topk():
    """The busiest expert can receive every token at most once: imbalance <= E / k (Mixtral: 8 / 2 = 4)."""
    from costmodel.core.specs.plan import ParallelPlan
    from costmodel.core.specs.presets import resolve_model

    mixtral = resolve_model("mixtral-8x7b")
    ok = ParallelPlan(64, 8, 128, 4096, pp=4, ep=8, moe_imbalance=4.0)
    assert ok.problems(mixtral) == []
    bad = ParallelPlan(64, 8, 128, 4096, pp=4, ep=8, moe_imbalance=4.5)
    assert any("experts / top-k = 4" in p for p in bad.problems(mixtral))
