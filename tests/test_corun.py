"""Co-run slowdown term: shape choice, per-kind factor, measurement file, CPU hardware figure, prediction
(costmodel/profiling/sampling/corun.py)."""

import dataclasses

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.profiling.sampling import corun
from costmodel.profiling.sampling.plan import Sample, expand, load_plan
from planner.prediction import predict
from tests.helpers import cpu_profile_datasets, llama, plan, write_json


def test_pick_shapes_spreads_over_sizes_per_kind_and_direction():
    samples = [Sample("residual_add", "fwd", "fp32", (n,)) for n in (5, 1, 9, 3, 7)]
    samples += [Sample("gemm", d, "fp32", (m, 8, 8)) for d in ("fwd", "bwd") for m in (8, 16)]
    got = corun.pick_shapes(samples, 3)
    assert [s.features[0] for s in got[("residual_add", "fwd")]] == [1, 5, 9]  # smallest, middle, largest
    assert len(got[("gemm", "fwd")]) == 2 and len(got[("gemm", "bwd")]) == 2
    # the cpu-workload plan: every compute kind and direction, 4 shapes each where it has that many
    picked = corun.pick_shapes(expand(load_plan("cpu-workload")), 4)
    assert {k for k, _ in picked} == {s.kind for s in expand(load_plan("cpu-workload"))}
    assert all(1 <= len(v) <= 4 for v in picked.values())


def test_slowdown_is_ratio_of_sums_per_kind():
    rows = [{"kind": "gemm", "alone_s": 1.0, "together_s": 1.1}, {"kind": "gemm", "alone_s": 3.0, "together_s": 3.0},
            {"kind": "norm", "alone_s": 0.5, "together_s": 1.0}]
    assert corun.slowdown(rows) == pytest.approx({"gemm": 4.1 / 4.0, "norm": 2.0})
    with pytest.raises(PlannerError, match="no time recorded for norm"):
        corun.slowdown([{"kind": "norm", "alone_s": 0.0, "together_s": 1.0}])


def _corun_file(tmp_path, **over):
    data = {"format": 1, "ranks": 2, "slowdown": {"gemm": 1.03, "residual_add": 1.4}, "rows": []}
    return write_json(tmp_path, corun.CORUN_FILE, data, **over)


def test_load_validates(tmp_path):
    assert corun.load([tmp_path]) is None
    got = corun.load([_corun_file(tmp_path)])
    assert got["slowdown"]["residual_add"] == 1.4 and got["path"].endswith(corun.CORUN_FILE)
    for bad in ({"ranks": 1}, {"slowdown": {}}, {"slowdown": {"gemm": float("nan")}}, {"slowdown": {"gemm": 50.0}},
                {"format": 2}, {"slowdown": {"gemm": True}}):
        _corun_file(tmp_path, **bad)
        with pytest.raises(PlannerError, match="not a co-run file"):
            corun.load([tmp_path])
    (tmp_path / corun.CORUN_FILE).write_text("[1,")
    with pytest.raises(PlannerError, match="not readable JSON"):
        corun.load([tmp_path])


def test_cpu_hardware_carries_measured_corun(tmp_path):
    from costmodel.fitting.cpu_hardware import derive, to_toml

    assert "corun_slowdown" not in derive(cpu_profile_datasets())["clusters"]["cpu-host"]
    entry = derive(cpu_profile_datasets(), None, corun.load([_corun_file(tmp_path)]))
    c = entry["clusters"]["cpu-host"]
    assert c["corun_slowdown"] == {"gemm": 1.03, "residual_add": 1.4} and c["corun_ranks"] == 2
    assert "corun_slowdown" in c["sources"] and "residual_add 1.40" in c["notes"]
    (tmp_path / "hardware.toml").write_text(to_toml(entry))
    hw = load_catalogue([tmp_path / "hardware.toml"]).resolve("cpu")
    assert hw.cluster.corun_slowdown == {"gemm": 1.03, "residual_add": 1.4} and hw.cluster.corun_ranks == 2
    for old, new in (("gemm = 1.03", "gemm = -1.03"), ("gemm = 1.03", "all_reduce = 1.03")):
        (tmp_path / "hardware.toml").write_text(to_toml(entry).replace(old, new))
        with pytest.raises(PlannerError, match="corun_slowdown"):
            load_catalogue([tmp_path / "hardware.toml"])


def _hw(factors, ranks=2):
    hw = load_catalogue().resolve("a100-80gb")
    return dataclasses.replace(hw, cluster=dataclasses.replace(hw.cluster, corun_slowdown=factors, corun_ranks=ranks))


def test_prediction_scales_compute_kinds_when_ranks_share_a_node():
    from costmodel.cost.roofline import RooflineCostModel

    # tiny layers replayed from CUDA graphs: the GPU times under test set the step, not the host floor
    model, cm = llama(layers=4, hidden=1024, heads=8, kv=8, ffn=2816, vocab=8192, seq=1024), RooflineCostModel()
    one = plan(gpus=1, gpn=1, gbs=4, seq=1024, mbs=1, cuda_graphs=True)
    assert (predict(model, one, _hw({"gemm": 2.0}), cm).iteration_time_s
            == predict(model, one, _hw({}), cm).iteration_time_s)
    two = plan(gpus=2, gpn=2, gbs=4, seq=1024, mbs=1, cuda_graphs=True, tp=2)
    base, slow = predict(model, two, _hw({}), cm), predict(model, two, _hw({"gemm": 2.0}), cm)
    assert slow.iteration_time_s > base.iteration_time_s
    # the GEMM rows double against the collectives, which do not move
    b_rows = {r["operator"]: r["time_s"] for r in base.breakdown}
    s_rows = {r["operator"]: r["time_s"] for r in slow.breakdown}
    ratio = lambda rows: rows["mlp_up"] / rows["tp.mlp_down.reducescatter"]  # noqa: E731
    assert ratio(s_rows) == pytest.approx(2 * ratio(b_rows), rel=1e-9)
    assert s_rows["tp.mlp_down.reducescatter"] == pytest.approx(b_rows["tp.mlp_down.reducescatter"], rel=1e-9)
    # one rank per node (2 nodes): no sharing, no term; a different rank count than measured is said
    apart = plan(gpus=2, gpn=1, gbs=4, seq=1024, mbs=1, cuda_graphs=True, tp=2)
    assert (predict(model, apart, _hw({"gemm": 2.0}), cm).iteration_time_s
            == predict(model, apart, _hw({}), cm).iteration_time_s)
    four = plan(gpus=4, gpn=4, gbs=4, seq=1024, mbs=1, cuda_graphs=True, tp=4)
    assert any("co-run slowdown measured with 2 ranks per node, used unchanged for 4" in w
               for w in predict(model, four, _hw({"gemm": 1.1}), cm).warnings)


def test_catalogue_gpu_clusters_have_no_corun_term():
    assert all(not c.corun_slowdown for c in load_catalogue().clusters.values())
