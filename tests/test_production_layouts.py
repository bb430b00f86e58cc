"""Published production training layouts (tests/fixtures/production_layouts.jsonl) go through the batch path.

Each fixture line is one `planner predict --batch` request plus a ``source`` field naming where the layout
is published (paper + table/section, or vendor recipe file + commit). JSONL has no comments and the batch
reader refuses unknown keys, so the test strips ``source`` before sending the line. Every line must predict
without error, with a finite positive iteration time, and the returned plan must be the requested one:
GPUs, TP/PP/CP/VPP, MBS, GBS, sequence length and every other key the line sets, and the layer split (the
requested one when the line gives it; otherwise one PP-long split summing to the layer count whenever the
layers do not divide evenly into PP x VPP).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from costmodel.core.specs.presets import resolve_model
from planner.cli_predict import run_batch
from planner.requests import REQUEST_KEYS

FIXTURE = Path(__file__).parent / "fixtures" / "production_layouts.jsonl"
LINES: list[dict] = [json.loads(text) for text in FIXTURE.read_text(encoding="utf-8").splitlines() if text.strip()]
BY_ID = {line["id"]: line for line in LINES}

# Request keys the response echoes under the same name in its "plan" object.
ECHOED = ("gpus", "tp", "pp", "cp", "vpp", "mbs", "gbs", "seq_len", "recompute", "sequence_parallel", "zero",
          "dtype")


def _request(line: dict) -> dict:
    """The batch request of a fixture line: everything but its ``source`` citation."""
    return {k: v for k, v in line.items() if k != "source"}


@pytest.fixture(scope="module")
def responses() -> dict:
    """One batch run over the whole fixture, keyed by id."""
    out = list(run_batch(json.dumps(_request(line)) for line in LINES))
    assert len(out) == len(LINES)
    return {rec["id"]: rec for rec in out}


def test_battery_is_large_cited_and_well_formed():
    assert len(LINES) >= 30
    assert len(BY_ID) == len(LINES), "ids must be unique"
    for line in LINES:
        assert isinstance(line.get("source"), str) and len(line["source"]) > 40, line["id"]
        unknown = set(_request(line)) - set(REQUEST_KEYS)
        assert not unknown, f"{line['id']}: keys {unknown} are not batch-request keys"


@pytest.mark.parametrize(("rid", "gpu", "gpus", "layers", "layout"), [
    ("llama3-405b-h100-16384", "h100-sxm", 16384, 126, {"tp": 8, "pp": 16, "gbs": 2048, "seq_len": 8192}),
    ("bloom-176b-a100-384", "a100-80gb", 384, 70, {"tp": 4, "pp": 12}),
    ("mtnlg-530b-a100-2240", "a100-80gb", 2240, 105, {"tp": 8, "pp": 35}),
    ("gpt3-175b-a100-1024", "a100-80gb", 1024, 96, {}),
    ("nemo-llama31-405b-recipe", "h100-sxm", 576, 126, {}),
    ("nemo-nemotron4-340b-recipe", "h100-sxm", 6144, 96, {}),
    ("dgxc-llama31-405b-gb200-128", "gb200", 128, 126, {"tp": 4, "pp": 8, "cp": 2, "vpp": 8}),
    ("dgxc-llama31-405b-gb200-256", "gb200", 256, 126, {"tp": 4, "pp": 8, "cp": 2, "vpp": 8}),
    ("dgxc-llama31-405b-gb200-512", "gb200", 512, 126, {"tp": 4, "pp": 8, "cp": 2, "vpp": 8}),
])
def test_issue_14_required_layouts_are_in_the_battery(rid, gpu, gpus, layers, layout):
    line = BY_ID[rid]
    assert (line["gpu"], line["gpus"]) == (gpu, gpus)
    assert resolve_model(line["model"]).num_layers == layers
    for key, value in layout.items():
        assert line.get(key) == value, (rid, key)


@pytest.mark.parametrize("rid", list(BY_ID))
def test_published_layout_predicts_as_requested(rid, responses):
    line, rec = BY_ID[rid], responses[rid]
    assert "error" not in rec, f"{rid}: {rec.get('error')}"
    t = rec["iteration_time_s"]
    assert isinstance(t, (int, float)) and math.isfinite(t) and t > 0, t
    plan = rec["plan"]
    for key in ECHOED:
        if key in line:
            assert plan[key] == line[key], f"{rid}: {key} requested {line[key]!r}, plan has {plan[key]!r}"
    assert plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"] == plan["gpus"]
    assert rec["tokens_per_s"] == pytest.approx(plan["gbs"] * plan["seq_len"] / t, rel=1e-9)
    layers = resolve_model(line["model"]).num_layers
    split = plan.get("layer_split")
    if "layer_split" in line:
        assert split is not None and list(split) == line["layer_split"], f"{rid}: split {split}"
    elif layers % (plan["pp"] * plan["vpp"]):
        assert split is not None, f"{rid}: {layers} layers on PP={plan['pp']} x VPP={plan['vpp']} need a split"
    if split is not None:
        assert len(split) == plan["pp"] and sum(split) == layers and min(split) > 0, f"{rid}: split {split}"
