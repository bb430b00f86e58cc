"""The `framework` input (issue 15 item 2): registry, plan validation, what each behaviour changes."""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlanError, PlannerError
from costmodel.core.specs.framework import FRAMEWORKS, Framework, get_framework, register
from costmodel.cost.framework_kernels import (
    FLASH2_SPEEDUP,
    _launch_s,
    causal_fwd_efficiency,
    fit,
    flash2_times,
    load_table,
)
from costmodel.graph.build import build_graph
from planner.cli import app
from planner.prediction import predict
from planner.requests import PlanRequest
from planner.validation.runs import _framework

runner = CliRunner()


def _resolved(framework: str, gpu: str = "h100-sxm", **kw):
    req = PlanRequest(model="llama3-8b", gpu=gpu, gpus=8, mbs=1, gbs=8, seq_len=4096, framework=framework, **kw)
    return req.resolve()


def test_registry_refuses_duplicates_and_bad_behaviours():
    with pytest.raises(ValueError, match="already registered"):
        register(get_framework("megatron"))
    with pytest.raises(ValueError, match="attention_kernel"):
        register(Framework("x-test", "", "nope", True, "flat", ""))
    assert FRAMEWORKS[0] == "megatron" and set(FRAMEWORKS) == {"megatron", "deepspeed", "fsdp", "torchtitan",
                                                                 "torchtitan-eager", "llmc"}


def test_unknown_framework_is_one_line_exit_2():
    with pytest.raises(PlannerError, match="framework='jax' must be one of megatron"):
        PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, framework="jax")
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                              "--framework", "jax"])
    assert res.exit_code == 2
    assert "framework='jax' must be one of" in res.output and "Traceback" not in res.output
    with pytest.raises(PlanError, match="framework"):
        replace(_resolved("megatron").plan, framework="jax").validate()


def test_batch_key_framework_reaches_the_plan():
    res = runner.invoke(app, ["predict", "--batch", "-"], input=json.dumps(
        {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8, "gbs": 8, "seq_len": 4096, "framework": "fsdp",
         "zero": 3}) + "\n")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.splitlines()[0])["plan"]["framework"] == "fsdp"


def test_flash2_stacks_cost_attention_from_flash_attention_2_and_nothing_else():
    mega, titan = _resolved("megatron", zero=3), _resolved("torchtitan", zero=3)
    pm, pt = predict(mega.model, mega.plan, mega.hardware), predict(titan.model, titan.plan, titan.hardware)

    def rows(p):
        return {(r["operator"], r["phase"]): r["time_s"] for r in p.breakdown}

    rm, rt = rows(pm), rows(pt)
    # on Hopper FlashAttention-2 is slower than the fused kernel the H100 data measure (FA3 paper sec. 4.1)
    assert rt[("attention", "fwd")] > 1.2 * rm[("attention", "fwd")]
    assert rt[("attention", "bwd")] > 1.2 * rm[("attention", "bwd")]
    assert pt.iteration_time_s > pm.iteration_time_s
    # torchtitan runs wq, wk, wv and w1, w3 as separate GEMMs (Framework.separate_projections), Megatron fused
    assert ("qkv", "fwd") in rm and ("qkv.k", "fwd") in rt and ("qkv", "fwd") not in rt
    assert ("mlp_up", "fwd") in rm and ("mlp_up.w3", "fwd") in rt and ("mlp_up", "fwd") not in rt
    split = ("qkv", "mlp_up")
    # the losses differ too: Megatron's vocab-parallel fp32 chain, torchtitan's F.cross_entropy(pred.float())
    loss_chain = ("hbm.megatron.cross_entropy", "hbm.eager.cross_entropy")
    assert ("hbm.megatron.cross_entropy", "fwd") in rm and ("hbm.eager.cross_entropy", "fwd") in rt
    same = [k for k in rm if k[0] != "attention" and "exposed" not in k[0] and k[0].split(".")[0] not in split
            and k[0] not in loss_chain]
    assert same and all(rm[k] == pytest.approx(rt[k]) for k in same)
    assert not any("FlashAttention-2" in w for w in pt.warnings)  # seq 4096, head dim 128 are sampled
    long = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, gbs=8, seq_len=16384, framework="fsdp").resolve()
    warned = predict(long.model, long.plan, long.hardware).warnings
    assert any("FlashAttention-2 measured on gh200" in w and "seq=16384 outside sampled range" in w for w in warned)


