"""Tests for costmodel.schedule.timeline: hand-computed schedules, closed form vs simulator."""


import numpy as np
import pytest

from costmodel.core.errors import PlannerError
from costmodel.schedule.timeline import pipeline_time, simulate_1f1b


def test_uniform_1f1b_hand_computed():
    """p=4, m=8, f=1, b=2: T = (m+p-1)(f+b) = 11*3 = 33 (SC21 §2.2.1), bubble 9/33 = 3/11."""
    r = pipeline_time([1.0] * 4, [2.0] * 4, 8)
    assert r.time_s == pytest.approx(33.0)
    assert r.bubble_s == pytest.approx(9.0)
    assert r.bubble_fraction == pytest.approx(3 / 11)
    s = simulate_1f1b([1.0] * 4, [2.0] * 4, 8)
    assert s.makespan_s == pytest.approx(33.0)
    assert s.busy_s == pytest.approx((24.0,) * 4)
    assert s.idle_s == pytest.approx((9.0,) * 4)


def test_interleaved_hand_drawn_timeline():
    """p=2, m=4, v=2, f=1, b=2 per stage -> chunk F = 0.5, chunk B = 1.0.

    Warm-up forwards: stage 0: (2-0-1)*2 + (2-1)*2 = 4, stage 1: 0 + 2 = 2. 'F2.1' is the
    forward of micro-batch 2 through chunk 1; stage 0 chunk 0 = layers of virtual stage 0,
    stage 1 chunk 0 = virtual stage 1, stage 0 chunk 1 = virtual stage 2, stage 1 chunk 1 = 3.

        t:    0   .5   1  1.5   2  2.5   3  ... (one column = 0.5)
        s0: F0.0 F1.0 F0.1 F1.1 F2.0 .  B0.1 B0.1 F3.0 B1.1 B1.1 F2.1 B0.0 B0.0 F3.1 B1.0 B1.0 .
            B2.1 B2.1 .  B3.1 B3.1 B2.0 B2.0 B3.0 B3.0                        -> ends at 13.5
        s1:  .  F0.0 F1.0 F0.1 B0.1 B0.1 F1.1 B1.1 B1.1 F2.0 B0.0 B0.0 F3.0 B1.0 B1.0 F2.1
            B2.1 B2.1 F3.1 B3.1 B3.1 B2.0 B2.0 B3.0 B3.0                     -> ends at 12.5

    T = m(f+b) + (p-1)(f+b)/v = 12 + 1.5 = 13.5 (SC21 §2.2.2); stage 0 idles 1.5.
    """
    s = simulate_1f1b([1.0, 1.0], [2.0, 2.0], 4, vpp=2, record=True)
    got = {i: [(f"{e.kind}{e.microbatch}.{e.chunk}", e.start_s, e.end_s)
               for e in s.events if e.stage == i] for i in range(2)}
    assert got[0] == [
        ("F0.0", 0.0, 0.5), ("F1.0", 0.5, 1.0), ("F0.1", 1.0, 1.5), ("F1.1", 1.5, 2.0),
        ("F2.0", 2.0, 2.5), ("B0.1", 3.0, 4.0), ("F3.0", 4.0, 4.5), ("B1.1", 4.5, 5.5),
        ("F2.1", 5.5, 6.0), ("B0.0", 6.0, 7.0), ("F3.1", 7.0, 7.5), ("B1.0", 7.5, 8.5),
        ("B2.1", 9.0, 10.0), ("B3.1", 10.5, 11.5), ("B2.0", 11.5, 12.5), ("B3.0", 12.5, 13.5)]
    assert got[1] == [
        ("F0.0", 0.5, 1.0), ("F1.0", 1.0, 1.5), ("F0.1", 1.5, 2.0), ("B0.1", 2.0, 3.0),
        ("F1.1", 3.0, 3.5), ("B1.1", 3.5, 4.5), ("F2.0", 4.5, 5.0), ("B0.0", 5.0, 6.0),
        ("F3.0", 6.0, 6.5), ("B1.0", 6.5, 7.5), ("F2.1", 7.5, 8.0), ("B2.1", 8.0, 9.0),
        ("F3.1", 9.0, 9.5), ("B3.1", 9.5, 10.5), ("B2.0", 10.5, 11.5), ("B3.0", 11.5, 12.5)]
    assert s.makespan_s == pytest.approx(13.5)
    r = pipeline_time([1.0, 1.0], [2.0, 2.0], 4, vpp=2)
    assert r.time_s == pytest.approx(13.5)
    assert r.bubble_fraction == pytest.approx(1.5 / 13.5)


@pytest.mark.parametrize("vpp", [1, 3])
def test_single_stage_has_no_bubble(vpp):
    r = pipeline_time([1.5], [2.5], 6, vpp=vpp, p2p_s=0.7)  # p2p is irrelevant with one device
    assert r.time_s == pytest.approx(6 * 4.0)
    assert r.bubble_s == pytest.approx(0.0)
    assert simulate_1f1b([1.5], [2.5], 6, vpp=vpp, p2p_s=0.7).makespan_s == pytest.approx(24.0)


