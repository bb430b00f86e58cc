"""The MoE token dispatcher a plan gets when the request leaves it to the default
(costmodel.graph.moe.default_dispatcher): the framework recipes' choice for the EP group's placement, and the note that
says which and why."""

import pytest

from costmodel.graph.moe import DISPATCHER_NOTE_KEY, default_dispatcher, dispatcher_notes
from planner.requests import PlanRequest


@pytest.mark.parametrize("framework,ep,etp,domain,expected", [
    ("megatron", 64, 1, 8, "flex"),       # DeepSeek-V3 on H100: EP64 over 8 nodes (Megatron-Bridge: hybridep)
    ("megatron", 32, 1, 8, "flex"),       # EP32 over 4 nodes
    ("megatron", 8, 1, 8, "alltoall"),    # EP8 inside one HGX node (Megatron-Bridge Qwen3-235B B200 EP8)
    ("megatron", 4, 2, 8, "alltoall"),    # EP4 x ETP2 still inside the node
    ("megatron", 8, 2, 8, "flex"),        # EP8 ranks 2 apart: 16 GPUs, two nodes
    ("megatron", 8, 1, 72, "flex"),       # GB200 NVL72: HybridEP inside the rack
    ("torchtitan", 64, 1, 8, "alltoall"),  # torchtitan's LocalTokenDispatcher
    ("fsdp", 8, 1, 8, "alltoall"),
])
def test_default_dispatcher_follows_the_recipes(framework, ep, etp, domain, expected):
    chosen, why = default_dispatcher(framework, ep, etp, domain)
    assert chosen == expected and why


def test_requests_resolve_auto_and_say_why():
    moe = PlanRequest(model="deepseek-v3", gpu="h100-sxm", gpus=1024, pp=8, ep=64, mbs=1, gbs=8192).resolve()
    assert moe.plan.moe_dispatcher == "flex"
    note = dispatcher_notes(moe.plan)
    assert len(note) == 1 and "flex assumed" in note[0] and "8 NVLink domains" in note[0]
    stated = PlanRequest(model="deepseek-v3", gpu="h100-sxm", gpus=1024, pp=8, ep=64, mbs=1, gbs=8192,
                         moe_dispatcher="alltoall").resolve()
    assert stated.plan.moe_dispatcher == "alltoall" and dispatcher_notes(stated.plan) == []
    assert DISPATCHER_NOTE_KEY not in stated.plan.extra
    dense = PlanRequest(model="llama-13b", gpu="h100-sxm", gpus=8).resolve()
    assert dense.plan.moe_dispatcher == "alltoall" and dispatcher_notes(dense.plan) == []
