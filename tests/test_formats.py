"""--format table | json | csv | md on every command that prints results, one set of column names (with units)
across commands (planner/formats.py), grouped warnings, validate's summary first, the Mistral preset's
sliding-window warning (issue 16 items 2-3)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.formats import HEADERS, PLAN_FIELDS, group_warnings, shown_warnings

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "fixtures" / "runs_small.csv"
LOG = ROOT / "examples" / "logs" / "nemo_llama2-7b.log"
SMALL = ["--tp", "1,2", "--pp", "1,2", "--cp", "1", "--vpp", "1", "--mbs", "1,2", "--recompute", "selective",
         "--zero", "1"]
PLAN = ["--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8"]
SIZE = ["size", "--model", "llama-7b", "--tokens", "1e10", "--deadline", "30d", "--gpu", "a100-80gb",
        "--max-gpus", "64"]
SEARCH = ["search", "--model", "llama-7b", "--gpus", "16", *SMALL, "--exhaustive", "--no-progress", "--top", "3"]
COMPARE = ["compare", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpu", "h100-sxm", "--gpus", "8"]


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("batch") / "b.jsonl"
    p.write_text('{"id": "a", "model": "llama-7b", "gpu": "a100-80gb", "gpus": 8}\n'
                 '{"id": "b", "model": "llama-7b"}\n', encoding="utf-8")
    return p


def _commands(batch: Path, tmp: Path) -> dict[str, list[str]]:
    return {
        "predict": ["predict", *PLAN],
        "predict --batch": ["predict", "--batch", str(batch)],
        "explain": ["explain", *PLAN],
        "size": SIZE,
        "compare": COMPARE,
        "search": SEARCH,
        "gpus": ["gpus"],
        "models": ["models"],
        "validate": ["validate", "--runs", str(RUNS), "--cv", "none"],
        "costmodel report": ["costmodel", "report"],
        "calibrate": ["calibrate", "--runs", str(RUNS), "--name", "t", "--constants", "compute_scale", "--out",
                      str(tmp)],
        "runs import": ["runs", "import", "--from", "nemo", str(LOG), "--model", "llama-7b", "--gpu", "h100-sxm",
                        "--gpus", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--seq-len", "4096", "--dtype", "fp8"],
    }


def _stdout(args: list[str]) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


def _csv(text: str) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows, text
    head = next(csv.reader(io.StringIO(text)))
    assert all(None not in r and len(r) == len(head) for r in rows), text  # no ragged rows
    return rows


def _md_ok(text: str) -> None:
    lines = text.splitlines()
    seps = [i for i, ln in enumerate(lines) if re.fullmatch(r"\|(-{3,}\|)+", ln)]
    assert seps, text
    for i in seps:  # a header row above each separator, with as many cells
        assert i > 0 and lines[i - 1].startswith("| ") and lines[i - 1].count(" | ") + 1 == lines[i].count("---")


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "md"])
@pytest.mark.parametrize("name", ["predict", "predict --batch", "explain", "size", "compare", "search", "gpus",
                                  "models", "validate", "costmodel report", "calibrate", "runs import"])
def test_every_command_takes_every_format(name, fmt, batch_file, tmp_path):
    out = _stdout(_commands(batch_file, tmp_path)[name] + ["--format", fmt])
    assert out.strip(), out
    if fmt == "json":
        if name == "predict --batch":  # one object per request line (as jsonl)
            recs = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
            assert [r["id"] for r in recs] == ["a", "b"] and "error" in recs[1]
        else:
            json.loads(out)
    elif fmt == "csv":
        rows = _csv(out)
        if name == "predict --batch":
            assert [r["id"] for r in rows] == ["a", "b"] and rows[1]["error"] and not rows[0]["error"]
    elif fmt == "md":
        _md_ok(out)


def test_a_bad_format_is_one_line_exit_2():
    for args in (["predict", *PLAN], SIZE, ["explain", *PLAN], ["gpus"], ["models"]):
        res = CliRunner().invoke(app, [*args, "--format", "xml"])
        assert res.exit_code == 2, (args, res.output)
        assert "Traceback" not in res.output


def test_plan_columns_are_the_same_across_commands(batch_file):
    search = next(csv.reader(io.StringIO(_stdout(SEARCH + ["--format", "csv"]))))
    compare = next(csv.reader(io.StringIO(_stdout(COMPARE + ["--format", "csv"]))))
    size = next(csv.reader(io.StringIO(_stdout(SIZE + ["--format", "csv"]))))
    predict = next(csv.reader(io.StringIO(_stdout(["predict", *PLAN, "--format", "csv"]))))
    plan = [f.header for f in PLAN_FIELDS]
    assert search == compare == predict == plan
    assert size[-len(plan):] == plan  # size: its allocation columns, then the same plan columns
    rows = _csv(_stdout(SIZE + ["--format", "csv"]))
    assert rows[0]["GPU"] == "a100-80gb" and float(rows[0][HEADERS["iteration_time_s"]]) > 0


def test_every_quantity_column_names_its_unit():
    for key in ("iteration_time_s", "iteration_time_low_s", "tokens_per_s", "model_tflops_per_gpu", "mfu",
                "memory_gib_per_gpu", "price_usd_per_gpu_hour", "usd_per_mtoken", "time_to_train_s",
                "cost_to_train_usd", "mbs", "gbs", "seq_len", "params_billion", "samples_per_s"):
        assert re.search(r"\[[^\]]+\]$", HEADERS[key]), HEADERS[key]


def test_same_cause_warnings_collapse_into_one_line_with_a_count():
    ws = [f"attention_fwd seq_q={n} outside sampled range [1, 16384] for a100-80gb: anchored to the roofline"
          for n in range(20000, 20012)]
    ws += ["no measured inter-node all_gather data for a100-80gb: using the median of measured GPUs",
           "no measured optimizer data for a100-80gb: using the median of measured GPUs",
           "memory: does not fit", "memory: does not fit", "something else"]
    out = group_warnings(ws)
    assert len(out) == 4, out
    assert out[0].startswith("outside sampled range for a100-80gb: anchored to the roofline (x12: ")
    assert out[0].endswith(", ...)") and "attention_fwd seq_q=20000" in out[0]
    assert out[1] == ("no measured data for a100-80gb: using the median of measured GPUs "
                      "(x2: inter-node all_gather, optimizer)")
    assert out[2] == "memory: does not fit (x2)" and out[3] == "something else"
    lines, note = shown_warnings(ws, verbose=False)
    assert lines == out and "17 warnings grouped into 4" in note and "--verbose" in note
    assert shown_warnings(ws, verbose=True) == (ws, "")
    assert group_warnings(["a", "b"]) == ["a", "b"]  # nothing to group: unchanged


def test_predict_groups_warnings_and_verbose_lists_each():
    args = ["predict", "--model", "mistral-7b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "2", "--pp", "2"]
    recs = json.loads(_stdout(args + ["--format", "json"]))
    grouped = [ln for ln in _stdout(args).splitlines() if ln.startswith("warning:")]
    each = [ln for ln in _stdout(args + ["--verbose"]).splitlines() if ln.startswith("warning:")]
    assert len(grouped) == len(group_warnings(recs["warnings"])) <= len(each)
    assert len(each) >= len(recs["warnings"])  # every warning (long ones wrap onto more lines)


def test_mistral_preset_warns_about_its_sliding_window():
    args = ["predict", "--model", "mistral-7b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "2", "--pp", "2",
            "--format", "json"]
    warnings = json.loads(_stdout(args))["warnings"]
    assert any("ignored: sliding_window" in w for w in warnings), warnings
    config = ROOT / "tests" / "fixtures" / "hf_configs" / "mistral-7b.json"
    from_config = json.loads(_stdout([*args[:2], str(config), *args[3:]]))["warnings"]
    assert any("ignored: sliding_window" in w for w in from_config)  # the same warning both ways


def test_validate_prints_its_summary_first_and_the_rows_only_with_verbose(tmp_path):
    out = _stdout(["validate", "--runs", str(RUNS), "--cv", "none"])
    first = out.strip().splitlines()[0]
    assert re.match(r"\d+ runs predicted, \d+ skipped: MAPE", first), out
    assert "Predicted vs measured" not in out and "--verbose" in out
    verbose = _stdout(["validate", "--runs", str(RUNS), "--cv", "none", "--verbose"])
    assert verbose.strip().splitlines()[0] == first
    assert verbose.index("Error summary") < verbose.index("Predicted vs measured")
    report = tmp_path / "v.txt"
    _stdout(["validate", "--runs", str(RUNS), "--cv", "none", "--out", str(report)])
    text = report.read_text(encoding="utf-8")
    assert text.startswith(first[:20]) and "Predicted vs measured" in text  # the file has the rows
