"""Memory features of a plan: optimizer-state precisions, fp8 primary weights, optimizer and activation offloading,
reshard_after_forward, the per-framework state rules, and their plan checks, request keys, time and exports."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.core.errors import PlanError, PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.build import build_graph
from costmodel.memory import memory_states as ms
from costmodel.memory import offload
from costmodel.memory import per_gpu as mem
from planner.export_memory import megatron_memory_args, nemo_memory_keys, torchtitan_memory_keys
from planner.prediction import predict
from planner.requests import PlanRequest
from tests.helpers import parse_megatron

GIB = 2**30


def llama(layers: int = 8) -> ModelSpec:
    return ModelSpec(name="llama-like", num_layers=layers, hidden_size=4096, num_heads=32, num_kv_heads=8,
                     ffn_hidden_size=14336, vocab_size=128256, activation="swiglu", norm="rmsnorm",
                     tied_embeddings=False, position_embedding="rope")


def plan(**kw) -> ParallelPlan:
    base = dict(gpus=8, gpus_per_node=8, gbs=32, seq_len=4096)
    return ParallelPlan(**{**base, **kw})


def states(p: ParallelPlan, m: ModelSpec | None = None) -> float:
    b = mem.memory_per_gpu(m or llama(), p)
    return b.weights + b.gradients + b.optimizer


def per_param(p: ParallelPlan, m: ModelSpec | None = None) -> float:
    m = m or llama()
    return states(p, m) / mem.stage_params(m, p)[0]


# ---------------------------------------------------------------- bytes per parameter
@pytest.mark.parametrize("zero,dp", [(0, 8), (1, 8), (1, 2)])
def test_megatron_dist_optimizer_table(zero, dp):
    """Megatron-LM docs/user-guide/features/dist_optimizer.md: bf16 18 / 6 + 12/d; fp16 20 / 4 + 16/d."""
    p = plan(gpus=dp, zero=zero)
    d = dp if zero else 1
    assert per_param(p) == pytest.approx(18.0 if not zero else 6 + 12 / d)
    assert per_param(dataclasses.replace(p, dtype="fp16")) == pytest.approx(20.0 if not zero else 4 + 16 / d)


def test_precision_aware_optimizer_bytes():
    p = plan(zero=1)
    lean = dataclasses.replace(p, main_grads_dtype="bf16", main_params_dtype="fp16", exp_avg_dtype="bf16",
                               exp_avg_sq_dtype="fp8")
    assert per_param(lean) == pytest.approx(2 + 2 + (2 + 2 + 1) / 8)  # bf16 param + bf16 grad + shard
    assert ms.state_bytes(lean) == ms.StateBytes(2.0, 2.0, 2.0, 3.0)
    assert ms.state_bytes(dataclasses.replace(p, main_params_dtype="none")).master == 0.0


def test_fp8_param_gather_halves_layer_weights_and_gathers():
    m = llama()
    p = plan(zero=1, dtype="fp8")
    f8 = dataclasses.replace(p, fp8_param_gather=True)
    w, w8 = mem.memory_per_gpu(m, p).weights, mem.memory_per_gpu(m, f8).weights
    layers = m.num_layers * mem.layer_params_per_gpu(m, 1)
    assert w - w8 == pytest.approx(layers)  # 2 -> 1 byte per layer parameter; embedding and head stay bf16
    assert offload.param_gather_bytes(f8) == 1 and offload.param_gather_bytes(p) == 2
    gather = {o.name: o for st in build_graph(m, f8).stages for o in st.iteration_ops}["dp.param_allgather"]
    gather16 = {o.name: o for st in build_graph(m, p).stages for o in st.iteration_ops}["dp.param_allgather"]
    assert gather.bytes == pytest.approx(gather16.bytes / 2)


def test_bf16_main_grads_halve_grads_and_their_reduction():
    m = llama()
    p = plan(zero=1)
    b = dataclasses.replace(p, main_grads_dtype="bf16")
    assert mem.memory_per_gpu(m, b).gradients == pytest.approx(mem.memory_per_gpu(m, p).gradients / 2)
    rs = {o.name: o.bytes for st in build_graph(m, b).stages for o in st.iteration_ops}
    rs32 = {o.name: o.bytes for st in build_graph(m, p).stages for o in st.iteration_ops}
    assert rs["dp.grad_reducescatter"] == pytest.approx(rs32["dp.grad_reducescatter"] / 2)


def test_fsdp2_shards_the_fp32_master_as_the_parameter():
    """torchtitan / FSDP2: fp32 sharded parameter + fp32 gradient + Adam moments = 16/d plus the gathered units;
    Megatron-style ZeRO-3 keeps a bf16 shard besides the fp32 main copy (18/d)."""
    m = llama()
    p = plan(zero=3)
    tt = dataclasses.replace(p, framework="torchtitan")
    params = mem.stage_params(m, p)[0]
    assert states(p, m) - states(tt, m) == pytest.approx(2 * params / 8)
    bf = dataclasses.replace(p, framework="fsdp", main_params_dtype="none", exp_avg_dtype="bf16",
                             exp_avg_sq_dtype="bf16", main_grads_dtype="bf16")
    b = mem.memory_per_gpu(m, bf)
    assert b.optimizer == pytest.approx(4 * params / 8)  # bf16 moments only, no main copy


def test_reshard_after_forward_false_keeps_the_stage_gathered_and_skips_backward_gathers():
    m = llama()
    p = plan(zero=3, framework="fsdp")
    keep = dataclasses.replace(p, reshard_after_forward=False)
    params = mem.stage_params(m, p)[0]
    assert mem.memory_per_gpu(m, keep).weights > mem.memory_per_gpu(m, p).weights
    assert mem.memory_per_gpu(m, keep).weights == pytest.approx(4 * params / 8 + 2 * params)
    phases = {(o.name, o.phase) for st in build_graph(m, keep).stages for o in st.layer_overlap_ops}
    assert not any("param_allgather" in n and ph == "bwd" for n, ph in phases)
    assert any("param_allgather" in n and ph == "bwd" for st in build_graph(m, p).stages
               for n, ph in ((o.name, o.phase) for o in st.layer_overlap_ops))


def test_deepspeed_zero3_gathers_modules_not_layers():
    big = ModelSpec(name="gpt-530b-like", num_layers=4, hidden_size=20480, num_heads=128, num_kv_heads=128,
                    ffn_hidden_size=81920, vocab_size=51200, activation="gelu", norm="layernorm",
                    tied_embeddings=True, position_embedding="learned", linear_bias=True)
    p = plan(gpus=64, zero=3, dtype="fp16", gbs=64, seq_len=2048, recompute="full")
    ds, mg = (mem.memory_per_gpu(big, dataclasses.replace(p, framework=f)) for f in ("deepspeed", "megatron"))
    fc1 = 20480 * 81920
    shard = mem.stage_params(big, p)[0] / 64
    assert ds.weights == pytest.approx(2 * (shard + fc1))  # the largest module (fc1) > max_live_parameters
    assert ds.weights < mg.weights / 4


# ---------------------------------------------------------------- offloading
def test_optimizer_offload_moves_a_share_to_the_host():
    m = llama()
    p = plan(zero=1, main_params_dtype="fp16")
    off = dataclasses.replace(p, optimizer_offload_fraction=0.75)
    a, b = mem.memory_per_gpu(m, p), mem.memory_per_gpu(m, off)
    assert b.optimizer == pytest.approx(a.optimizer / 4) and b.host == pytest.approx(0.75 * a.optimizer)
    assert b.total < a.total


def test_activation_offload_keeps_two_layers_on_the_gpu():
    m = llama(layers=16)
    p = plan(zero=1, offload_modules=("core_attn", "attn_proj"))
    base = mem.memory_per_gpu(m, dataclasses.replace(p, offload_modules=()))
    b = mem.memory_per_gpu(m, p)
    per_layer = mem.offloaded_layer_bytes(m, p)
    q, kv = 4096, 8 * 128
    assert per_layer == pytest.approx(2 * 4096 * (q + 2 * kv + q))  # Q, K, V and O of one micro-batch
    assert base.activations - b.activations == pytest.approx(per_layer * (16 - mem.OFFLOAD_KEPT_LAYERS))
    assert b.host == pytest.approx(per_layer * (16 - mem.OFFLOAD_KEPT_LAYERS))


def test_offload_time_on_the_host_link():
    cat = load_catalogue()
    gh, h100 = cat.gpu("gh200"), cat.gpu("h100-sxm")
    assert gh.host_link_bw_gbs == 450 and h100.host_link_bw_gbs == 64  # NVLink-C2C vs PCIe Gen5 x16
    p = plan(zero=1, main_params_dtype="fp16", optimizer_offload_fraction=0.5)
    t = offload.optimizer_offload_s(p, gh, 1e9)
    assert t == pytest.approx(1e9 * ((4 + 2) / 450e9 + (4 + 2 * (2 + 8) + 2) / gh.host_mem_bw_gbs / 1e9))
    with pytest.raises(PlanError, match="host_mem_bw_gbs"):
        offload.optimizer_offload_s(p, h100, 1e9)  # no host memory bandwidth in the catalogue
    # copies beyond the compute they hide under are exposed, per direction
    assert offload.activation_offload_exposed_s(p, h100, 64e9, 1, 2.0, 0.5) == pytest.approx(0.5)
    assert offload.activation_offload_exposed_s(p, gh, 64e9, 1, 2.0, 0.5) == 0.0


def test_offload_costs_time_only_where_the_link_is_short():
    hw = load_catalogue().resolve("gh200", "vista")
    m = llama(layers=8)
    p = plan(gpus=4, gpus_per_node=1, zero=1, gbs=8, main_params_dtype="fp16")
    t0 = predict(m, p, hw).iteration_time_s
    t1 = predict(m, dataclasses.replace(p, optimizer_offload_fraction=1.0), hw).iteration_time_s
    assert t1 > t0


# ---------------------------------------------------------------- checks, requests, exports
@pytest.mark.parametrize("kw,match", [
    (dict(fp8_param_gather=True), "fp8_param_gather"),
    (dict(dtype="fp8", fp8_param_gather=True, zero=0), "zero >= 1"),
    (dict(offload_modules=("attn_proj",)), "core_attn"),
    (dict(offload_modules=("bogus",)), "unknown bogus"),
    (dict(offload_modules=("core_attn",), recompute="full"), "recompute=full"),
    (dict(optimizer_offload_fraction=1.5), "fraction"),
    (dict(optimizer_offload_fraction=0.5, framework="fsdp", zero=3), "framework megatron"),
    (dict(main_params_dtype="none"), "FSDP2"),
    (dict(main_grads_dtype="fp16"), "fp16 training"),
    (dict(exp_avg_dtype="int4"), "exp_avg_dtype"),
])
def test_bad_memory_features_are_refused_with_the_reason(kw, match):
    with pytest.raises(PlanError, match=match):
        plan(**kw).validate(llama())


def test_request_keys_reach_the_plan():
    req = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, dtype="fp8", main_grads_dtype="bf16",
                      exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", fp8_param_gather=True,
                      offload_modules="core_attn,attn_proj", reshard_after_forward=None)
    p = req.resolve().plan
    assert (p.main_grads_dtype, p.exp_avg_dtype, p.fp8_param_gather) == ("bf16", "bf16", True)
    assert p.offload_modules == ("core_attn", "attn_proj")
    assert PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8).memory_fields() == {}
    with pytest.raises(PlannerError, match="optimizer_offload_fraction"):
        PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, optimizer_offload_fraction=2)


def test_exports_use_the_frameworks_flags():
    p = plan(zero=1, dtype="fp8", main_grads_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16",
             fp8_param_gather=True, optimizer_offload_fraction=0.5, offload_modules=("core_attn", "attn_proj"))
    flags, _ = megatron_memory_args(p)
    text = " ".join(f if v is None else f"{f} {v}" for f, v in flags)
    a = parse_megatron(text)  # Megatron-LM's own argparse specs (tests/fixtures/launchers)
    assert a.use_precision_aware_optimizer and a.main_grads_dtype == "bf16" and a.exp_avg_sq_dtype == "bf16"
    assert a.fp8_param_gather and a.optimizer_cpu_offload and a.optimizer_offload_fraction == 0.5
    assert a.fine_grained_activation_offloading and a.offload_modules == ["core_attn", "attn_proj"]
    assert parse_megatron(" ".join(f for f, _ in megatron_memory_args(plan(main_grads_dtype="bf16"))[0])
                          ).grad_reduce_in_bf16
    model_keys, optim_keys, _ = nemo_memory_keys(p)
    assert model_keys == {"fp8_params": True} and optim_keys["grad_sync_dtype"] == "bf16"
    assert torchtitan_memory_keys(plan(zero=3, reshard_after_forward=False)) == {"fsdp_reshard_after_forward": "never"}


def test_defaults_leave_the_megatron_export_alone():
    assert megatron_memory_args(plan()) == ([], [])
