"""TP communication overlap as a plan input (Megatron --tp-comm-overlap): the flag, the batch key and the Python API
set it; it needs TP > 1 with sequence parallelism (one line, exit 2 otherwise); overlapping never makes a plan
slower, and the JSON record says it was on."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import planner
from planner.cli import app

FLAGS = ["predict", "--model", "llama-13b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "4", "--pp", "2",
         "--format", "json"]


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_overlap_hides_tp_communication_and_is_recorded():
    off, on = _json(FLAGS), _json([*FLAGS, "--tp-comm-overlap"])
    assert "tp_comm_overlap" not in off["plan"] and on["plan"]["tp_comm_overlap"] is True
    assert on["iteration_time_s"] < off["iteration_time_s"]
    api = planner.predict(model="llama-13b", gpu="h100-sxm", gpus=16, tp=4, pp=2, tp_comm_overlap=True)
    assert api.iteration_time_s == on["iteration_time_s"]


def test_batch_key_gives_what_the_flag_gives(tmp_path):
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"model": "llama-13b", "gpu": "h100-sxm", "gpus": 16, "tp": 4, "pp": 2,
                                 "tp_comm_overlap": True}) + "\n")
    res = CliRunner().invoke(app, ["predict", "--batch", str(batch), "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout.splitlines()[0])
    assert row["iteration_time_s"] == _json([*FLAGS, "--tp-comm-overlap"])["iteration_time_s"]


def test_overlap_without_sequence_parallelism_is_one_line_exit_2():
    for extra in (["--tp", "1"], ["--no-sequence-parallel"]):
        res = CliRunner().invoke(app, [*FLAGS, "--tp-comm-overlap", *extra])
        assert res.exit_code == 2, res.output
        assert "tp_comm_overlap needs TP > 1 with sequence parallelism" in res.output
        assert "Traceback" not in res.output
