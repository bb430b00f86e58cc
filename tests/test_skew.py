"""Rank skew (straggler) term: measurement file, CPU hardware figure, timeline wait."""

import dataclasses
import math

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.profiling.sampling import skew
from costmodel.schedule import straggler
from planner.prediction import predict
from tests.helpers import cpu_profile_datasets, llama, plan, write_json


@pytest.mark.parametrize("n, expected", [(1, 0.0), (2, 1 / math.sqrt(math.pi)), (3, 0.8463), (4, 1.0294),
                                         (5, 1.1630), (10, 1.5388)])
def test_expected_max_normal_matches_tables(n, expected):
    # Tippett (1925) / standard order-statistics tables: E[max of n standard normals]
    assert straggler.expected_max_normal(n) == pytest.approx(expected, abs=2e-4)


def test_rank_scale():
    assert straggler.rank_scale(1, 2) == 0.0
    assert straggler.rank_scale(2, 2) == pytest.approx(1.0)
    assert straggler.rank_scale(4, 2) == pytest.approx(1.0294 * math.sqrt(math.pi), rel=1e-3)


def test_pooled_excess_is_ratio_of_sums():
    segs = [{"sum_max_s": 1.1, "sum_mean_s": 1.0}, {"sum_max_s": 2.0, "sum_mean_s": 2.0}]
    assert skew.pooled_excess(segs) == pytest.approx(3.1 / 3.0 - 1)
    with pytest.raises(PlannerError, match="no segment"):
        skew.pooled_excess([{"sum_max_s": 0.0, "sum_mean_s": 0.0}])


def _skew_file(tmp_path, **over):
    data = {"format": 1, "ranks": 2, "excess": 0.07,
            "segments": [{"segment_s": 0.002, "repeats": 10, "sum_max_s": 0.0214, "sum_mean_s": 0.02, "excess": 0.07}]}
    return write_json(tmp_path, skew.SKEW_FILE, data, **over)


def test_load_validates(tmp_path):
    assert skew.load([tmp_path]) is None
    got = skew.load([_skew_file(tmp_path)])
    assert got["excess"] == 0.07 and got["path"].endswith(skew.SKEW_FILE)
    for bad in ({"excess": -0.1}, {"excess": float("nan")}, {"ranks": 1}, {"segments": []}, {"format": 99}):
        _skew_file(tmp_path, **bad)
        with pytest.raises(PlannerError, match="not a sync-skew file"):
            skew.load([tmp_path])
    (tmp_path / skew.SKEW_FILE).write_text("{not json")
    with pytest.raises(PlannerError, match="not readable JSON"):
        skew.load([tmp_path])


def test_cpu_hardware_carries_measured_skew(tmp_path):
    from costmodel.fitting.cpu_hardware import derive, to_toml

    assert "straggler_excess" not in derive(cpu_profile_datasets())["clusters"]["cpu-host"]
    entry = derive(cpu_profile_datasets(), skew.load([_skew_file(tmp_path)]))
    c = entry["clusters"]["cpu-host"]
    assert c["straggler_excess"] == 0.07 and c["straggler_ranks"] == 2 and "straggler_excess" in c["sources"]
    (tmp_path / "hardware.toml").write_text(to_toml(entry))
    hw = load_catalogue([tmp_path / "hardware.toml"]).resolve("cpu")
    assert hw.cluster.straggler_excess == pytest.approx(0.07) and hw.cluster.straggler_ranks == 2
    (tmp_path / "hardware.toml").write_text(to_toml(entry).replace("straggler_excess = 0.07",
                                                                  "straggler_excess = -0.07"))
    with pytest.raises(PlannerError, match="straggler_excess"):
        load_catalogue([tmp_path / "hardware.toml"])


def _hw(excess, ranks=2):
    hw = load_catalogue().resolve("a100-80gb")
    return dataclasses.replace(hw, cluster=dataclasses.replace(hw.cluster, straggler_excess=excess,
                                                               straggler_ranks=ranks))


def test_timeline_adds_excess_of_compute_on_multi_rank_plans_only():
    from costmodel.cost.roofline import RooflineCostModel

    # tiny layers replayed from CUDA graphs: the GPU times under test set the step, not the host floor
    model, cm = llama(layers=4, hidden=1024, heads=8, kv=8, ffn=2816, vocab=8192, seq=1024), RooflineCostModel()
    one = plan(gpus=1, gpn=1, gbs=4, seq=1024, mbs=1, cuda_graphs=True)
    assert predict(model, one, _hw(0.1), cm).iteration_time_s == predict(model, one, _hw(0.0), cm).iteration_time_s
    for kw in (dict(tp=2), dict(pp=2), dict()):  # TP, PP, DP on 2 ranks
        two = plan(gpus=2, gpn=2, gbs=4, seq=1024, mbs=1, cuda_graphs=True, **kw)
        base, with_skew = predict(model, two, _hw(0.0), cm), predict(model, two, _hw(0.1), cm)
        wait = with_skew.iteration_time_s - base.iteration_time_s
        rows = {r["operator"]: r for r in with_skew.breakdown}
        assert "sync.rank_skew_wait" in rows and "sync.rank_skew_wait" not in {r["operator"] for r in base.breakdown}
        # the wait is 10 % of the slowest stage's compute: less than 10 % of the whole iteration (which also
        # holds communication and bubbles), more than 10 % of the compute of one micro-batch
        assert 0 < wait < 0.1 * base.iteration_time_s
        assert wait > 0.1 * max(f + b for f, b in base.stage_times_s) * 0.5
        assert rows["sync.rank_skew_wait"]["time_s"] == pytest.approx(wait, rel=0.15)  # breakdown rows are rescaled
    # more ranks than measured: scaled by E[max of n normals] and said in the warnings
    four = plan(gpus=4, gpn=4, gbs=4, seq=1024, mbs=1, cuda_graphs=True, tp=4)
    w2 = (predict(model, four, _hw(0.1, ranks=4), cm).iteration_time_s
          - predict(model, four, _hw(0.0), cm).iteration_time_s)
    p4 = predict(model, four, _hw(0.1, ranks=2), cm)
    w4 = p4.iteration_time_s - predict(model, four, _hw(0.0), cm).iteration_time_s
    assert w4 == pytest.approx(w2 * straggler.rank_scale(4, 2), rel=1e-6)
    assert any("rank skew measured on 2 ranks, extrapolated to 4" in w for w in p4.warnings)


def test_catalogue_gpu_clusters_have_no_skew():
    # not measured for the catalogue's GPU clusters: published-run predictions are unchanged by the term
    assert all(c.straggler_excess == 0.0 for c in load_catalogue().clusters.values())
