"""costmodel.estimate: the one function that costs a plan, and the rule that nothing else assembles its steps."""

from __future__ import annotations

import ast

import pytest

import costmodel.estimate as E
from costmodel.core.errors import PlanError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.roofline import RooflineCostModel
from planner.calibrate import identity
from planner.prediction import predict
from tests.helpers import llama, plan, python_sources

STEPS = {"build_graph", "cost_operators", "corun_slowdown", "framework_kernels", "balanced_layer_split", "compose",
         "compose_iteration_time", "stage_times", "iteration_tail"}
"""The functions that cost a plan: its graph, its operator times and their adjustments, its composition."""
ADJUSTING_MODULES = {"fp8_block", "fp8_training", "moe_kernels"}
"""Modules whose ``apply`` adjusts a plan's operator times."""
OWN = {"costmodel/estimate.py": STEPS | {f"{m}.apply" for m in ADJUSTING_MODULES},
       "costmodel/schedule/compose.py": {"stage_times", "iteration_tail"}}
"""Who may call which: estimate.py everything; compose.py its own steps inside compose()."""


def _step_calls(tree: ast.AST) -> list[tuple[str, int]]:
    """(step, line) of every call of a costing step in a module."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in STEPS:
            out.append((f.id, node.lineno))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.attr in STEPS:
                out.append((f.attr, node.lineno))
            elif f.attr == "apply" and f.value.id in ADJUSTING_MODULES:
                out.append((f"{f.value.id}.apply", node.lineno))
    return out


def test_only_estimate_assembles_the_costing_steps():
    calls = {path: _step_calls(tree) for path, tree in python_sources(("planner", "costmodel"))}
    bad = [f"{path}:{line} calls {name}" for path, found in calls.items() for name, line in found
           if name not in OWN.get(path, set())]
    assert not bad, "cost plans through costmodel.estimate.estimate: " + "; ".join(bad)
    assert {"build_graph", "cost_operators", "compose", "fp8_block.apply", "fp8_training.apply",
            "moe_kernels.apply"} <= \
        {name for name, _ in calls["costmodel/estimate.py"]}


def test_the_scanner_sees_a_hand_assembled_costing():
    tree = ast.parse("g = build_graph(m, p)\nt = C.cost_operators(g, hw, cm)\nt = fp8_block.apply(p, hw, g, t)\n"
                     "x = compose(m, p, hw, g, t.time_s)\ny = other.apply(1)")
    assert [n for n, _ in _step_calls(tree)] == ["build_graph", "cost_operators", "fp8_block.apply", "compose"]


def test_adjustments_are_one_named_list_in_order_calibration_last():
    assert [a.name for a in E.ADJUSTMENTS] == ["block-scaled FP8", "FP8 training basis", "co-run slowdown",
                                               "framework kernels",
                                               "grouped expert GEMMs", "calibration"]


@pytest.fixture(scope="module")
def a100():
    return load_catalogue().resolve("a100-80gb", None, None)


ROOF = RooflineCostModel()


def test_time_mode_gives_the_full_iteration_time_and_metrics(a100):
    m = llama(layers=30)  # PP=4 does not divide 30 layers: the split is chosen
    p = plan(gpus=32, gbs=64, seq=2048, tp=2, pp=4).validate(m)
    cal = identity({"compute_scale": 1.2, "comm_scale": 0.9, "iteration_overhead_s": 0.1, "overlap_efficiency": 0.5})
    full = E.estimate(m, p, a100, cost_model=ROOF, calibration=cal)
    fast = E.estimate(m, p, a100, cost_model=ROOF, calibration=cal, mode="time")
    assert full.plan.layer_split is not None and fast.plan.layer_split == full.plan.layer_split
    assert fast.iteration_time_s == full.iteration_time_s == full.composition.iteration_time_s
    assert fast.metrics == full.metrics
    assert fast.composition is None and fast.warnings == ()


def test_recalibrated_is_the_estimate_with_that_calibration(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    cal = identity({"compute_scale": 1.3, "iteration_overhead_s": 0.2})
    plain = E.estimate(m, p, a100, cost_model=ROOF)
    direct = E.estimate(m, p, a100, cost_model=ROOF, calibration=cal)
    again = plain.recalibrated(cal)
    assert again.iteration_time_s == direct.iteration_time_s > plain.iteration_time_s + 0.2
    assert again.times.time_s == direct.times.time_s and again.costed == plain.costed
    assert plain.recalibrated(None).iteration_time_s == plain.iteration_time_s


def test_calibration_scales_compose_and_the_prediction_reports_the_estimate(a100):
    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    cal = identity({"compute_scale": 2.0})
    est = E.estimate(m, p, a100, cost_model=ROOF, calibration=cal)
    key = next(k for k in est.costed.time_s if k[0] == "gemm")
    assert est.times.time_s[key] == 2.0 * est.costed.time_s[key]
    pred = predict(m, p, a100, ROOF, calibration=cal)
    assert pred.iteration_time_s == est.iteration_time_s and pred.warnings == list(est.warnings)
    assert pred.memory_gib_per_gpu == est.metrics.memory.total / 2**30


def test_a_calibration_that_does_not_apply_is_skipped_with_a_note(a100):
    class Elsewhere(type(identity())):  # a calibration fitted for other hardware
        def applies_to(self, hardware):
            return False

    m = llama(layers=8)
    p = plan(gpus=16, gbs=64, seq=2048, tp=2, pp=2).validate(m)
    est = E.estimate(m, p, a100, cost_model=ROOF, calibration=Elsewhere("gpu-x", {"compute_scale": 3.0}))
    assert est.calibration is None
    assert est.iteration_time_s == E.estimate(m, p, a100, cost_model=ROOF).iteration_time_s
    assert any("'gpu-x'" in w and "not applied to a100-80gb" in w for w in est.input_warnings)


def test_an_invalid_plan_or_mode_is_refused(a100):
    m = llama(layers=8)
    with pytest.raises(PlanError):
        E.estimate(m, plan(gpus=16, gbs=64, seq=2048, tp=3), a100, cost_model=ROOF)
    with pytest.raises(ValueError, match="mode"):
        E.estimate(m, plan(gpus=16, gbs=64, seq=2048), a100, cost_model=ROOF, mode="fast")
