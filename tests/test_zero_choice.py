"""costmodel.memory.zero_choice: the ZeRO stage a request that leaves it open is costed at."""

from dataclasses import replace

from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import get_preset
from costmodel.memory.per_gpu import fits_in_memory, memory_per_gpu
from costmodel.memory.zero_choice import ZERO_NOTE_KEY, with_default_zero, zero_choice_notes
from planner.requests import PlanRequest

H100 = load_catalogue().resolve("h100-sxm", None, None).gpu


def _plan(**kw) -> ParallelPlan:
    base = dict(gpus=16384, gpus_per_node=8, gbs=2048, seq_len=8192, tp=8, pp=16, vpp=2, mbs=1, zero=1)
    return ParallelPlan(**{**base, **kw})


def test_the_lowest_stage_that_fits_and_why():
    model = get_preset("llama3-405b")
    plan = with_default_zero(model, _plan(), H100)
    assert plan.zero == 2 and fits_in_memory(memory_per_gpu(model, plan, H100), H100)
    assert not fits_in_memory(memory_per_gpu(model, replace(plan, zero=1), H100), H100)
    (note,) = zero_choice_notes(plan)
    assert note.startswith("ZeRO-2 chosen because --zero was left to auto: at ZeRO-1 this layout does not fit")
    assert "Megatron-FSDP optim_grads" in note and "--zero 1" in note


def test_a_plan_that_fits_at_zero_1_is_left_alone():
    model = get_preset("llama3-8b")
    plan = _plan(gpus=8, tp=2, pp=1, vpp=1, gbs=64, seq_len=4096)
    chosen = with_default_zero(model, plan, H100)
    assert chosen == plan and ZERO_NOTE_KEY not in chosen.extra and zero_choice_notes(chosen) == []


def test_nothing_fits_keeps_zero_1_without_a_note():
    model = get_preset("llama3-405b")
    plan = with_default_zero(model, _plan(gpus=64, pp=8, vpp=1, gbs=64), H100)
    assert plan.zero == 1 and zero_choice_notes(plan) == []


def test_only_a_request_left_open_is_moved():
    """An explicit stage is costed as given, even when it does not fit."""
    req = dict(model="llama3-405b", gpu="h100-sxm", gpus=16384, tp=8, pp=16, vpp=2, mbs=1, gbs=2048, seq_len=8192)
    assert PlanRequest(**req).resolve().plan.zero == 2
    assert PlanRequest(**req, zero=1).resolve().plan.zero == 1
    assert PlanRequest(**req, zero="3").resolve().plan.zero == 3
