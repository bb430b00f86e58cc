"""`planner runs import`: log lines of Megatron-LM, NeMo and torchtitan -> the run file validate and calibrate read."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.core.errors import PlannerError
from planner.runs_import import RUN_COLUMNS, read_log
from planner.validation.runs import OPTIONAL_TEXT_COLUMNS, REQUIRED_COLUMNS, load_runs

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "examples" / "logs"
GPT3 = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "8", "--pp", "8", "--vpp", "3",
        "--mbs", "1", "--seq-len", "2048", "--dtype", "fp16", "--zero", "0"]
LLAMA = ["--model", "llama-7b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "1", "--pp", "1", "--mbs", "1",
         "--seq-len", "4096", "--dtype", "fp8"]

# torchtitan MetricsProcessor.log (torchtitan/components/metrics.py @00fbaafa): colours on, log_freq 10
_C = "\x1b[31m"
TITAN = "\n".join(
    f"[rank0]:[titan] 2026-01-01 00:00:00,000 - root - INFO - {_C}step: {s:2}  {_C}loss: 10.1234  "
    f"{_C}grad_norm:  1.2345  {_C}memory: 40.12GiB(42.23%)  {_C}tps: {tps:,}  {_C}tflops: {tf:,.2f}  "
    f"{_C}mfu: {mfu:.2f}%\x1b[39m"
    for s, tps, tf, mfu in ((1, 1_200, 70.0, 7.08), (10, 6_800, 390.5, 39.48), (20, 7_000, 402.0, 40.65),
                            (30, 7_100, 407.7, 41.22), (40, 6_900, 396.2, 40.06)))
TITAN += "\n[rank0]:[titan] - root - INFO - validate step: 40  loss: 10.0  memory: 40.12GiB(42.23%)  tps: 99,999\n"


def _planner(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


def test_run_columns_are_the_schema():
    assert set(RUN_COLUMNS) == set(REQUIRED_COLUMNS) | set(OPTIONAL_TEXT_COLUMNS)


def test_megatron_windows_and_median():
    s = read_log(LOGS / "megatron_gpt3-175b_selective.log", "megatron")
    # iteration 1's line does not reset Megatron's timer: the line at 10 averages 1-10 and is warm-up too
    assert [(ln.iteration, ln.first) for ln in s.lines][:3] == [(1, 1), (10, 1), (20, 11)]
    assert len(s.used) == 4 and s.medians["iteration_time_s"] == pytest.approx(13.75)
    assert s.medians["gbs"] == 64
    all_lines = read_log(LOGS / "megatron_gpt3-175b_selective.log", "megatron", skip=0)
    assert len(all_lines.used) == 6 and max(ln.values["iteration_time_s"] for ln in all_lines.used) == 40.0


def test_nemo_printer_and_progress_bar(tmp_path):
    s = read_log(LOGS / "nemo_llama2-7b.log", "nemo")
    assert s.medians["iteration_time_s"] == pytest.approx(3.87) and s.medians["gbs"] == 128
    assert [ln.iteration for ln in s.used] == [20, 30, 40, 50]
    # the Lightning progress bar: one step per \r update, global_step counted from 0
    bar = "\r".join(f"Epoch 0: : {i}%|##| {i}/100 [00:10<00:00, reduced_train_loss=1.0, global_step={i - 1}.00, "
                    f"consumed_samples={256 * i}.0, train_step_timing in s={3.0 if i > 12 else 9.0:.3f}]"
                    for i in range(1, 101))
    (tmp_path / "bar.log").write_text(bar + "\n")
    b = read_log(tmp_path / "bar.log", "nemo", skip=12)
    assert len(b.used) == 88 and b.medians["iteration_time_s"] == pytest.approx(3.0)


def test_torchtitan_tps_and_figures(tmp_path):
    (tmp_path / "titan.log").write_text(TITAN)
    s = read_log(tmp_path / "titan.log", "torchtitan", skip=10)
    assert s.metric == "tokens_per_s_per_gpu"
    assert [ln.iteration for ln in s.used] == [20, 30, 40]  # validation line ignored, step 10 averages 2-10
    assert s.medians == {"tokens_per_s_per_gpu": 7000, "tflops_per_gpu": 402.0, "mfu_pct": 40.65}


def test_bad_logs_are_one_line_errors(tmp_path):
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(PlannerError, match="no megatron iteration lines"):
        read_log(tmp_path / "empty.log", "megatron")
    with pytest.raises(PlannerError, match="lower --skip"):
        read_log(LOGS / "nemo_llama2-7b.log", "nemo", skip=50)
    with pytest.raises(PlannerError, match="--from 'deepspeed'"):
        read_log(LOGS / "nemo_llama2-7b.log", "deepspeed")


def _megatron_line(it: int, ms: float, gbs: int) -> str:
    """One Megatron-LM training_log line (megatron/training/training.py @001b00c2)."""
    return (f" [2026-01-01 00:00:00.000000] iteration {it:8d}/{80:8d} | consumed samples: {it * gbs:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | global batch size: {gbs:5d} | loss scale: 1.0 |")


# --rampup-batch-size 16 16 ...: batch 16, then 32, then the final 64 (a line's window may straddle a change)
RAMP = "\n".join(_megatron_line(it, ms, gbs) for it, ms, gbs in (
    (1, 9000.0, 16), (10, 1500.0, 16), (20, 1000.0, 16), (30, 1900.0, 32), (40, 2000.0, 32), (50, 3500.0, 64),
    (60, 4000.0, 64), (70, 4100.0, 64), (80, 3900.0, 64)))


def test_ramp_up_log_is_measured_on_its_final_constant_batch(tmp_path):
    (tmp_path / "ramp.log").write_text(RAMP + "\n")
    s = read_log(tmp_path / "ramp.log", "megatron")
    # the line at 50 is the first printing 64, but its window (41-50) may hold batch-32 iterations: left out
    assert [ln.iteration for ln in s.used] == [60, 70, 80] and s.medians["gbs"] == 64
    assert s.medians["iteration_time_s"] == pytest.approx(4.0)
    assert "final constant-batch segment (global batch 64 from iteration 51" in s.segment
    assert "16 -> 32 -> 64" in s.segment
    f = read_log(tmp_path / "ramp.log", "megatron", from_iteration=61)
    assert [ln.iteration for ln in f.used] == [70, 80] and "from 61 on" in f.segment
    with pytest.raises(PlannerError, match="changes from iteration 21 on .*later --from-iteration"):
        read_log(tmp_path / "ramp.log", "megatron", from_iteration=21)
    (tmp_path / "short.log").write_text(RAMP.rsplit("\n", 3)[0] + "\n")  # ends at the first batch-64 line
    with pytest.raises(PlannerError, match="no iteration line in the final constant-batch segment"):
        read_log(tmp_path / "short.log", "megatron")


def test_ramp_up_import_says_which_segment(tmp_path):
    (tmp_path / "ramp.log").write_text(RAMP + "\n")
    res = _planner("runs", "import", "--from", "megatron", str(tmp_path / "ramp.log"), *GPT3, "--format", "json")
    assert res.returncode == 0, res.stderr
    assert "measured on the final constant-batch segment (global batch 64 from iteration 51" in res.stderr
    row = json.loads(res.stdout)[0]
    assert row["gbs"] in (64, "64") and float(row["measured_value"]) == 4.0
    assert "measured on the final constant-batch segment" in row["notes"]
    res = _planner("runs", "import", "--from", "megatron", str(tmp_path / "ramp.log"), *GPT3, "--from-iteration", "61",
                   "--format", "json")
    assert res.returncode == 0 and "iterations 61-80" in res.stderr and "(--from-iteration)" in res.stderr


def test_missing_layout_is_refused_naming_the_flags(tmp_path):
    res = _planner("runs", "import", "--from", "megatron", str(LOGS / "megatron_gpt3-175b_full.log"),
                   "--model", "gpt3-175b", "--gpus", "64")
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "--gpu, --tp, --pp, --mbs, --seq-len, --dtype" in err[0]
    assert "--gbs" not in err[0]  # Megatron prints the global batch size
    res = _planner("runs", "import", "--from", "megatron", str(LOGS / "megatron_gpt3-175b_full.log"), *GPT3,
                   "--gbs", "128")
    assert res.returncode == 2 and "prints global batch size 64" in res.stderr


def test_import_validate_calibrate_loop(tmp_path, user_config_dir):
    runs = tmp_path / "runs.csv"
    for log, extra in (("megatron_gpt3-175b_full.log", ["--recompute", "full", "--no-sequence-parallel"]),
                       ("megatron_gpt3-175b_selective.log", ["--recompute", "selective", "--sequence-parallel"])):
        res = _planner("runs", "import", "--from", "megatron", str(LOGS / log), *GPT3, *extra, "--out", str(runs),
                       "--append")
        assert res.returncode == 0, res.stderr
    res = _planner("runs", "import", "--from", "nemo", str(LOGS / "nemo_llama2-7b.log"), *LLAMA, "--out", str(runs),
                   "--append")
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(runs.open()))
    assert [r["source"] for r in rows] == ["megatron_gpt3-175b_full.log", "megatron_gpt3-175b_selective.log",
                                           "nemo_llama2-7b.log"]
    assert [r["framework"] for r in rows] == ["megatron", "megatron", "nemo"]
    assert [float(r["measured_value"]) for r in rows] == [18.13, 13.75, 3.87]
    assert [r["notes"][:6] for r in rows] == ["TIER=A", "TIER=A", "TIER=B"]  # NeMo: recompute etc. not given
    loaded = load_runs(runs)
    assert [r.skip_reason for r in loaded] == ["", "", ""] and [r.tier for r in loaded] == ["A", "A", "B"]
    val = _planner("validate", "--runs", str(runs), "--format", "json", cwd=tmp_path)
    assert val.returncode == 0, val.stderr
    cal = _planner("calibrate", "--runs", str(runs), "--name", "mine", "--constants", "compute_scale",
                   "--format", "json", cwd=tmp_path)
    assert cal.returncode == 0, cal.stderr
    saved = user_config_dir / "planner" / "calibrations" / "mine.json"  # $XDG_CONFIG_HOME (tests/conftest.py)
    assert saved.is_file() and not (tmp_path / "calibrations").exists()
    assert json.loads(cal.stdout)["path"] == str(saved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    val = _planner("validate", "--runs", str(runs), "--format", "json", "--calibration", "mine", cwd=elsewhere)
    assert val.returncode == 0, val.stderr  # the name is found from any working directory
