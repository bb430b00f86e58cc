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
    """Each measured fp8 GEMM is the cost model's time less (5 - TE's cast bytes) x M x K at the HBM bandwidth:
    1 byte per input element in forward and dgrad, all 5 in wgrad; other operators are untouched."""
    model = resolve_model("llama3-8b")
    hw = load_catalogue().resolve("h100-sxm", None, None)
    cm = default_cost_model()
    est = estimate(model, _plan(model, "fp8"), hw, cost_model=cm)
    seen = set()
    for key, op in _gemms(est).items():
        raw = float(cm.predict([op], hw).time_s[0])
        role = "wgrad" if op.name.endswith(".wgrad") else "dgrad" if op.name.endswith(".dgrad") else "fwd"
        m, _, k = op.features[:3]
        hbm = hbm_pass("x", op.phase, (5.0 - {"fwd": 4.0, "dgrad": 4.0, "wgrad": 0.0}[role]) * m * k, "bf16")
        want = max(raw - hbm_times(hw, [hbm])[hbm.key()], op.flops / (hw.gpu.peak_tflops["fp8"] * 1e12))
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