def test_flash2_time_is_flops_over_the_measured_rate():
    res = _resolved("fsdp", zero=3)
    graph = build_graph(res.model, res.plan)
    ops = [o for st in graph.stages for o in st.layer_ops if o.kind in ("attention_fwd", "attention_bwd")]
    times, _ = flash2_times(res.plan, res.hardware, ops)
    die = load_table()["dies"]["GH100"]
    rate = die["fwd_tflops"]["128"]["4096"]["tflops"] * 1e12  # llama3-8b: head_dim 128, seq 4096 is sampled
    fwd = next(o for o in ops if o.kind == "attention_fwd")
    bwd = next(o for o in ops if o.kind == "attention_bwd")
    # the causal forward at the measured causal / unmasked fraction (framework_kernels.CAUSAL_FWD_EFFICIENCY)
    launch = _launch_s(res.hardware.gpu.name)  # each kernel at least the GPU's launch floor
    assert times[fwd.key()] == pytest.approx(fwd.flops / rate / causal_fwd_efficiency(4096) + launch)
    assert times[bwd.key()] == pytest.approx(bwd.flops / 2.5 / rate * die["bwd_over_fwd"] + launch)


def test_flash1_is_flash_attention_2_at_half_its_rate():
    res = _resolved("fsdp", zero=3)
    graph = build_graph(res.model, res.plan)
    ops = [o for st in graph.stages for o in st.layer_ops if o.kind in ("attention_fwd", "attention_bwd")]
    fa2, _ = flash2_times(res.plan, res.hardware, ops)
    fa1, notes = flash2_times(replace(res.plan, attention="flash1"), res.hardware, ops)
    launch = _launch_s(res.hardware.gpu.name)
    assert fa1 and set(fa1) == set(fa2)
    # PyTorch 2.2 release notes: FlashAttention-2 in SDPA, "around 2x speedups compared to previous versions"
    assert all(fa1[k] - launch == pytest.approx(FLASH2_SPEEDUP * (fa2[k] - launch)) for k in fa2)
    assert FLASH2_SPEEDUP == 2.0 and any("FlashAttention (v1)" in n for n in notes)


def test_megatron_keeps_the_cost_model_attention():
    res = _resolved("megatron")
    graph = build_graph(res.model, res.plan)
    assert flash2_times(res.plan, res.hardware, [o for st in graph.stages for o in st.layer_ops]) == ({}, [])


def test_rate_table_is_the_median_of_the_measured_rows(tmp_path):
    root = tmp_path / "estimate-train-time"
    rows = {"Vista": [(1, 2, 16, 1024, 2048, 100.0, 300.0), (1, 2, 16, 1024, 2048, 200.0, 700.0),
                      (1, 2, 16, 1024, 2048, 400.0, 1.0)],
            "Perlmutter": [(1, 2, 16, 1024, 2048, 300.0, 900.0), (1, 2, 16, 1024, 2048, 100.0, 400.0)]}
    names = {"Vista": "NVIDIAGH200120GB_flash_atten_fp16.csv",
             "Perlmutter": "NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv"}
    for system, data in rows.items():
        (root / system / "operator").mkdir(parents=True)
        with (root / system / "operator" / names[system]).open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["mp", "b", "h", "l", "dim", "F_dur(us)", "B_dur(us)"])
            w.writerows(data)
    table = fit(tmp_path)
    flops = 4.0 * 2 * 16 * 1024 * 1024 * 128
    gh = table["dies"]["GH100"]["fwd_tflops"]["128"]["1024"]
    assert gh["n"] == 3 and gh["tflops"] == pytest.approx(statistics.median(flops / (t * 1e-6) / 1e12
                                                                            for t in (100, 200, 400)), rel=1e-3)
    # backward / forward from the A100 rows only (the GH200 backward column is broken)
    assert table["dies"]["GH100"]["bwd_over_fwd"] == pytest.approx(statistics.median([3.0, 4.0]))


def test_deepspeed_zero3_gathers_cross_the_network_per_gpu():
    def topo(fw):
        req = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=32, mbs=1, gbs=32, seq_len=4096, zero=3,
                          framework=fw)
        res = req.resolve()
        ops = build_graph(res.model, res.plan).stages[0].layer_overlap_ops
        return {o.features[1:] for o in ops if o.name.startswith("zero3.")}, res

    flat, _ = topo("deepspeed")
    hier, _ = topo("fsdp")
    assert flat == {(32, 32, 1)}       # 32 ranks, each its own network endpoint
    assert hier == {(32, 4, 8)}        # 4 nodes of 8 GPUs: hierarchical


