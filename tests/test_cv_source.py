"""planner validate --cv source: leave-one-source-out calibration, 80 % intervals from other sources' residuals,
the shipped default calibration and --calibration none."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import costmodel.estimate as E
import planner.calibrate as C
import planner.prediction as P
from costmodel.core.errors import PlannerError
from costmodel.cost.roofline import RooflineCostModel
from costmodel.profiling.workloads.runner import write_runs_csv
from planner import intervals as I
from planner.cli import app
from planner.source_cv import validate_source_cv
from planner.validation.report import validate_files
from planner.validation.runs import default_hardware, load_runs, row_to_inputs

# three sources whose runs take 1.2x the roofline time (a 2 % deterministic spread), one (SRCX) at 3x
FACTORS = {"SRCA": 1.2, "SRCB": 1.2, "SRCC": 1.2, "SRCX": 3.0}
SPREAD = (-0.02, -0.01, 0.0, 0.005, 0.01, 0.02)
SHAPES = [(4, 1024, 16, 2816), (8, 1024, 16, 2816), (4, 2048, 16, 5504), (8, 2048, 16, 5504),
          (6, 1536, 16, 4096), (6, 1024, 16, 2816)]


@pytest.fixture(scope="module")
def roofline():
    return RooflineCostModel()


def _rows(measured=None):
    rows = []
    for src in FACTORS:
        for j, (L, h, a, f) in enumerate(SHAPES):
            rid = f"{src}-{j:03d}"
            rows.append(dict(
                id=rid, source=f"synthetic {src} (tests/test_cv_source.py)", model_name=f"syn-{L}L-{h}h",
                n_layers=L, hidden=h, n_heads=a, n_kv_heads=a, ffn_hidden=f, vocab=32000, seq_len=2048,
                arch_notes="SwiGLU, RMSNorm, RoPE", gpu="A100-80GB", n_gpus=1, gpus_per_node=8, tp=1, pp=1, dp=1,
                cp=1, mbs=1, gbs=4, recompute="none", seq_parallel="n", dist_optimizer_or_zero="none",
                precision="bf16", framework="synthetic", measured_metric="iteration_time_s",
                measured_value=1.0 if measured is None else measured[rid],
                notes="TIER=A; synthetic; CUDA graphs (local, full scope): GPU time only, no host floor"))
    return rows


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory, roofline):
    path = write_runs_csv(_rows(), tmp_path_factory.mktemp("cv") / "runs.csv")
    hw_fn, measured = default_hardware(), {}
    for row in load_runs(path):
        model, p, gpu_key, gpn = row_to_inputs(row)
        t = P.predict(model, p, hw_fn(gpu_key, gpn, row.cluster), roofline).iteration_time_s
        j = int(row.id.rsplit("-", 1)[1])
        measured[row.id] = f"{t * FACTORS[row.prefix] * (1 + SPREAD[j]):.6g}"
    return write_runs_csv(_rows(measured), path)


@pytest.fixture(scope="module")
def report(runs_file, roofline):
    return validate_source_cv(load_runs(runs_file), constants="compute_scale", cost_model=roofline)


def test_held_out_source_is_never_in_its_fold(report):
    """SRCX alone would fit compute_scale ~3; its fold must have seen only the 1.2x sources."""
    fold = {tuple(f["held_out"]): f["constants"]["compute_scale"] for f in report.folds}
    assert set(fold) == {(s,) for s in FACTORS}
    assert fold[("SRCX",)] == pytest.approx(1.2, rel=0.01)
    assert fold[("SRCA",)] > 1.4  # pulled up by SRCX, which that fold did see
    x = [r for r in report.rows if r.source == "SRCX"]
    assert len(x) == len(SHAPES) and all(r.error == pytest.approx(1.2 / 3.0 - 1.0, abs=0.03) for r in x)
    assert report.in_sample["constants"]["compute_scale"] > 1.4  # in-sample, every source seen


def test_interval_comes_from_other_sources_only(report):
    x = [r for r in report.rows if r.source == "SRCX"]
    others = [r for r in report.rows if r.source != "SRCX"]
    # SRCX's band rests on the 18 residuals of SRCA/B/C, all positive (those folds saw SRCX): its -0.9 ones lie
    # outside
    assert all(r.interval_n == 3 * len(SHAPES) and r.covered is False for r in x)
    assert all(r.interval_high < r.measured for r in x)  # predicted 2.5x too fast, band below the run
    recs = [{"source": r.source, "gpu": r.gpu, "framework": "megatron",
             "residual": math.log(r.predicted / r.measured)} for r in others]
    _, group = I.lookup(I.fit_intervals(recs), "a100-80gb", "megatron")
    assert x[0].interval_low == pytest.approx(x[0].predicted * math.exp(-group["q_high"]), rel=1e-9)
    assert x[0].interval_group == "pooled"  # 3 other sources: too few for a regime band (MIN_GROUP_SOURCES)
    src = {s.value: s for s in report.summaries if s.group == "source"}
    assert src["SRCX"].interval_coverage == 0.0
    overall = report.overall()
    flags = [r.covered for r in report.rows]
    assert overall.interval_coverage == pytest.approx(sum(flags) / len(flags))


def test_json_keys(report):
    d = report.to_dict()
    assert d["cv"] == "source" and list(d)[0] == "cv"
    overall = next(s for s in d["summaries"] if s["group"] == "overall")
    assert {"group", "value", "n", "mape_pct", "bias_pct", "interval_coverage"} <= set(overall)
    assert overall["n"] == len(FACTORS) * len(SHAPES)
    assert {"constants", "folds", "in_sample", "uncalibrated"} <= set(d)


def test_interval_table_groups_and_fallback():
    # one run per source: source-shifted residuals are the residuals themselves
    n = I.MIN_GROUP_SOURCES
    recs = [{"source": f"S{i}", "gpu": "h100-sxm", "framework": "fsdp", "residual": 0.1 * i} for i in range(n)]
    recs += [{"source": f"T{i}", "gpu": "a100-80gb", "framework": "fsdp", "residual": -0.1} for i in range(3)]
    t = I.fit_intervals(recs)
    key, g = I.lookup(t, "h100-sxm", "fsdp")
    assert key == "gpu_family=hopper,framework=fsdp" and g["n"] == n and g["sources"] == n
    want = np.percentile(np.repeat([0.1 * i for i in range(n)], n), (10, 90))  # n source means x n zero deviations
    assert (g["q_low"], g["q_high"]) == pytest.approx(tuple(want))
    key, g = I.lookup(t, "a100-80gb", "fsdp")  # 3 ampere runs: falls back to the framework group
    assert key == "framework=fsdp" and g["n"] == n + 3
    few = I.fit_intervals(recs[1:])  # n - 1 hopper sources: too few for a band of its own
    assert I.lookup(few, "h100-sxm", "fsdp")[0] == "framework=fsdp"
    key, _ = I.lookup(t, "b200", "megatron")
    assert key == "pooled"
    lo, hi = I.time_band(2.0, {"q_low": -0.1, "q_high": 0.2})  # pred 20 % high -> measured lower
    assert lo == pytest.approx(2.0 * math.exp(-0.2)) and hi == pytest.approx(2.0 * math.exp(0.1))


# ------------------------------------------------------------------------------------------ CLI


@pytest.fixture
def roofline_everywhere(monkeypatch, roofline):
    monkeypatch.setattr(E, "default_cost_model", lambda: roofline)


def test_cli_cv_none_is_todays_output(roofline_everywhere, runs_file):
    res = CliRunner().invoke(app, ["validate", "--runs", str(runs_file), "--format", "json", "--cv", "none"])
    assert res.exit_code == 0, res.output
    _, today = validate_files([runs_file], None)
    assert json.loads(res.output) == json.loads(json.dumps(today.to_dict()))
    assert "cv" not in json.loads(res.output)


def test_cli_cv_source_default_and_errors(roofline_everywhere, runs_file):
    runner = CliRunner()
    res = runner.invoke(app, ["validate", "--runs", str(runs_file), "--format", "json", "--tier", "A"])
    assert res.exit_code == 0, res.output  # a user's own run file: predictions as planner predict makes them
    assert json.loads(res.output).get("cv") is None
    res = runner.invoke(app, ["validate", "--runs", str(runs_file), "--format", "json", "--tier", "A", "--cv",
                              "source"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)  # the constants the shipped default calibration fits
    shipped = C.load_calibration(C.default_calibration_path())
    assert d["cv"] == "source" and d["constants"] == list(shipped.constants)
    res = runner.invoke(app, ["validate", "--runs", str(runs_file), "--cv", "source", "--calibration", "x"])
    assert isinstance(res.exception, PlannerError) and "drop --calibration" in str(res.exception)
    res = runner.invoke(app, ["validate", "--runs", str(runs_file), "--cv", "kfold"])
    assert isinstance(res.exception, PlannerError) and "use none or source" in str(res.exception)


def test_cli_calibrate_cv_source(roofline_everywhere, runs_file, tmp_path):
    res = CliRunner().invoke(app, ["calibrate", "--runs", str(runs_file), "--name", "s", "--out", str(tmp_path),
                                   "--cv", "source", "--constants", "compute_scale", "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["cv"]["scheme"] == "source" and d["cv"]["folds"] == len(FACTORS)
    assert d["intervals"]["groups"]["pooled"]["n"] == len(FACTORS) * len(SHAPES)
    assert C.load_calibration(tmp_path / "s.json").interval_group("a100-80gb", "megatron") is not None


# ------------------------------------------------------------------------------------------ default calibration


def test_shipped_default_calibration_has_provenance():
    path = C.default_calibration_path()
    cal = C.load_calibration(path)
    assert cal.name == "default" and set(cal.constants) <= set(C.CONSTANTS)
    prov = cal.provenance
    assert {"note", "command", "runs_files", "constant_support", "leave_one_source_out"} <= set(prov)
    assert "regenerated" in prov["note"]
    assert set(prov["constant_support"]) == set(cal.constants)
    assert cal.fitted_on[0]["run_ids"] and cal.cv["scheme"] == "source"
    # fitted on the three open run files, each named with its SHA-256; the GH200 factor rests on GH200 sources only
    assert [f["file"] for f in prov["runs_files"]] == [f"../shared/validation/{n}" for n in
                                                       ("published_runs.csv", "gh200_small_blackwell_runs.csv",
                                                        "moe_runs.csv")]
    assert all(len(f["sha256"]) == 64 for f in prov["runs_files"])
    gh = prov["constant_support"]["compute_scale_gh200"]
    assert gh["rows"] > 0 and gh["sources"] and all(s.startswith("GH200-") for s in gh["sources"])
    moe = prov["constant_support"]["compute_scale_moe"]
    assert moe["rows"] > 0 and all(s.startswith("MOE-") for s in moe["sources"])
    assert cal.intervals["groups"]["pooled"]["n"] >= I.MIN_GROUP_RUNS
    # the band of mixture-of-experts plans: held-out residuals of moe_runs.csv's sources, with the coverage each
    # MoE source got from the other MoE sources' residuals alone
    moe, mprov = cal.intervals[I.MOE_TABLE], prov["moe_intervals"]
    assert moe["groups"]["pooled"]["n"] == mprov["n"] >= I.MIN_GROUP_RUNS
    assert 0.7 <= mprov["held_out_coverage"] <= 0.9 and all(s.startswith("MOE-") for s in mprov["per_source"])
    # the dense table holds no MoE residual: its pooled n is the dense runs' count
    n_moe = len(cal.fitted_on[2]["run_ids"])
    assert cal.intervals["groups"]["pooled"]["n"] == sum(len(f["run_ids"]) for f in cal.fitted_on) - n_moe
    assert I.moe_lookup(cal.intervals, "h100-sxm", "megatron")[0] == "pooled"


def test_predict_applies_default_and_calibration_none():
    runner = CliRunner()
    args = ["predict", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--gbs", "16", "--format", "json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    cal = json.loads(res.output)
    assert cal["calibration"] == "default" and cal["interval"].startswith("80 % interval")
    assert cal["iteration_time_low_s"] < cal["iteration_time_high_s"]
    res = runner.invoke(app, args + ["--calibration", "none"])
    assert res.exit_code == 0, res.output
    plain = json.loads(res.output)
    assert plain["calibration"] == "none" and not plain["interval"].startswith("80 % interval")
    shipped = C.load_calibration(C.default_calibration_path())
    if shipped.constants != {k: C.CONSTANTS[k].default for k in shipped.constants}:
        assert plain["iteration_time_s"] != cal["iteration_time_s"]


def test_source_shifted_residuals_carry_the_between_source_spread():
    # two sources, each tight around its own bias: a new source may sit at either bias, with either scatter
    shifted = I.source_shifted({"A": [0.09, 0.11], "B": [-0.21, -0.19]})
    want = [0.09, 0.11, 0.09, 0.11, -0.21, -0.19, -0.21, -0.19]  # each mean + each deviation (+-0.01)
    assert sorted(np.round(shifted, 6)) == sorted(want)
    # one source gives no between-source spread and the lookup falls back to a coarser group
    recs = [{"source": "A", "gpu": "h100-sxm", "framework": "fsdp", "residual": 0.01 * i} for i in range(10)]
    recs += [{"source": s, "gpu": "b200", "framework": "megatron", "residual": 0.0} for s in "BC" for _ in range(5)]
    key, g = I.lookup(I.fit_intervals(recs), "h100-sxm", "fsdp")
    assert key == "pooled" and g["sources"] == 3


def test_independent_prior_never_rests_on_the_held_out_source(runs_file, roofline):
    """The shipped default calibration lends constants to a fold's unidentifiable constants: its own when it was
    fitted on none of the validated runs; when it was fitted on them, its own leave-one-source-out fold without the
    held-out source (so the held-out source never enters); nothing for a fold it has no such fold for."""
    from planner.source_cv import independent_prior

    runs, _ = C.prepare_runs(load_runs(runs_file), roofline)
    default = C.calibration_option(None)
    assert independent_prior(runs)(["ANY"]) == default.constants  # synthetic ids: not among the default's runs
    fitted = default.fitted_on[0]["run_ids"][0]
    runs[0].row.id, old = fitted, runs[0].row.id
    try:
        prior = independent_prior(runs)
        fold = default.cv["fold_constants"][0]
        assert prior(fold["held_out"]) == fold["constants"] != default.constants
        assert prior(["NOT-A-SHIPPED-SOURCE"]) is None
    finally:
        runs[0].row.id = old


def test_report_says_whether_the_shipped_calibration_saw_a_files_runs():
    """validate --report's GH200 and MoE sections: the shipped calibration is in-sample for runs it was fitted on
    and held out for others (planner.cli_validate._shipped_basis)."""
    from types import SimpleNamespace

    from planner.cli_validate import _shipped_basis

    fitted = C.load_calibration(C.default_calibration_path()).fitted_on
    gh = [i for f in fitted for i in f["run_ids"] if i.startswith("GH200-")][:3]
    assert gh
    seen = _shipped_basis(SimpleNamespace(predicted=[SimpleNamespace(id=i) for i in gh + ["MOE-X-001"]]))
    assert seen.startswith("fitted on 3 of these 4 runs, so in-sample")
    assert "held out for every run" in _shipped_basis(SimpleNamespace(predicted=[SimpleNamespace(id="MOE-X-999")]))
