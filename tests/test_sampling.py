"""The sampling harness on this machine's CPU: real (tiny) sweeps, resume, torchrun collectives, CLI.

Plan tests run without torch; measuring tests skip with a reason when torch is not installed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COMPUTE_KINDS, FEATURES
from costmodel.fitting.datasets.schema import load_dataset
from costmodel.profiling.sampling.collectives import topology
from costmodel.profiling.sampling.plan import (
    DIRECTIONS,
    Timing,
    available_plans,
    design_points,
    expand,
    gflop,
    load_plan,
    message_sizes,
    resolve_group_sizes,
)

ROOT = Path(__file__).resolve().parents[1]

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install 'planner[profile]')")


# ------------------------------------------------------------------------------------------ plans
def test_builtin_plans_expand_to_valid_samples():
    assert {"cpu-tiny", "cpu-small", "gpu-default"} <= set(available_plans())
    for name in ("cpu-tiny", "cpu-small", "gpu-default"):
        plan = load_plan(name)
        samples = expand(plan)
        assert {s.kind for s in samples} == set(COMPUTE_KINDS), name
        assert len({s.key() for s in samples}) == len(samples), f"{name}: duplicate samples"
        for s in samples:
            assert len(s.features) == len(FEATURES[s.kind]) and s.direction in DIRECTIONS[s.kind]
            if s.kind.startswith("attention"):
                assert s.features[3] % s.features[4] == 0  # kv_heads divides heads
            if s.kind in ("cross_entropy", "optimizer"):
                assert s.dtype == "fp32"
        limit = plan.ops["gemm"].get("max_gflop", float("inf"))
        assert all(gflop("gemm", s.features) <= limit for s in samples if s.kind == "gemm")
        assert plan.collectives.get("ops")


def test_lhs_is_seeded_and_space_filling():
    spec = {"design": "lhs", "samples": 16, "seed": 3, "m": {"min": 16, "max": 4096, "log": True},
            "n": {"min": 16, "max": 4096, "log": True}, "k": [64, 128]}
    a, b = design_points("gemm", spec), design_points("gemm", spec)
    assert a == b and len(a) == 16
    assert design_points("gemm", {**spec, "seed": 4}) != a
    logs = np.log2([p[0] for p in a])  # one point per stratum of log2(m) in [4, 12]
    strata = np.floor((logs - 4) / (8 / 16)).clip(0, 15)
    assert len(set(strata)) >= 14
    assert {p[2] for p in a} == {64, 128}


def test_norm_rms_feature_chooses_the_kernel(tmp_path):
    spec = {"design": "grid", "tokens": [64], "hidden": [128], "rms": [0, 1, 5]}
    assert design_points("norm", spec) == [(64, 128, 0), (64, 128, 1)]  # any non-zero rms means RMSNorm
    bad = tmp_path / "norm.toml"
    bad.write_text('[ops.norm]\ntokens = 64\nhidden = 128\nrms = [0, 1]\n')
    samples = expand(load_plan(bad))
    assert {(s.features[2], s.variant) for s in samples} == {(0, "layer"), (1, "rms")}
    bad.write_text('[ops.norm]\ntokens = 64\nhidden = 128\nrms = 1\nvariant = "rms"\n')
    with pytest.raises(PlannerError, match="rms feature"):
        expand(load_plan(bad))


def test_plan_errors_are_one_line(tmp_path):
    with pytest.raises(PlannerError, match="unknown plan"):
        load_plan("no-such-plan")
    bad = tmp_path / "bad.toml"
    bad.write_text('[ops.convolution]\nx = 1\n')
    with pytest.raises(PlannerError, match="not a compute operator kind"):
        load_plan(bad)
    bad.write_text('[ops.gemm]\nm = 1\nn = 1\nk = 1\nwarp = 3\n')
    with pytest.raises(PlannerError, match="unknown keys"):
        load_plan(bad)
    bad.write_text('[ops.gemm]\nm = 8\nn = 8\nk = 8\ndirections = ["sideways"]\n')
    with pytest.raises(PlannerError, match="directions"):
        expand(load_plan(bad))


def test_collective_helpers():
    assert message_sizes({"min": 1024, "max": 16384, "factor": 4}) == [1024, 4096, 16384]
    assert message_sizes([8, 16]) == [8, 16]
    with pytest.raises(PlannerError):
        message_sizes({"min": 1, "max": 8, "factor": 1})
    hosts = ["a", "a", "b", "b"]
    assert topology([0, 1], hosts) == (1, 2)
    assert topology([0, 1, 2, 3], hosts) == (2, 2)
    assert topology([0, 2], hosts) == (2, 1)


def test_group_sizes_dedupe_and_name_what_a_launch_cannot_sample(tmp_path):
    # the cpu-workload plan names 2 and "world": one group on 2 ranks, two on 4
    assert resolve_group_sizes([2, "world"], 2) == ([2], [])
    assert resolve_group_sizes([2, "world"], 4) == ([2, 4], [])
    assert resolve_group_sizes([2, 4, 8, "world"], 4) == ([2, 4], [8])
    for bad in ([], [1], ["all"], [2.5], [True]):
        with pytest.raises(PlannerError, match="group_sizes"):
            resolve_group_sizes(bad, 4)
    assert load_plan("cpu-workload").collectives["group_sizes"] == [2, "world"]
    plan = tmp_path / "bad.toml"
    plan.write_text('[collectives]\nops = ["all_reduce"]\ngroup_sizes = [1, "world"]\n')
    with pytest.raises(PlannerError, match="group_sizes entry 1"):
        load_plan(plan)


# --------------------------------------------------------------------------------- real measuring
def _tiny(tmp: Path, **kw) -> list[Path]:
    from costmodel.profiling.sampling.runner import run_plan

    return run_plan("cpu-tiny", tmp, threads=1, progress=False, **kw)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    if not HAVE_TORCH:
        pytest.skip("torch is not installed (pip install 'planner[profile]')")
    out = tmp_path_factory.mktemp("tiny")
    return out, _tiny(out)


@needs_torch
def test_tiny_sweep_every_compute_kind(tiny_sweep):
    out, paths = tiny_sweep
    plan = load_plan("cpu-tiny")
    assert {p.stem for p in paths} == set(COMPUTE_KINDS)
    for p in paths:
        ds = load_dataset(p)
        assert ds.gpu == "cpu" and len(ds) > 0
        assert np.all(ds.time_s > 0) and np.all(ds.repeats >= plan.timing.min_repeats)
        assert np.all(np.isfinite(ds.spread_s)) and np.all(ds.spread_s >= 0)
        assert set(ds.direction) == set(DIRECTIONS[ds.kind]), ds.kind  # fwd and bwd rows where the kind has both
        fp = ds.meta["fingerprint"]
        assert fp["threads"] == 1 and fp["torch"] and fp["cpu_model"] and fp["logical_cores"] >= 1
        assert len(fp["host_sha256"]) == 16 and socket.gethostname() not in json.dumps(fp)
        assert ds.meta["sources"][0]["sha256"] == plan.sha256
        expected_dtype = "fp32"
        assert set(ds.dtype) == {expected_dtype}
    gemm = load_dataset(out / "gemm.csv")
    assert sorted(map(tuple, gemm.features[gemm.direction == "fwd"].astype(int))) == \
        sorted({(m, 64, k) for m in (32, 256) for k in (64, 256)})


@needs_torch
def test_bigger_gemm_takes_longer():
    from costmodel.profiling.sampling.operators import measure
    from costmodel.profiling.sampling.plan import Sample

    timing = Timing(warmup=1, min_run_time_s=0.01, min_repeats=3)
    small = measure(Sample("gemm", "fwd", "fp32", (32, 32, 32)), "cpu", timing, 1).median_s
    big = measure(Sample("gemm", "fwd", "fp32", (512, 512, 512)), "cpu", timing, 1).median_s
    assert big > 20 * small  # 4096x the FLOPs


@needs_torch
def test_gemm_backward_decomposition_matches_autograd():
    from costmodel.profiling.sampling.operators import gemm_backward_check

    r = gemm_backward_check(256, 384, 512, timing=Timing(warmup=1, min_run_time_s=0.02, min_repeats=3))
    assert r["dgrad"] > 0 and r["wgrad"] > 0
    assert 0.5 < r["sum"] / r["autograd"] < 2.0, r  # dgrad + wgrad GEMMs are the linear layer's backward


def _counting_measure(monkeypatch) -> list:
    import costmodel.profiling.sampling.runner as runner  # run_plan calls the measure it imported

    calls = []
    real = runner.measure

    def counted(s, *a, **k):
        calls.append(s.key())
        return real(s, *a, **k)
    monkeypatch.setattr(runner, "measure", counted)
    return calls


@needs_torch
def test_resume_after_datasets_deleted_measures_nothing(tmp_path, monkeypatch):
    kinds = ["norm", "residual_add"]
    first = {p.stem: load_dataset(p) for p in _tiny(tmp_path, ops=kinds)}
    for p in tmp_path.glob("*.csv"):
        p.unlink()
        p.with_suffix(".json").unlink()
    calls = _counting_measure(monkeypatch)
    second = {p.stem: load_dataset(p) for p in _tiny(tmp_path, ops=kinds)}
    assert calls == []
    assert first.keys() == second.keys() == set(kinds)
    for k in kinds:
        np.testing.assert_array_equal(first[k].time_s, second[k].time_s)
        np.testing.assert_array_equal(first[k].features, second[k].features)
        np.testing.assert_array_equal(first[k].direction, second[k].direction)


@needs_torch
def test_resume_after_kill_measures_only_missing(tmp_path, monkeypatch):
    _tiny(tmp_path, ops=["norm"])
    journal = tmp_path / "journal" / "norm.jsonl"
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 4  # header + 2 shapes x (fwd, bwd)
    kept, torn = lines[:3], lines[3]
    journal.write_text("\n".join(kept) + "\n" + torn[: len(torn) // 2])  # killed while writing sample 3
    calls = _counting_measure(monkeypatch)
    ds = load_dataset(_tiny(tmp_path, ops=["norm"])[0])
    done = [json.loads(line)["key"] for line in kept[1:]]
    assert len(calls) == 2 and not set(calls) & set(done)
    recs = [json.loads(line) for line in journal.read_text().splitlines()]  # every line is whole JSON again
    keys = [r["key"] for r in recs[1:]]
    assert len(keys) == 4 == len(set(keys)) and len(ds) == 4
    assert sorted(ds.source_row) == [0, 1, 2, 3]


@needs_torch
def test_journal_corruption_and_foreign_environment_are_errors(tmp_path):
    _tiny(tmp_path, ops=["residual_add"])
    journal = tmp_path / "journal" / "residual_add.jsonl"
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    header["identity"]["threads"] = 64
    journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(PlannerError, match="another environment.*threads"):
        _tiny(tmp_path, ops=["residual_add"])
    journal.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(PlannerError, match="line 2 is corrupted"):
        _tiny(tmp_path, ops=["residual_add"])
    assert len(_tiny(tmp_path, ops=["residual_add"], resume=False)) == 1  # --fresh starts over


@needs_torch
def test_gloo_collective_sweep_via_torchrun(tmp_path):
    from costmodel.profiling.sampling.collectives import launch

    paths = launch("cpu-tiny", tmp_path, nproc=2, progress=False, timeout_s=120)
    got = {p.stem: load_dataset(p) for p in paths}
    assert {"all_reduce", "all_gather", "send_recv"} <= set(got)
    unsupported = got["all_reduce"].meta["sampling"]["unsupported"]
    for kind in ("reduce_scatter", "all_to_all"):  # measured, or the reason it is not is recorded
        assert kind in got or kind in unsupported
    for ds in got.values():
        assert ds.gpu == "cpu" and ds.meta["sampling"]["backend"] == "gloo"
        assert len(ds) == 2 and np.all(ds.time_s > 0) and set(ds.direction) == {"fwd"}
        b, ranks, nodes, rpn = ds.features.T
        assert list(b) == [4096, 262144] and set(ranks) == {2} and set(nodes) == {1} and set(rpn) == {2}
    # the plan's rank-skew measurement (costmodel/profiling/sampling/skew.py): both lengths timed, excess = pooled sums
    from costmodel.profiling.sampling import skew

    sk = skew.load([tmp_path])
    assert sk["ranks"] == 2 and [s["segment_s"] for s in sk["segments"]] == [0.001, 0.003]
    assert all(s["repeats"] >= 3 and s["sum_max_s"] >= s["sum_mean_s"] > 0 for s in sk["segments"])
    # identical segments on both ranks (the calibration is agreed; skew.measure refuses otherwise)
    assert all(s["gemms_per_segment"] >= 1 for s in sk["segments"])
    assert sk["segments"][1]["gemms_per_segment"] >= sk["segments"][0]["gemms_per_segment"]
    assert sk["excess"] == pytest.approx(skew.pooled_excess(sk["segments"])) and sk["excess"] >= 0
    # the plan's co-run measurement (costmodel/profiling/sampling/corun.py): one shape per compute kind and direction,
    # cold-cache single calls where the plan sweeps a buffer first, a factor per kind = ratio of the sums
    from costmodel.profiling.sampling import corun

    cr = corun.load([tmp_path])
    plan = load_plan("cpu-tiny")
    assert cr["ranks"] == 2 and set(cr["slowdown"]) == set(plan.ops)
    assert {(r["kind"], r["direction"]) for r in cr["rows"]} == {(s.kind, s.direction) for s in expand(plan)}
    assert all(r["calls"] >= 3 and r["alone_s"] > 0 and r["together_s"] > 0 for r in cr["rows"])
    assert cr["slowdown"] == pytest.approx(corun.slowdown(cr["rows"]))
    # resumable too: a second launch measures nothing new and rewrites the same rows
    (tmp_path / "all_reduce.csv").unlink()
    again = launch("cpu-tiny", tmp_path, nproc=2, progress=False, ops=["all_reduce"], timeout_s=120)
    np.testing.assert_array_equal(got["all_reduce"].time_s, load_dataset(again[0]).time_s)
    assert skew.load([tmp_path])["unix_time"] == sk["unix_time"]  # same machine: not measured again
    assert corun.load([tmp_path])["unix_time"] == cr["unix_time"]


# ----------------------------------------------------------------------------------------------- CLI
def _invoke(args):
    from planner.cli import app

    return CliRunner().invoke(app, ["profile", *args])


@pytest.mark.parametrize("args, needle", [
    (["--ops", "gemm,convolution"], "unknown operator kind(s) convolution"),
    (["--plan", "no-such-plan"], "unknown plan"),
    (["--plan", "missing.toml"], "does not exist"),
    (["--device", "tpu"], "must be cpu or cuda"),
])
def test_cli_bad_input_exit_2_one_line(args, needle):
    res = _invoke(args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and res.output.count("\n") == 1 and "Traceback" not in res.output


@needs_torch
def test_cli_cuda_without_gpu_exit_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    res = _invoke(["--device", "cuda", "--gpu-name", "h100-sxm"])
    assert res.exit_code == 2 and "no CUDA GPU" in res.output


@needs_torch
def test_cli_profile_runs_and_reports(tmp_path):
    res = _invoke(["--plan", "cpu-tiny", "--ops", "residual_add,optimizer", "--threads", "1", "--no-progress",
                   "--dtype", "bf16", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "residual_add" in res.output and f"written to {tmp_path}" in res.output
    assert {p.name for p in tmp_path.glob("*.csv")} == {"residual_add.csv", "optimizer.csv"}
    assert set(load_dataset(tmp_path / "residual_add.csv").dtype) == {"bf16"}  # --dtype is recorded per row
    assert set(load_dataset(tmp_path / "optimizer.csv").dtype) == {"fp32"}  # fp32 master weights whatever --dtype


def test_cli_imports_and_explains_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import planner.cli, planner.cli_profile, "
            "costmodel.profiling.sampling, costmodel.profiling.sampling.plan, costmodel.profiling.sampling.runner, "
            "costmodel.profiling.sampling.collectives; "
            "from planner.cli import main; main(['profile', '--plan', 'cpu-tiny'])")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == "error: torch is not installed: pip install 'planner[profile]'"


@needs_torch
def test_collectives_after_compute_mode(tmp_path):
    """compute_between_s > 0: each call is timed after a GEMM burst, one call per repeat, mean over ranks."""
    from costmodel.profiling.sampling.collectives import launch

    plan = tmp_path / "coll.toml"
    plan.write_text('name = "coll"\n[collectives]\nops = ["all_reduce"]\nbytes = [4096]\nrepeats = 4\n'
                    'warmup = 1\ncompute_between_s = 0.001\n', encoding="utf-8")
    paths = launch(plan, tmp_path / "out", nproc=2, progress=False, timeout_s=120)
    ds = load_dataset(paths[0])
    assert len(ds) == 1 and ds.time_s[0] > 0 and ds.meta["sampling"]["collectives"]["compute_between_s"] == 0.001


@needs_torch
def test_cold_cache_timing_is_per_kind(tmp_path):
    """[timing] flush_mb applies to every kind unless its [ops.<kind>] table overrides it; cold timing
    times single calls (number 1) and at least min_repeats of them."""
    from costmodel.profiling.sampling.operators import build, time_fn
    from costmodel.profiling.sampling.plan import Sample, op_timing

    plan_path = tmp_path / "cold.toml"
    plan_path.write_text('name = "cold"\n[timing]\nwarmup = 1\nmin_run_time_s = 0.001\nmin_repeats = 3\n'
                         'flush_mb = 1\n[ops.gemm]\nsamples = 2\nm = [64]\nn = [64]\nk = [64]\n'
                         '[ops.norm]\nflush_mb = 0\nsamples = 2\ntokens = [64]\nhidden = [64]\nrms = [1]\n',
                         encoding="utf-8")
    plan = load_plan(plan_path)
    assert op_timing(plan, "gemm").flush_mb == 1 and op_timing(plan, "norm").flush_mb == 0
    m = time_fn(build(Sample("gemm", "fwd", "fp32", (64, 64, 64)), "cpu"), op_timing(plan, "gemm"), 1)
    assert m.number == 1 and m.repeats >= 3 and m.median_s > 0


# ------------------------------------------------------------------------------------ faults (issue #6)
@needs_torch
def test_profile_killed_mid_sample_resumes_without_loss_or_duplicates(tmp_path):
    """A real `planner profile` process SIGKILLed while writing its 3rd sample (fault injected: half the
    line written, then SIGKILL); the re-run measures only the missing samples, keeps the finished ones."""
    import os
    import signal

    from costmodel.profiling.sampling.journal import FAULT_ENV

    cmd = [sys.executable, "-m", "planner.cli", "profile", "--device", "cpu", "--plan", "cpu-tiny", "--ops", "gemm",
           "--threads", "1", "--no-collectives", "--no-progress", "--out", str(tmp_path)]
    killed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, FAULT_ENV: "3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = tmp_path / "journal" / "gemm.jsonl"
    raw = journal.read_text()
    assert not raw.endswith("\n")                                  # the torn line is there
    done = {json.loads(x)["key"]: json.loads(x) for x in raw.splitlines()[1:-1]}
    assert len(done) == 2 and not (tmp_path / "gemm.csv").exists()
    ok = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    recs = [json.loads(x) for x in journal.read_text().splitlines()[1:]]
    keys = [r["key"] for r in recs]
    assert len(keys) == len(set(keys))                             # nothing measured twice
    for k, r in done.items():                                      # finished samples kept as they were
        assert next(x for x in recs if x["key"] == k) == r
    ds = load_dataset(tmp_path / "gemm.csv")
    assert len(ds) == len(keys) == len(expand(load_plan("cpu-tiny"), ops=["gemm"]))


def test_compute_burst_is_calibrated_on_warm_gemms(monkeypatch):
    """The burst before each collective sample is calibrated on warm GEMMs (a cold calibration made the
    plan's 2 ms burst a single 0.9 ms GEMM on the CPU, issue #4). A fake clock and a fake GEMM whose
    first call is cold (10 ms, then 1 ms each): a 20 ms burst must be 20 warm GEMMs (timing the cold call
    too would give round(20 / 1.9) = 11)."""
    from types import SimpleNamespace

    from costmodel.profiling.sampling import collectives

    clock, calls = [0.0], [0]

    def linear(a, w):
        calls[0] += 1
        clock[0] += 0.010 if calls[0] == 1 else 0.001

    fake_torch = SimpleNamespace(randn=lambda *a, **k: None,
                                 nn=SimpleNamespace(functional=SimpleNamespace(linear=linear)))
    monkeypatch.setattr(collectives, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Ctx:
        dev = None
        torch = fake_torch

        def sync(self):
            pass

    burst = collectives._compute_burst(Ctx(), 0.02)
    assert burst.reps == 20
    before, t0 = calls[0], clock[0]
    burst()
    assert calls[0] - before == 20 and clock[0] - t0 == pytest.approx(0.02)
