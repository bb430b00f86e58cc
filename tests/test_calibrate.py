"""planner calibrate: recovery of known constants from synthetic runs, CV, files, predict integration, CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import costmodel.estimate as E
import planner.prediction as P
from costmodel.core.errors import PlannerError
from costmodel.cost.roofline import RooflineCostModel
from costmodel.profiling.workloads.runner import write_runs_csv
from planner import calibrate as C
from planner.cli import app
from planner.validation.runs import default_hardware, load_runs, row_to_inputs
from tests.helpers import llama, plan

# The constants the synthetic "cluster" has; the fit must find them again.
TRUE = {"compute_scale": 1.25, "comm_scale": 1.6, "overlap_efficiency": 0.5, "iteration_overhead_s": 0.05}
# (layers, hidden, heads, ffn, gpus, tp, pp, mbs, gbs, zero): compute-bound, TP-comm-bound (TP across
# nodes), DP-reduction-bound (1 micro-batch, many nodes, no ZeRO) and pipelined layouts, two model sizes.
SHAPES = [(8, 1024, 16, 2816), (16, 2048, 16, 5504)]
LAYOUTS = [(8, 1, 1, 1, 8, 0), (8, 1, 1, 2, 64, 1), (16, 8, 1, 1, 4, 1), (64, 1, 1, 1, 64, 0),
           (16, 2, 2, 1, 32, 1), (32, 16, 1, 1, 8, 1), (128, 1, 1, 1, 128, 0), (16, 1, 4, 1, 16, 1)]
NOISE = 0.01  # 1 % multiplicative noise on the synthetic measurements


@pytest.fixture(scope="module")
def roofline():
    return RooflineCostModel()


def _rows(measured=None):
    rows = []
    for i, ((L, h, a, f), (n, tp, pp, mbs, gbs, zero)) in enumerate(
            (s, lay) for s in SHAPES for lay in LAYOUTS):
        rows.append(dict(
            id=f"SYN-{i:03d}", source="synthetic (tests/test_calibrate.py)", model_name=f"syn-{L}L-{h}h",
            n_layers=L, hidden=h, n_heads=a, n_kv_heads=a, ffn_hidden=f, vocab=32000, seq_len=2048,
            arch_notes="SwiGLU, RMSNorm, RoPE", gpu="A100-80GB", n_gpus=n, gpus_per_node=8, tp=tp, pp=pp,
            dp=n // (tp * pp), cp=1, mbs=mbs, gbs=gbs, recompute="none", seq_parallel="y" if tp > 1 else "n",
            dist_optimizer_or_zero="zero-1" if zero else "none", precision="bf16", framework="synthetic",
            measured_metric="iteration_time_s", measured_value=1.0 if measured is None else measured[i],
            notes="TIER=A; synthetic"))
    return rows


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory, roofline):
    """Run file whose measured times are predict(..., calibration=TRUE) x (1 + 1 % noise, seed 0)."""
    d = tmp_path_factory.mktemp("cal")
    path = write_runs_csv(_rows(), d / "runs.csv")
    hw_fn, truth = default_hardware(), C.identity(TRUE, name="truth")
    rng = np.random.default_rng(0)
    measured = []
    for row in load_runs(path):
        model, p, gpu_key, gpn = row_to_inputs(row)
        t = P.predict(model, p, hw_fn(gpu_key, gpn, row.cluster), roofline, calibration=truth).iteration_time_s
        measured.append(f"{t * (1 + NOISE * rng.standard_normal()):.6g}")
    return write_runs_csv(_rows(measured), path)


@pytest.fixture(scope="module")
def fitted(synthetic_runs, roofline, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return C.calibrate_files([synthetic_runs], "syn", out_dir=out, cost_model=roofline, folds=4)


def test_recovers_known_constants(fitted, synthetic_runs, roofline):
    cal, path = fitted
    got = cal.constants
    assert got["compute_scale"] == pytest.approx(TRUE["compute_scale"], rel=0.03)
    assert got["comm_scale"] == pytest.approx(TRUE["comm_scale"], rel=0.03)
    assert got["overlap_efficiency"] == pytest.approx(TRUE["overlap_efficiency"], abs=0.05)
    assert got["iteration_overhead_s"] == pytest.approx(TRUE["iteration_overhead_s"], rel=0.05)
    for name, value in got.items():  # the truth lies within a few standard errors
        if name not in TRUE:
            continue
        assert cal.uncertainty[name] is not None and abs(value - TRUE[name]) < 5 * cal.uncertainty[name] + 1e-3
    # no PyTorch-native run among them: compute_scale_torch cannot move, stays 1 and says so
    assert got["compute_scale_torch"] == 1.0 and cal.uncertainty["compute_scale_torch"] is None
    assert any("compute_scale_torch has no effect" in w for w in cal.warnings)
    assert cal.in_sample["before"]["mape_pct"] > 20 > 2 > cal.in_sample["after"]["mape_pct"]
    assert path.name == "syn.json" and cal.fitted_on[0]["sha256"] == C.file_sha256(synthetic_runs)
    assert len(cal.fitted_on[0]["run_ids"]) == len(SHAPES) * len(LAYOUTS)
    assert cal.cost_model == roofline.name and cal.planner_version and cal.created_utc
    assert cal.warnings == [f"{name} has no effect on these runs at the fitted point: kept at 1"
                            for name in ("compute_scale_torch", *C.GPU_SCOPED, "compute_scale_moe")]  # dense, roofline


def test_cross_validation_reports_held_out_error(fitted):
    cal, _ = fitted
    cv = cal.cv
    n = len(SHAPES) * len(LAYOUTS)
    assert cv["scheme"] == "kfold" and cv["folds"] == 4 and cv["folds_skipped"] == 0
    assert sorted(r["id"] for r in cv["per_run"]) == sorted(f"SYN-{i:03d}" for i in range(n))  # each held out once
    assert cv["held_out_after"]["n"] == n
    assert cv["held_out_after"]["mape_pct"] < 3.0 < cv["held_out_before"]["mape_pct"]


def test_group_cv_and_subset_of_constants(synthetic_runs, roofline):
    runs, skipped = C.prepare_runs(load_runs(synthetic_runs), roofline)
    assert not skipped
    res = C.cross_validate(runs, ["compute_scale", "iteration_overhead_s"], scheme="model")
    assert res["folds"] == len(SHAPES) and res["held_out_after"]["n"] == len(runs)
    with pytest.raises(PlannerError, match="--cv kfold"):
        C.cross_validate(runs[:8], ["compute_scale"], scheme="model")  # one model only


def test_too_few_runs_is_refused(synthetic_runs, roofline):
    runs, _ = C.prepare_runs(load_runs(synthetic_runs), roofline)
    with pytest.raises(PlannerError, match=f"at least {len(C.CONSTANTS) + 2}"):
        C.fit_calibration(runs[:5], "few")
    C.fit_calibration(runs[:4], "few", ["compute_scale", "iteration_overhead_s"], folds=2)  # 4 >= 2 + 2
    with pytest.raises(PlannerError, match="unknown constant"):
        C.parse_constants("compute_scale,warp_speed")


def test_unidentifiable_constant_is_kept_at_default(synthetic_runs, roofline):
    runs, _ = C.prepare_runs(load_runs(synthetic_runs), roofline)
    single = [r for r in runs if r.plan.gpus == 8 and r.plan.zero == 1]  # no DP overlap at stake
    fit = C.fit_constants(single * 3, ["compute_scale", "overlap_efficiency"])
    assert fit.constants["overlap_efficiency"] == 1.0 and fit.uncertainty["overlap_efficiency"] is None
    assert any("overlap_efficiency has no effect" in w for w in fit.warnings)
    # a prior (a calibration fitted on other runs) replaces the default for a constant these runs cannot move only
    fit = C.fit_constants(single * 3, ["compute_scale", "overlap_efficiency"],
                          prior={"overlap_efficiency": 0.7, "compute_scale": 9.0})
    assert fit.constants["overlap_efficiency"] == 0.7 and fit.constants["compute_scale"] != 9.0
    assert any("kept at 0.7" in w for w in fit.warnings)


class _ProductRun:
    """A stand-in run whose prediction is ``base`` times the product of the named constants (the way compute_scale
    and a scoped scale act together on one plan's compute)."""

    def __init__(self, base: float, measured: float, names: tuple):
        self.base, self.names = base, names
        self.row = type("Row", (), {"measured_value": measured, "id": "X"})()

    def predicted_value(self, cal) -> float:
        return self.base * float(np.prod([cal.value(n) for n in self.names]))


def test_constants_moved_only_together_are_held_at_the_prior():
    """When every run a fold is fitted on has compute_scale and the stack's scale together, the two are one product:
    compute_scale keeps the prior (a fit on other runs) and the stack's scale takes the rest, instead of an arbitrary
    point of the ridge; a run that carries compute_scale alone separates them again."""
    names = ["compute_scale", "compute_scale_torch"]
    both = ("compute_scale", "compute_scale_torch")
    tied = [_ProductRun(1.0, 1.32, both), _ProductRun(2.0, 2.64, both)]
    fit = C.fit_constants(tied, names, prior={"compute_scale": 1.1})
    assert fit.constants["compute_scale"] == 1.1
    assert fit.constants["compute_scale_torch"] == pytest.approx(1.2, rel=1e-6)
    assert "compute_scale" in fit.unidentified and fit.uncertainty["compute_scale"] is None
    assert any("only together with other constants: kept at 1.1" in w for w in fit.warnings)
    assert C.fit_constants(tied, names).constants["compute_scale"] == 1.0  # no prior: the default
    apart = tied + [_ProductRun(1.0, 1.05, ("compute_scale",))] * 2
    fit = C.fit_constants(apart, names, prior={"compute_scale": 1.1})
    assert fit.unidentified == ()
    assert fit.constants["compute_scale"] == pytest.approx(1.05, rel=1e-4)
    assert fit.constants["compute_scale_torch"] == pytest.approx(1.32 / 1.05, rel=1e-4)


# ------------------------------------------------------------------------------------------ predict


def _dp_plan():
    m = llama(layers=8, hidden=2048, heads=16, kv=16, ffn=5504)
    # CUDA graphs: no host floor, so the step is the GPU time the constants scale
    return m, plan(gpus=64, gpn=8, gbs=64, seq=2048, zero=0, cuda_graphs=True).validate(m)


def test_no_calibration_is_exactly_uncalibrated(roofline):
    hw = default_hardware()("a100-80gb", 8, "dgx-a100")
    m, p = _dp_plan()
    base = P.predict(m, p, hw, roofline).to_dict()
    assert P.predict(m, p, hw, roofline, calibration=None).to_dict() == base
    assert P.predict(m, p, hw, roofline, calibration=C.identity()).to_dict() == base  # defaults change nothing


def test_constants_act_where_they_should(roofline):
    hw = default_hardware()("a100-80gb", 8, "dgx-a100")
    m, p = _dp_plan()
    base = P.predict(m, p, hw, roofline)
    over = P.predict(m, p, hw, roofline, calibration=C.identity({"iteration_overhead_s": 0.5}))
    assert over.iteration_time_s == pytest.approx(base.iteration_time_s + 0.5, rel=1e-12)
    assert sum(b["time_s"] for b in over.breakdown) == pytest.approx(over.iteration_time_s)
    assert any(b["operator"].startswith("framework_overhead") for b in over.breakdown)
    assert over.bottleneck == "framework overhead"
    slow_comm = P.predict(m, p, hw, roofline, calibration=C.identity({"comm_scale": 3.0}))
    assert slow_comm.exposed_comm_s["dp"] > base.exposed_comm_s["dp"]
    no_overlap = P.predict(m, p, hw, roofline, calibration=C.identity({"overlap_efficiency": 0.0}))
    assert no_overlap.exposed_comm_s["dp"] > base.exposed_comm_s["dp"]
    single = plan(gpus=1, gpn=8, gbs=4, seq=2048, zero=0, cuda_graphs=True).validate(m)  # no collectives at all
    s0 = P.predict(m, single, hw, roofline).iteration_time_s
    s2 = P.predict(m, single, hw, roofline, calibration=C.identity({"compute_scale": 2.0})).iteration_time_s
    assert s2 == pytest.approx(2 * s0, rel=1e-9)
    mismatch = P.predict(m, p, hw, roofline, calibration=C.Calibration("x", {}, cost_model="other-model"))
    assert any("fitted on cost model 'other-model'" in w for w in mismatch.warnings)


def test_fast_path_matches_predict(synthetic_runs, roofline):
    runs, _ = C.prepare_runs(load_runs(synthetic_runs), roofline)
    cal = C.identity(TRUE)
    for r in runs[:6]:
        assert r.predict(cal).iteration_time_s == P.predict(r.model, r.plan, r.hardware, roofline,
                                                             calibration=cal).iteration_time_s


# ------------------------------------------------------------------------------------------ files


def test_file_round_trip_and_lookup_by_name(fitted, tmp_path):
    cal, path = fitted
    loaded = C.load_calibration(path)
    assert loaded.to_dict() == cal.to_dict()
    assert C.resolve_calibration("syn", directory=path.parent).constants == cal.constants
    assert C.resolve_calibration(str(path)).name == "syn"
    assert not list(path.parent.glob("*.tmp"))  # atomic write leaves no temporary file
    with pytest.raises(PlannerError, match="not found"):
        C.resolve_calibration("nope", directory=tmp_path)
    with pytest.raises(PlannerError, match="--name"):
        C.save_calibration(C.identity(name="../evil"), tmp_path)


@pytest.mark.parametrize("text, match", [
    ('{"name": "x", "constants": {"comp', "not valid JSON"),
    ('[1, 2]', "JSON object"),
    ('{"schema_version": 1, "name": "x", "constants": {"warp": 2}}', "unknown constant"),
    ('{"schema_version": 1, "name": "x", "constants": {"overlap_efficiency": 1.5}}', "overlap_efficiency"),
    ('{"schema_version": 99, "name": "x", "constants": {}}', "schema_version"),
])
def test_corrupted_file_is_one_line_error(tmp_path, text, match):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(PlannerError, match=match) as exc:
        C.load_calibration(f)
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------------------------------ CLI


@pytest.fixture
def roofline_default(monkeypatch, roofline):
    monkeypatch.setattr(E, "default_cost_model", lambda: roofline)


def test_cli_calibrate_predict_validate(roofline_default, synthetic_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--runs", str(synthetic_runs), "--name", "cli",
                              "--constants", "compute_scale,iteration_overhead_s", "--folds", "3"])
    assert res.exit_code == 0, res.output
    assert "compute_scale" in res.output and "held-out (kfold, 3 folds)" in res.output
    assert (C.calibration_dir() / "cli.json").is_file()  # the user's config directory, not the working one
    assert "wrote " + str(C.calibration_dir() / "cli.json") in res.output
    res = runner.invoke(app, ["calibrate", "--runs", str(synthetic_runs), "--name", "cli2", "--out", "cal",
                              "--format", "json", "--cv", "kind", "--constants", "compute_scale"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["constants"]) == {"compute_scale"} and data["cv"]["scheme"] == "kind"
    assert data["path"].endswith("cli2.json")

    args = ["predict", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--gbs", "16", "--format", "json"]
    plain = json.loads(runner.invoke(app, args + ["--calibration", "none"]).output)
    res = runner.invoke(app, args + ["--calibration", "cli"])
    assert res.exit_code == 0, res.output
    calibrated = json.loads(res.output)
    cal = C.resolve_calibration("cli")
    assert calibrated["calibration"] == "cli"
    assert calibrated["iteration_time_s"] > plain["iteration_time_s"] * cal.compute_scale * 0.99

    res = runner.invoke(app, ["validate", "--runs", str(synthetic_runs), "--format", "json",
                              "--calibration", str(C.calibration_dir() / "cli.json")])
    assert res.exit_code == 0, res.output
    after = next(s for s in json.loads(res.output)["summaries"] if s["group"] == "overall")
    res = runner.invoke(app, ["validate", "--runs", str(synthetic_runs), "--format", "json", "--cv", "none"])
    before = next(s for s in json.loads(res.output)["summaries"] if s["group"] == "overall")
    assert after["mape_pct"] < before["mape_pct"]


def test_cli_errors_are_one_line(roofline_default, synthetic_runs, tmp_path, monkeypatch, capsys):
    from planner.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    for argv in (["predict", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--calibration",
                  "broken.json"],
                 ["validate", "--runs", str(synthetic_runs), "--calibration", "missing-name"],
                 ["calibrate", "--runs", str(synthetic_runs), "--name", "x", "--format", "xml"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err, err


def test_calibration_dir_follows_xdg_and_names_resolve_from_anywhere(tmp_path, monkeypatch):
    """$XDG_CONFIG_HOME/planner/calibrations, else ~/.config/planner/calibrations (a relative XDG value is ignored,
    as the XDG Base Directory Specification says); a NAME resolves there from any working directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert C.calibration_dir() == tmp_path / "xdg" / "planner" / "calibrations"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in ("", "relative/dir"):
        monkeypatch.setenv("XDG_CONFIG_HOME", value)
        assert C.calibration_dir() == tmp_path / "home" / ".config" / "planner" / "calibrations"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    saved = C.save_calibration(C.identity({"compute_scale": 1.1}, name="mine"))
    assert saved == C.calibration_dir() / "mine.json"
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert C.resolve_calibration("mine").constants["compute_scale"] == 1.1
    assert C.resolve_calibration(str(saved)).name == "mine"  # a path still works
    legacy = tmp_path / "work" / "calibrations"
    legacy.mkdir()
    C.save_calibration(C.identity(name="old"), legacy)
    with pytest.raises(PlannerError, match=r"calibrations/old.json exists .*pass --calibration calibrations/old.json"):
        C.resolve_calibration("old")


def test_moe_scale_acts_on_mixture_of_experts_plans_only():
    from types import SimpleNamespace

    cal = C.Calibration(name="t", constants={"compute_scale": 2.0, "compute_scale_moe": 1.5})
    times = {("gemm", 1): 1.0, ("all_to_all", 2): 1.0}
    assert cal.scale_times(times, "megatron", "h100-sxm", moe=True) == {("gemm", 1): 3.0, ("all_to_all", 2): 1.0}
    assert cal.scale_times(times, "megatron", "h100-sxm")[("gemm", 1)] == 2.0
    plan = SimpleNamespace(framework="megatron")
    hw = SimpleNamespace(gpu=SimpleNamespace(name="h100-sxm"))
    assert cal.scaler(plan, hw, SimpleNamespace(is_moe=True))(times)[("gemm", 1)] == 3.0
    assert cal.scaler(plan, hw, SimpleNamespace(is_moe=False))(times)[("gemm", 1)] == 2.0
    assert cal.scaler(plan, hw)(times)[("gemm", 1)] == 2.0  # no model: not scaled as MoE


def test_interval_tables_keep_moe_and_dense_residuals_apart():
    """Any --cv source calibration (planner calibrate, the shipped default): dense runs' held-out residuals make the
    table, MoE runs' the MoE table; no MoE table without MoE runs."""
    from types import SimpleNamespace

    from planner.intervals import MOE_TABLE

    def run(i, moe):
        return SimpleNamespace(row=SimpleNamespace(id=f"R{i}"), model=SimpleNamespace(is_moe=moe))

    runs = [run(i, i >= 10) for i in range(16)]
    recs = [{"id": f"R{i}", "source": f"S{i % 3}", "gpu": "h100-sxm", "framework": "megatron",
             "residual": 0.01 * i if i < 10 else 1.0 + 0.01 * i} for i in range(16)]
    tables = C.interval_tables(runs, recs)
    assert tables["groups"]["pooled"]["n"] == 10 and tables["groups"]["pooled"]["q_high"] < 0.2
    assert tables[MOE_TABLE]["groups"]["pooled"]["n"] == 6 and tables[MOE_TABLE]["groups"]["pooled"]["q_low"] > 1.0
    assert MOE_TABLE not in C.interval_tables(runs[:10], recs[:10])
