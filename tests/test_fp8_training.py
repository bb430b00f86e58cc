"""Per-tensor fp8 GEMMs on the training basis (costmodel/cost/fp8_training.py): the measured inference latency less
TRT-LLM's dynamic quantisation of the input, plus Transformer Engine's cast_transpose."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.presets import resolve_model
from costmodel.cost import fp8_training as FT
from costmodel.cost.framework_kernels import hbm_times
from costmodel.estimate import default_cost_model, estimate
from costmodel.graph.opbuild import hbm_pass
from planner.requests import PlanRequest


def _plan(model, dtype):
    req = PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, tp=1, mbs=1, gbs=8, seq_len=4096, dtype=dtype,
                      recompute="none", zero=1)
    return req.to_plan(model, gpus_per_node=8)


def _gemms(est):
    return {k: o for k, o in est.graph.distinct_operators().items() if o.kind == "gemm" and o.dtype == "fp8"}


def test_fp8_gemms_lose_the_quantisation_bytes_by_role():
    """Each measured fp8 GEMM is the cost model's time less a 5-byte pass over its M x K input plus TE's cast pass
    (4 bytes in forward and dgrad, none in wgrad), both at the HBM bandwidth."""
    model = resolve_model("llama3-8b")
    hw = load_catalogue().resolve("h100-sxm", None, None)
    cm = default_cost_model()
    est = estimate(model, _plan(model, "fp8"), hw, cost_model=cm)
    seen = set()
    for key, op in _gemms(est).items():
        raw = float(cm.predict([op], hw).time_s[0])
        role = "wgrad" if op.name.endswith(".wgrad") else "dgrad" if op.name.endswith(".dgrad") else "fwd"
        m, _, k = op.features[:3]
        dynamic, te = (hbm_pass(f"{n}", op.phase, b * m * k, "bf16")
                       for n, b in (("d", 5.0), ("t", {"fwd": 4.0, "dgrad": 4.0, "wgrad": 0.0}[role])))
        cast = hbm_times(hw, [te])[te.key()] if role != "wgrad" else 0.0
        want = max(raw - hbm_times(hw, [dynamic])[dynamic.key()] + cast,
                   op.flops / (hw.gpu.peak_tflops["fp8"] * 1e12))
        assert est.costed.time_s[key] == pytest.approx(want, rel=1e-9), op.name
        assert est.costed.time_s[key] < raw
        seen.add(role)
    assert seen == {"fwd", "dgrad", "wgrad"}
    assert any("fp8 GEMMs: measured inference latencies less" in w for w in est.warnings)


def test_bf16_and_fp8_block_plans_pass_through():
    model = resolve_model("llama3-8b")
    hw = load_catalogue().resolve("h100-sxm", None, None)
    for dtype in ("bf16", "fp8-block"):
        est = estimate(model, _plan(model, dtype), hw)
        assert FT.apply(est.plan, hw, est.graph, est.costed) is est.costed
        assert not any("fp8 GEMMs: measured" in w for w in est.warnings)


def test_time_never_below_the_fp8_peak():
    """A GEMM whose quantisation bytes exceed its measured time keeps its tensor-core time at the fp8 peak."""
    model = resolve_model("llama3-8b")
    hw = load_catalogue().resolve("h100-sxm", None, None)
    est = estimate(model, _plan(model, "fp8"), hw)
    key, op = next(iter(_gemms(est).items()))
    tiny = dataclasses.replace(est.costed, time_s={**est.costed.time_s, key: 1e-9})
    out = FT.apply(est.plan, hw, est.graph, tiny)
    assert out.time_s[key] == pytest.approx(op.flops / (hw.gpu.peak_tflops["fp8"] * 1e12))


def test_a_borrowed_gemm_loses_the_quantisation_at_the_measuring_gpus_bandwidth():
    """GH200 costs its GEMMs from H100 SXM's measurements: their quantisation ran at H100's 3.35 TB/s, TE's casts run at
    GH200's 4 TB/s, so an fp8 GH200 GEMM is never slower than the same H100 one (same die, faster HBM)."""
    cat = load_catalogue()
    gh, h100 = cat.resolve("gh200", None, 4), cat.resolve("h100-sxm", None, None)
    assert FT.measured_on(gh).gpu.name == "h100-sxm" and FT.measured_on(h100) is h100
    model = resolve_model("llama3-8b")
    plan = dataclasses.replace(_plan(model, "fp8"), gpus=4, gpus_per_node=4, gbs=4)
    a, b = (estimate(model, plan, hw) for hw in (gh, h100))
    for key, op in _gemms(a).items():
        assert a.costed.time_s[key] <= b.costed.time_s[key] * (1 + 1e-9), op.name


def test_the_measured_gpu_lookup_reads_the_models_folder_predictions_read(monkeypatch):
    """measured_on asks the one default cost model (the instance planner.models_dir clears when --models changes
    the folder), not a copy of its own that would keep answering from the folder it was first built on."""
    import costmodel.cost.measured as M

    assert default_cost_model is M.default_cost_model
    asked = []

    class Probe:
        def measured_on(self, hardware, name):
            asked.append((hardware.gpu.name, name))
            return hardware

    monkeypatch.setattr(FT, "default_cost_model", lambda: Probe())
    hw = load_catalogue().resolve("gh200", None, None)
    assert FT.measured_on(hw) is hw and asked == [("gh200", "gemm.fwd")]


def test_measured_on_is_the_cost_models_own_sibling_and_donor_resolution():
    """The GPU whose gemm.fwd model costs another: its own, a same-die sibling's (GH200 from H100 SXM, the HBM3e
    GH200 from H200), or its whole-GPU donor's (A100-40GB from A100-80GB, the 500 W H100 from H100 SXM)."""
    cm, cat = default_cost_model(), load_catalogue()
    want = {"h100-sxm": "h100-sxm", "gh200": "h100-sxm", "gh200-144gb": "h200", "a100-40gb": "a100-80gb",
            "h100-sxm-500w": "h100-sxm"}
    for gpu, donor in want.items():
        hw = cat.resolve(gpu, None, None)
        got = cm.measured_on(hw, "gemm.fwd")
        assert got.gpu.name == donor and got.cluster == hw.cluster, gpu