def test_uniform_closed_form_equals_simulator():
    """Exact for uniform stages: 1F1B for any p2p (m < p included), interleaved for p2p <= chunk."""
    f, b = 1.0, 2.5
    cases = 0
    for p in range(1, 7):
        for m in range(1, 13):
            for c in (0.0, 0.05, 0.4, 3.0):  # 1F1B: exact for any p2p, even above a stage's time
                sim = simulate_1f1b([f] * p, [b] * p, m, 1, c).makespan_s
                assert pipeline_time([f] * p, [b] * p, m, 1, c).time_s == pytest.approx(sim), \
                    (p, m, c)
                cases += 1
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p, 5 * p):
                for c in (0.0, 0.1 * f / v, f / v):  # exact while p2p <= min(f, b)/v
                    sim = simulate_1f1b([f] * p, [b] * p, m, v, c).makespan_s
                    assert pipeline_time([f] * p, [b] * p, m, v, c).time_s == \
                        pytest.approx(sim), (p, m, v, c)
                    cases += 1
    assert cases > 400


def test_single_heavy_stage_exact_1f1b():
    """Heavy first or last stage (embedding / LM head): the closed form equals the simulator."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        p, m = int(rng.integers(2, 9)), int(rng.integers(1, 25))
        s = np.ones(p)
        s[0 if rng.random() < 0.5 else -1] = rng.uniform(0.5, 2.0)
        f, b = list(s), list(s * rng.uniform(1.5, 3.0))
        assert pipeline_time(f, b, m).time_s == pytest.approx(simulate_1f1b(f, b, m).makespan_s)


def _max_rel_dev(rng, v, p2p_frac, n):
    worst = 0.0
    for _ in range(n):
        p = int(rng.integers(2, 9))
        m = int(rng.integers(1, 25)) if v == 1 else p * int(rng.integers(1, 5))
        s = rng.uniform(0.5, 1.5, p)
        f, b = list(s), list(s * rng.uniform(1.5, 3.0))
        c = rng.uniform(0.0, p2p_frac) * min(min(f), min(b)) / v
        sim = simulate_1f1b(f, b, m, v, c).makespan_s
        worst = max(worst, abs(pipeline_time(f, b, m, v, c).time_s - sim) / sim)
    return worst


def test_imbalanced_stages_within_bound():
    """Random per-stage scale in [0.5, 1.5], b/f in [1.5, 3], p in 2..8.

    Max |closed form - simulator| / simulator measured when written (seed 3, 200 cases each):
    1F1B no p2p 1.9%; 1F1B p2p <= chunk time 10.4%; interleaved (v=2,4) no p2p 13.4%;
    interleaved p2p <= chunk time 17.2%. Bounds below add a little margin for other seeds.
    """
    rng = np.random.default_rng(11)
    assert _max_rel_dev(rng, 1, 0.0, 60) < 0.03
    assert _max_rel_dev(rng, 1, 1.0, 60) < 0.12
    assert _max_rel_dev(rng, 2, 0.0, 40) < 0.15
    assert _max_rel_dev(rng, 4, 1.0, 25) < 0.20


def test_bubble_shrinks_with_microbatches_and_vpp():
    f, b = [1.0, 1.2, 0.9, 1.1], [2.0, 2.3, 1.9, 2.2]
    fr = [pipeline_time(f, b, m).bubble_fraction for m in (4, 8, 16, 32)]
    assert all(x > y for x, y in zip(fr, fr[1:]))
    fv = [pipeline_time(f, b, 8, vpp=v).bubble_fraction for v in (1, 2, 4)]
    assert all(x > y for x, y in zip(fv, fv[1:]))
    sv = [simulate_1f1b(f, b, 8, vpp=v).makespan_s for v in (1, 2, 4)]
    assert all(x > y for x, y in zip(sv, sv[1:]))


def test_fewer_microbatches_than_stages():
    """m < p: every stage runs all its forwards then its backwards; closed form stays exact."""
    for m in (1, 2, 3):
        sim = simulate_1f1b([1.0] * 6, [2.0] * 6, m, p2p_s=0.1).makespan_s
        assert pipeline_time([1.0] * 6, [2.0] * 6, m, p2p_s=0.1).time_s == pytest.approx(sim)
    assert pipeline_time([1.0] * 6, [2.0] * 6, 1).time_s == pytest.approx(6 * 3.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_microbatches=0), "positive integer"),
    (dict(num_microbatches=2.0), "positive integer"),
    (dict(num_microbatches=3, vpp=2), "pipeline size"),
    (dict(num_microbatches=8, vpp=0), "vpp"),
    (dict(num_microbatches=8, p2p_s=-1.0), ">= 0"),
])
def test_validation(kwargs, match):
    for fn in (pipeline_time, simulate_1f1b):
        with pytest.raises(PlannerError, match=match):
            fn([1.0] * 4, [2.0] * 4, **kwargs)
    with pytest.raises(ValueError):  # PlannerError is a ValueError
        pipeline_time([1.0] * 4, [2.0] * 4, **kwargs)
    with pytest.raises(PlannerError, match="equally long"):
        pipeline_time([1.0] * 4, [2.0] * 3, 8)
