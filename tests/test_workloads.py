"""The real CPU training workload (costmodel.profiling.workloads): every parallel mode runs under torchrun/gloo,
the losses of sharded layouts equal the unsharded model's, and the run file loads in planner.validation.runs."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from costmodel.profiling.workloads.config import WorkloadConfig
from costmodel.profiling.workloads.runner import (
    RUN_COLUMNS,
    WorkloadError,
    launch,
    launch_many,
    result_to_row,
    write_runs_csv,
)
from planner.validation.runs import load_runs, map_gpu

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install torch to run the workload)")

# tiny models: 8 steps each (1 warm-up + 7 timed) so the loss trend is visible
LLAMA_LIKE = WorkloadConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab=256, seq_len=16,
                            activation="swiglu", norm="rmsnorm", position="rope", warmup=1, iters=7, lr=3e-3)
GPT_LIKE = WorkloadConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=4, ffn_hidden=128, vocab=256, seq_len=16,
                          activation="gelu", norm="layernorm", position="learned", warmup=1, iters=7, lr=3e-3)


def _with(cfg: WorkloadConfig, **kw) -> WorkloadConfig:
    return WorkloadConfig(**{**cfg.__dict__, **kw})


RUNS = {
    "llama_single_m2": _with(LLAMA_LIKE, num_microbatches=2),
    "llama_tp2_m2": _with(LLAMA_LIKE, tp=2, num_microbatches=2),
    "gpt_single_m4": _with(GPT_LIKE, num_microbatches=4),
    "gpt_pp2_m4": _with(GPT_LIKE, pp=2, num_microbatches=4),
    "gpt_dp2_m2": _with(GPT_LIKE, dp=2, num_microbatches=2),
    "llama_single_m4": _with(LLAMA_LIKE, num_microbatches=4),
    "llama_tp2_pp2_m4": _with(LLAMA_LIKE, tp=2, pp=2, num_microbatches=4),
    "llama_tp2_dp2_m2": _with(LLAMA_LIKE, tp=2, dp=2, num_microbatches=2),
    "gpt_dp2_pp2_m2": _with(GPT_LIKE, dp=2, pp=2, num_microbatches=2),
}
_cache: dict = {}


def result(name: str) -> dict:
    """Run every configuration of the same world size as ``name`` in one torchrun job, once per session
    (correctness only, so more processes than cores is allowed)."""
    if name not in _cache:
        names = [n for n, c in RUNS.items() if c.world_size == RUNS[name].world_size]
        results = launch_many([RUNS[n] for n in names], timeout_s=180, allow_oversubscribe=True)
        _cache.update(zip(names, results))
    return _cache[name]


# ------------------------------------------------------------------------------------------ torch-free
def test_config_problems_name_the_bad_field():
    assert WorkloadConfig().problems() == []
    assert any("vocab" in p for p in WorkloadConfig(vocab=255, tp=2).problems())
    assert any("n_layers" in p for p in WorkloadConfig(n_layers=3, pp=2).problems())
    assert any("activation" in p for p in WorkloadConfig(activation="relu").problems())
    assert WorkloadConfig(mbs=2, num_microbatches=3, dp=2).gbs == 12


def test_launch_refuses_oversubscription(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(WorkloadError, match="oversubscribe"):
        launch(WorkloadConfig(tp=2, dp=2))


def _fake_result(cfg: WorkloadConfig) -> dict:
    times = [0.10, 0.11, 0.12, 0.13]
    return {"config": cfg.__dict__, "processes": cfg.world_size, "threads": 1, "cores_available": 2,
            "cpu_model": "Test CPU", "torch_version": "x", "backend": "gloo", "schedule": "1F1B",
            "data_parallel": "none", "iteration_times_s": times, "median_s": 0.115, "p10_s": 0.103, "p90_s": 0.127,
            "min_s": 0.10, "max_s": 0.13, "losses": [5.6, 5.0]}


def test_run_file_has_published_schema_and_loads(tmp_path, shared_validation):
    cfg = _with(GPT_LIKE, pp=2, num_microbatches=4)
    path = write_runs_csv([result_to_row(_fake_result(cfg), "CPU-T01")], tmp_path / "runs.csv")
    header = (shared_validation / "published_runs.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert tuple(header) == RUN_COLUMNS
    (row,) = load_runs(path)
    assert row.tier == "A" and row.measured_metric == "iteration_time_s" and row.measured_value == 0.115
    assert (row.get("tp"), row.get("pp"), row.get("dp"), row.get("mbs"), row.get("gbs")) == (1, 2, 1, 1, 4)
    assert row.get("n_gpus") == 2 and map_gpu(row.text["gpu"]) == ("cpu", "")
    assert "unknown GPU" not in row.skip_reason and "not understood" not in row.skip_reason
    assert "median of 4" in row.text["notes"] and "p10..p90 = 0.103..0.127 s" in row.text["notes"]


# ------------------------------------------------------------------------------------------ torchrun
@needs_torch
@pytest.mark.parametrize("name", ["llama_tp2_m2", "gpt_pp2_m4", "gpt_dp2_m2", "llama_tp2_pp2_m4", "llama_tp2_dp2_m2",
                                  "gpt_dp2_pp2_m2"])
def test_parallel_modes_run_and_loss_decreases(name):
    res = result(name)
    cfg = RUNS[name]
    assert res["processes"] == cfg.world_size
    times = sorted(res["iteration_times_s"])
    assert len(times) == cfg.iters and times[0] > 0
    assert res["median_s"] == times[cfg.iters // 2] and (res["min_s"], res["max_s"]) == (times[0], times[-1])
    assert times[0] <= res["p10_s"] <= res["median_s"] <= res["p90_s"] <= times[-1]
    losses = res["losses"]
    assert len(losses) == cfg.warmup + cfg.iters
    # initial loss of a near-uniform predictor is about ln(vocab); AdamW on 4 repeated batches lowers it
    assert abs(losses[0] - math.log(cfg.vocab)) < 0.5
    assert losses[-1] < losses[0] - 0.05


@needs_torch
def test_tensor_parallel_matches_unsharded_model():
    tp, ref = result("llama_tp2_m2")["losses"], result("llama_single_m2")["losses"]
    assert abs(tp[0] - ref[0]) < 1e-5          # forward of the same weights and tokens
    assert max(abs(a - b) for a, b in zip(tp, ref)) < 1e-4   # and the same training trajectory


@needs_torch
def test_pipeline_1f1b_matches_gradient_accumulation():
    pp, ref = result("gpt_pp2_m4")["losses"], result("gpt_single_m4")["losses"]
    assert max(abs(a - b) for a, b in zip(pp, ref)) < 1e-5


@needs_torch
def test_data_parallel_matches_the_same_global_batch():
    dp, ref = result("gpt_dp2_m2")["losses"], result("gpt_single_m4")["losses"]
    assert max(abs(a - b) for a, b in zip(dp, ref)) < 1e-5


@needs_torch
@pytest.mark.parametrize("name, ref, first_tol, tol", [
    ("llama_tp2_pp2_m4", "llama_single_m4", 1e-5, 1e-4),   # TP x PP: the unsharded model
    ("llama_tp2_dp2_m2", "llama_single_m4", None, 1e-4),   # TP x DP: the same global batch
    ("gpt_dp2_pp2_m2", "gpt_single_m4", None, 1e-5),       # DP x PP: the same global batch
])
def test_mixed_layouts_match_the_unsharded_model(name, ref, first_tol, tol):
    mixed, base = result(name)["losses"], result(ref)["losses"]
    if first_tol is not None:
        assert abs(mixed[0] - base[0]) < first_tol
    assert max(abs(a - b) for a, b in zip(mixed, base)) < tol


@needs_torch
def test_vocab_parallel_cross_entropy_is_exact_on_one_shard():
    """The fused vocab-parallel cross-entropy (tensor_parallel._VocabParallelCE) equals torch's
    cross-entropy in loss and gradient on a single-rank group (world 1: the all-reduces are identities)."""
    import os

    import torch
    import torch.distributed as dist

    from costmodel.profiling.workloads.tensor_parallel import _VocabParallelCE

    created = not dist.is_initialized()
    if created:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29573")
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        gen = torch.Generator().manual_seed(0)
        logits = (torch.randn(16, 50, generator=gen, dtype=torch.float64) * 4)
        target = torch.randint(0, 50, (16,), generator=gen)
        weight = torch.randn(16, generator=gen, dtype=torch.float64)
        ref_in, got_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        ref = torch.nn.functional.cross_entropy(ref_in, target, reduction="none")
        got = _VocabParallelCE.apply(got_in, target, 0, None)
        (ref * weight).sum().backward()
        (got * weight).sum().backward()
        assert torch.allclose(got, ref, atol=1e-12)
        assert torch.allclose(got_in.grad, ref_in.grad, atol=1e-12)
    finally:
        if created:
            dist.destroy_process_group()


@needs_torch
def test_workload_adamw_is_a_fused_or_foreach_adamw_with_the_config_hyperparameters():
    import torch

    from costmodel.profiling.workloads.train import make_adamw

    cfg = WorkloadConfig(lr=0.01, weight_decay=0.1)
    got, ref = torch.nn.Parameter(torch.linspace(-1, 1, 8)), torch.nn.Parameter(torch.linspace(-1, 1, 8))
    opt = make_adamw([got], cfg)
    assert opt.defaults.get("fused") or opt.defaults.get("foreach")
    ref_opt = torch.optim.AdamW([ref], lr=0.01, weight_decay=0.1, foreach=False)  # torch's for-loop reference
    for step in range(3):
        for p, o in ((got, opt), (ref, ref_opt)):
            o.zero_grad()
            ((p - 0.5 * step) ** 2).sum().backward()
            o.step()
    assert torch.allclose(got, ref, atol=1e-6) and not torch.allclose(got, torch.linspace(-1, 1, 8))


class _FakeLibc:
    def __init__(self, result: int):
        self.calls: list = []
        self.result = result

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.result


@needs_torch
def test_cached_malloc_raises_the_mmap_threshold_and_disables_trimming(monkeypatch):
    import ctypes

    from costmodel.profiling.workloads import train

    libc = _FakeLibc(1)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    assert train.keep_freed_memory() is True
    assert libc.calls == [(train.M_MMAP_THRESHOLD, train.MMAP_THRESHOLD_MAX), (train.M_TRIM_THRESHOLD, 2**31 - 1)]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeLibc(0))  # mallopt refuses: not cached
    assert train.keep_freed_memory() is False

    def no_libc(name):
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert train.keep_freed_memory() is False


# ---- benchmark helpers (benchmarks/cpu_validation.py, benchmarks/cpu_ground_truth.py): pure functions
def _bench(name: str):
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_are_pooled_and_kept():
    pool = _bench("cpu_validation").pool
    a = {"iteration_times_s": [1.0, 2.0, 3.0], "median_s": 2.0, "x": 1}
    b = {"iteration_times_s": [4.0, 5.0, 6.0], "median_s": 5.0, "x": 2}
    got = pool([a, b])
    assert got["iteration_times_s"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and got["median_s"] == 3.5
    assert got["round_medians_s"] == [2.0, 5.0] and got["min_s"] == 1.0 and got["max_s"] == 6.0
    assert got["p10_s"] == pytest.approx(1.5) and got["p90_s"] == pytest.approx(5.5) and got["x"] == 2


def test_reproduction_check_against_an_earlier_run(tmp_path):
    import json

    from costmodel.profiling.workloads.runner import write_runs_csv

    compare = _bench("cpu_ground_truth").compare
    old = write_runs_csv([{"id": "A", "measured_value": 1.0, "notes": ""},
                          {"id": "B", "measured_value": 1.0, "notes": ""}], tmp_path / "old.csv")
    new = tmp_path / "cpu_runs.json"  # the new run's raw results, as benchmarks/cpu_validation.py writes them
    new.write_text(json.dumps([{"id": "A", "median_s": 1.05, "p10_s": 0.98, "p90_s": 1.1},
                               {"id": "B", "median_s": 1.3, "p10_s": 1.2, "p90_s": 1.4},
                               {"id": "C", "median_s": 2.0, "p10_s": 1.9, "p90_s": 2.1}]))
    got = {c["id"]: c for c in compare(new, old)}
    assert set(got) == {"A", "B"}
    assert got["A"]["previous_inside_p10_p90"] and not got["B"]["previous_inside_p10_p90"]
    assert got["B"]["diff_pct"] == pytest.approx(30.0) and got["A"]["p90_s"] == 1.1
    assert "error_pct" not in got["A"]
    # with both runs' prediction errors: A's error moved 2 pp inside a +-5.7 % half spread, B's 9 pp outside +-7.7 %
    got = {c["id"]: c for c in compare(new, old, {"A": -3.0, "B": 4.0, "C": 1.0}, {"A": -5.0, "B": -5.0})}
    assert got["A"]["error_shift_pp"] == pytest.approx(2.0) and got["A"]["error_within_half_spread"]
    assert got["B"]["half_spread_pct"] == pytest.approx(50 * 0.2 / 1.3) and not got["B"]["error_within_half_spread"]