def test_deepspeed_does_not_overlap_the_dp_gradient_reduction_by_default():
    ds = _resolved("deepspeed", zero=1).plan
    mg = _resolved("megatron", zero=1).plan
    assert ds.overlap_grad_reduce is False and mg.overlap_grad_reduce is True


@pytest.mark.parametrize("text, key", [("Megatron-LM + DeepSpeed ZeRO-3", "deepspeed"), ("torchtitan", "torchtitan"),
                                       ("NeMo 24.07 (Megatron-Core)", "megatron"), ("PyTorch FSDP", "fsdp"),
                                       ("Meta internal 4D parallelism", "megatron")])
def test_published_run_framework_text(text, key):
    notes: list[str] = []
    assert _framework(text, notes) == key
    assert bool(notes) == (text.startswith("Meta"))


def test_unfused_attention_is_batched_gemms_and_score_passes_over_the_full_matrix():
    req = PlanRequest(model="llama3-8b", gpu="a100-80gb", gpus=8, gbs=8, seq_len=2048, attention="unfused",
                      recompute="selective")
    res = req.resolve()
    ops = build_graph(res.model, res.plan).stages[0].layer_ops
    assert not [o for o in ops if o.kind.startswith("attention_")]
    heads, d, s = res.model.num_heads, res.model.head_dim, 2048
    fwd = [o for o in ops if o.name.startswith("attention.") and o.phase.value == "fwd"]
    gemm_flops = sum(o.flops * o.count for o in fwd if o.kind == "gemm")
    assert gemm_flops == pytest.approx(4.0 * heads * s * s * d)  # QK^T and PV over the full s x s matrix
    # selective recompute re-runs the core forward in backward (Korthikanti et al. 2022 sec. 5)
    again = [o for o in ops if o.name.startswith("attention.") and o.phase.value == "recompute"]
    assert sorted(o.name for o in again) == sorted(o.name for o in fwd)
    flash = replace(res.plan, attention="")
    p_unfused = predict(res.model, res.plan, res.hardware)
    p_flash = predict(res.model, flash, res.hardware)
    assert p_unfused.iteration_time_s > p_flash.iteration_time_s
    # the stored s x s tensors appear with recompute none (Korthikanti Table 2)
    none_u = replace(res.plan, recompute="none")
    none_f = replace(flash, recompute="none")
    assert predict(res.model, none_u, res.hardware).memory["activations"] > \
        predict(res.model, none_f, res.hardware).memory["activations"]


def test_pre_flash_sources_run_unfused_attention():
    from costmodel.core.paths import validation_dir
    from planner.validation.runs import load_runs, row_to_inputs

    vdir = validation_dir()
    if vdir is None:
        pytest.skip("../shared/validation not present")
    rows = {r.id: r for r in load_runs(vdir / "published_runs.csv")}
    for rid, kernel in (("NARAY21-001", "unfused"), ("KORTHI22-003", "unfused"), ("MLM-SEP20-001", "unfused"),
                        ("NEMO2407-005", ""), ("TORCHTITAN-001", "")):
        _, plan, _, _ = row_to_inputs(rows[rid])
        assert plan.attention == kernel, rid
    assert any("unfused attention" in a for a in rows["NARAY21-001"].assumptions)


def test_inter_node_collectives_use_the_cluster_network():
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.cost.roofline import RooflineCostModel
    from costmodel.estimate import default_cost_model
    from costmodel.graph.ops import Op

    hw = load_catalogue().resolve("a100-80gb", "dgx-a100", 8)
    op = Op("all_reduce", "dp.grad_allreduce", "dp_comm", (7.0e9, 32, 16, 2), bytes=7.0e9)
    measured = default_cost_model().predict([op], hw)
    analytic = RooflineCostModel().predict([op], hw)
    assert measured.time_s[0] == pytest.approx(analytic.time_s[0])
    assert any("cluster's network figures" in w for w in measured.warnings)


