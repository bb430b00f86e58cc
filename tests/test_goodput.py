"""The goodput model (costmodel/schedule/goodput.py) against the published figures of GOODPUT_FACTS.md §3 and §6."""

from __future__ import annotations

import math

import pytest

from costmodel.core.errors import PlannerError
from costmodel.schedule.goodput import (
    DEFAULT_FAILURE_RATE,
    FailureModel,
    checkpoint_bytes_per_param,
    daly_interval,
    ettr_closed_form,
    ettr_exact,
    goodput,
    perfect_run,
    young_interval,
)

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize("mtbf_min, derived, caption", [(24 * 60, 116.7, 117), (6 * 60, 56.7, 57), (15, 9.14, 9.1)])
def test_daly_interval_matches_the_papers_figure_captions(mtbf_min, derived, caption):
    """GOODPUT_FACTS.md §3.2: with delta = 5 min eq. 37 gives 116.7, 56.7 and 9.14 min at M = 24 h, 6 h, 15 min; the
    paper's figure captions report 117, 57 and 9.1 min."""
    tau = daly_interval(5 * MIN, mtbf_min * MIN) / MIN
    assert tau == pytest.approx(derived, abs=0.05)
    assert round(tau, 0 if caption >= 10 else 1) == caption


def test_daly_is_young_to_first_order_and_caps_at_m():
    assert daly_interval(1.0, 1e7) == pytest.approx(young_interval(1.0, 1e7), rel=1e-3)
    assert daly_interval(100.0, 40.0) == 40.0  # delta >= 2M: tau = M


@pytest.mark.parametrize("interval_min, published", [(60, 0.70), (5, 0.93)])
def test_meta_rsc1_16k_gpu_job(interval_min, published):
    """GOODPUT_FACTS.md §3.4: 2,000 nodes at RSC-1's 6.5 failures per 1,000 node-days, restart 5 min, no save cost:
    the paper reports ETTR 0.7 (60-min checkpoints) and 0.93 (5-min)."""
    mtbf = 1.0 / (2000 * 6.5e-3 / 86400.0)
    value = ettr_closed_form(interval_min * MIN, 0.0, 5 * MIN, mtbf)
    assert value == pytest.approx(published, abs=0.02)


# GOODPUT_FACTS.md §6.3: lambda = 1.97e-5 / GPU-h, R = 10 min, no planned interruptions, no slow-down
ROWS = [  # (GPUs, delta s, Daly tau min, ETTR closed form, simulation)
    (16384, 60.0, 18.6, 0.850, 0.854),
    (16384, 5.0, 5.5, 0.917, 0.921),
    (1024, 60.0, 76.4, 0.971, 0.971),
    (1024, 5.0, 22.2, 0.989, 0.989),
]


@pytest.mark.parametrize("gpus, delta, tau_min, closed, simulated", ROWS)
def test_goodput_facts_table_6_3(gpus, delta, tau_min, closed, simulated):
    fm = FailureModel(failure_rate=1.97e-5, planned_per_day=0.0, restart_s=600.0, ckpt_mode="async",
                      async_stall_s=delta, slowdown=0.0)
    g = goodput(405e9, gpus, fm)
    assert g.mtbf_s / HOUR == pytest.approx(3.09 if gpus == 16384 else 49.5, abs=0.1)
    assert g.interval_s / MIN == pytest.approx(tau_min, abs=0.1)
    assert g.goodput == pytest.approx(closed, abs=0.001)  # the table rounds to 3 decimals
    assert ettr_exact(g.interval_s, delta, 600.0, g.mtbf_s) == pytest.approx(simulated, abs=0.004)


def test_rsc1_rates_at_16k_gpus():
    """§6.3 last bullet: RSC-1 rates (6.5 per 1,000 node-days) give M = 1.8 h at 16,384 GPUs and ETTR ~0.87 with
    5-s async saves, ~0.79 with 60-s sync saves (R = 10 min)."""
    rate = 6.5e-3 / (8 * 24)
    for delta, published in ((5.0, 0.87), (60.0, 0.79)):
        fm = FailureModel(failure_rate=rate, planned_per_day=0.0, ckpt_mode="async", async_stall_s=delta, slowdown=0)
        g = goodput(405e9, 16384, fm)
        assert g.mtbf_s / HOUR == pytest.approx(1.8, abs=0.01)
        assert g.goodput == pytest.approx(published, abs=0.01)


def test_defaults_at_llama3_scale_exceed_90_percent_before_slowdown():
    """F3: Llama 3 reports > 90 % effective training time at 16,384 H100; the default model (sync saves at
    2 TB/s aggregate, 10-min restarts, planned interruptions) agrees, and goodput stays above 0.85 with the 1.5 %
    slow-down."""
    g = goodput(405e9, 16384)
    assert g.checkpoint_bytes == pytest.approx(14 * 405e9)
    assert g.blocking_s == pytest.approx(14 * 405e9 / (0.122e9 * 16384))
    assert g.ettr > 0.90
    assert 0.85 < g.goodput < g.ettr


def test_goodput_falls_with_the_gpu_count_and_the_failure_rate():
    values = [goodput(70e9, n).goodput for n in (64, 512, 4096, 32768)]
    assert values == sorted(values, reverse=True)
    assert goodput(70e9, 4096, FailureModel(failure_rate=8.1e-5)).goodput < goodput(70e9, 4096).goodput


def test_run_accounting():
    g = goodput(70e9, 1024)
    ideal = 20 * 86400.0
    wall = g.wall_s(ideal)
    assert wall == pytest.approx(ideal / g.goodput)
    unplanned, planned = g.interruptions(wall)
    assert unplanned == pytest.approx(DEFAULT_FAILURE_RATE * 1024 * wall / HOUR)
    assert planned == pytest.approx(47 / 54 * wall / 86400.0)
    assert g.lost_gpu_hours(ideal) == pytest.approx((wall - ideal) * 1024 / HOUR)
    assert g.interval_iterations(10.0) == round(g.interval_s / 10.0)


def test_given_interval_and_perfect_run():
    g = goodput(70e9, 1024, FailureModel(interval_s=1800.0))
    assert g.interval_s == 1800.0 and g.interval_given
    assert goodput(70e9, 1024, perfect_run()).goodput == 1.0


def test_an_allocation_failing_faster_than_it_restarts_has_no_goodput():
    g = goodput(70e9, 100000, FailureModel(failure_rate=1e-3, restart_s=3600.0))
    assert g.goodput == 0.0 and g.wall_s(1.0) is None and g.lost_gpu_hours(1.0) is None


def test_checkpoint_bytes_follow_precision_and_framework():
    assert checkpoint_bytes_per_param("bf16", "megatron") == 14.0
    assert checkpoint_bytes_per_param("fp8", "megatron") == 14.0
    assert checkpoint_bytes_per_param("bf16", "torchtitan") == 12.0
    assert checkpoint_bytes_per_param("fp32", "megatron") == 12.0


@pytest.mark.parametrize("kw", [{"failure_rate": -1.0}, {"restart_s": math.nan}, {"ckpt_mode": "lazy"},
                                {"storage_gbs": 0.0}, {"interval_s": -5.0}, {"slowdown": 1.0}])
def test_bad_inputs_are_refused(kw):
    with pytest.raises(PlannerError):
        FailureModel(**kw)