def test_torchtitan_selective_ac_recomputes_elementwise_ops_and_every_second_matmul():
    def layer(fw):
        req = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, gbs=8, seq_len=4096, zero=3, framework=fw,
                          recompute="selective")
        res = req.resolve()
        return res.model, build_graph(res.model, res.plan).stages[0].layer_ops

    model, titan = layer("torchtitan")
    _, fsdp = layer("fsdp")
    assert not [o for o in fsdp if o.phase.value == "recompute"]  # attention-core recompute: free with flash
    again = [o for o in titan if o.phase.value == "recompute"]
    h, kv, f = model.hidden_size, model.num_kv_heads * model.head_dim, model.ffn_hidden_size
    mm = sorted(o.features for o in again if o.kind == "gemm")
    assert mm == sorted([(4096, kv, h), (4096, h, model.num_heads * model.head_dim), (4096, f, h)])  # wk, wo, w3
    fwd_elementwise = sorted(o.name for o in titan if o.phase.value == "fwd"
                             and o.kind in ("norm", "rope", "activation", "residual_add")
                             and not o.name.startswith("hbm.contention."))  # collectives' HBM traffic: not re-run
    assert sorted(o.name for o in again if o.kind != "gemm") == fwd_elementwise


def test_megatron_2020_rows_take_the_per_replica_batch_as_micro_batch():
    from costmodel.core.paths import validation_dir
    from planner.validation.runs import load_runs, row_to_inputs

    vdir = validation_dir()
    if vdir is None:
        pytest.skip("../shared/validation not present")
    rows = {r.id: r for r in load_runs(vdir / "published_runs.csv")}
    _, plan, _, _ = row_to_inputs(rows["MLM-SEP20-002"])    # GBS 2048 over DP 128, no accumulation in 2020
    assert plan.mbs == 16 and plan.num_microbatches == 1
    assert any("MBS = GBS / DP = 16" in a for a in rows["MLM-SEP20-002"].assumptions)
    _, plan, _, _ = row_to_inputs(rows["NARAY21-001"])      # no such rule: MBS not stated stays 1
    assert plan.mbs == 1


def test_power_capped_h100_is_priced_from_h100_measurements_at_its_own_peak_and_bandwidth():
    capped = PlanRequest(model="llama3-8b", gpu="h100-sxm-500w", gpus=8, gbs=8, seq_len=4096,
                         framework="torchtitan", zero=3).resolve()
    full = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, gbs=8, seq_len=4096,
                       framework="torchtitan", zero=3).resolve()
    pc, pf = predict(capped.model, capped.plan, capped.hardware), predict(full.model, full.plan, full.hardware)
    assert pc.iteration_time_s > pf.iteration_time_s
    assert capped.hardware.gpu.peak_tflops["bf16"] == pytest.approx(989.4 * (500 / 700) ** (1 / 3), abs=0.1)
    assert any("derived from h100-sxm" in w for w in pc.warnings)


def test_search_compares_frameworks_with_the_calibration_predict_applies():
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "1,2",
                              "--pp", "1", "--zero", "3", "--framework", "megatron,torchtitan", "--top", "50",
                              "--format", "json", "--no-progress"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output[res.output.index("{"):])["plans"]
    assert {p["framework"] for p in plans} == {"megatron", "torchtitan"}
    # each plan's time is what `planner predict` prints for it (the same default calibration)
    p = next(p for p in plans if p["framework"] == "torchtitan")
    one = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                              "--tp", str(p["tp"]), "--cp", str(p["cp"]), "--mbs", str(p["mbs"]),
                              "--gbs", str(p["gbs"]), "--zero", "3",
                              "--recompute", p["recompute"], "--framework", "torchtitan", "--format", "json"]
                        + (["--no-sequence-parallel"] if not p["sequence_parallel"] else []))
    assert one.exit_code == 0, one.output
    assert json.loads(one.output)["iteration_time_s"] == pytest.approx(p["iteration_time_s"], rel=1e-9)
    bad = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--framework", "jax"])
    assert bad.exit_code == 2 and "framework value 'jax' is invalid" in bad.output


def test_the_shipped_gpu_calibration_is_not_applied_to_the_cpu_and_user_run_files_default_to_cv_none():
    from types import SimpleNamespace

    from planner.calibrate import DEFAULT_NAME, identity
    from planner.cli_validate import resolve_cv

    cpu, gpu = SimpleNamespace(gpu=SimpleNamespace(name="cpu")), SimpleNamespace(gpu=SimpleNamespace(name="h100-sxm"))
    shipped, mine = identity({"compute_scale": 1.5}, name=DEFAULT_NAME), identity({"compute_scale": 1.5}, name="mine")
    assert not shipped.applies_to(cpu) and shipped.applies_to(gpu) and mine.applies_to(cpu)
    assert resolve_cv(None, None, ["my_runs.csv"]) == "none"
    assert resolve_cv(None, None, []) == "source"  # the published runs: held-out figures only
