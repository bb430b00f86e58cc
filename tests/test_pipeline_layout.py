"""Explicit virtual-stage layouts (ParallelPlan.pipeline_layout): parsing, validation, the layers each stage holds,
in-flight activations, prediction (a layout equal to the classic split predicts identically), request / CLI keys and
the Megatron / torchtitan exports."""

import dataclasses
import json
import re
import shlex

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlanError, PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.pipeline_layout import balanced_pipeline_layout, parse_pipeline_layout
from costmodel.memory.per_gpu import inflight_microbatches, layout_inflight, memory_per_gpu
from planner.cli import app
from planner.export import export_plan, torchtitan_model_parts
from planner.prediction import predict
from planner.requests import PlanRequest
from tests.helpers import llama, plan

HW = load_catalogue().resolve("a100-80gb")
L40 = llama(layers=40, hidden=2048, heads=16, kv=8, ffn=5632, vocab=32000)


def test_parse_counts_and_megatron_strings():
    assert parse_pipeline_layout("2,2,1,1", 2) == ((2, 2, 1, 1), 2)
    # the Megatron-Core DeepSeek-V3 guide's layout: E + 1 layer, 30 stages of 2, L alone (61 layers, 32 stages)
    counts, vpp = parse_pipeline_layout("Et|(tt|)*30L", 4)
    assert counts == (1,) + (2,) * 30 + (0,) and vpp == 8 and sum(counts) == 61
    assert parse_pipeline_layout("E,t*3|t*2||t,L", 2)[0] == (3, 2, 0, 1)  # commas cosmetic, empty stage legal
    for bad, why in (("Et|tm|L", "unknown item"), ("t|tL", "starts with E"), ("Et|t", "ends with L"),
                     ("Et|t|t", "ends with L")):
        with pytest.raises(PlanError, match=why):
            parse_pipeline_layout(bad, 1)
    with pytest.raises(PlanError, match="not a multiple of PP=2"):
        parse_pipeline_layout("1,2,3", 2)


def test_balanced_layout_is_automodels_default_split():
    # generate_hf_model_fqn_per_model_part: num_layers // stages each, the first num_layers % stages one more
    assert balanced_pipeline_layout(61, 4, 8) == (2,) * 29 + (1,) * 3
    assert balanced_pipeline_layout(32, 4) == (8, 8, 8, 8)  # its docstring's example
    assert balanced_pipeline_layout(5, 2, 2) == (2, 1, 1, 1)


def test_plan_validates_the_layout():
    good = plan(gpus=8, gbs=64, pp=4, vpp=3, pipeline_layout=[4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2])
    assert good.pipeline_layout == (4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2) and good.problems(L40) == []
    assert good.stage_layers(40) == (11, 11, 9, 9) and not good.needs_layer_split(40)
    # chunk a of stage b is virtual stage a*PP + b; layers in model order over virtual stages
    idx = good.stage_layer_indices(40)
    assert idx[0] == [0, 1, 2, 3, 16, 17, 18, 19, 30, 31, 32] and idx[3][-2:] == [38, 39]
    assert sorted(i for s in idx for i in s) == list(range(40))
    cases = {(4,) * 10: "PP\\*VPP = 4\\*3 = 12 needed", (4,) * 11 + (3,): "holds 47 layers",
             (5, 5, 5, 5, 5, 5, 5, -1, 3, 3, 0, 0): "non-negative",
             (5, 5, 4, 0, 5, 5, 4, 0, 4, 4, 4, 0): "stage\\(s\\) 3"}
    for lay, why in cases.items():
        bad = dataclasses.replace(good, pipeline_layout=lay)
        assert any(re.search(why, m) for m in bad.problems(L40)), (lay, bad.problems(L40))
    assert "disagrees" in " ".join(dataclasses.replace(good, layer_split=(10, 10, 10, 10)).problems(L40))
    assert dataclasses.replace(good, layer_split=(11, 11, 9, 9)).problems(L40) == []
    # the same layers per stage as a classic split: Megatron's rule refuses it (11 is not a multiple of VPP=3)
    assert dataclasses.replace(good, pipeline_layout=None, layer_split=(11, 11, 9, 9)).problems(L40)


def test_layout_inflight_matches_the_formula_for_equal_chunks_and_counts_layers_otherwise():
    for p, v, m, g in ((4, 8, 8, 4), (4, 2, 16, 4), (8, 4, 16, 8), (4, 3, 6, 5)):
        for i in range(p):
            assert layout_inflight([2] * v, p, i, m, g) == inflight_microbatches(p, i, m, v, g)
    # PP=2, VPP=2, 4 micro-batches, stage 0 chunks of 3 and 1 layers: warm-up 2*(2-0-1) + (2-1)*2 = 4 forwards
    # (chunks 0, 0, 1, 1: 3+3+1+1 = 8 layers); then F(mb 2, chunk 0) +3 = 11, B(mb 0, chunk 1) -1 = 10,
    # F(mb 3, chunk 0) +3 = 13 (the peak: the first backwards free the small last chunk), B(mb 1, chunk 1) -1 ...
    assert layout_inflight([3, 1], 2, 0, 4, 2) == 13 / 4
    assert layout_inflight([1, 3], 2, 0, 4, 2) == 9 / 4  # warm-up and one more forward: 1+1+3+3+1


def test_layout_equal_to_the_classic_split_predicts_identically():
    base = plan(gpus=32, gbs=128, seq=2048, tp=2, pp=4, vpp=2)
    same = dataclasses.replace(base, pipeline_layout=(5,) * 8)
    a, b = predict(L40, base, HW), predict(L40, same, HW)
    assert a.iteration_time_s == b.iteration_time_s and a.to_dict() == b.to_dict()
    assert memory_per_gpu(L40, base, HW.gpu) == memory_per_gpu(L40, same, HW.gpu)  # the layout path of memory.py


def test_uneven_layout_predicts_from_its_stages():
    lay = dataclasses.replace(plan(gpus=32, gbs=128, seq=2048, tp=2, pp=4, vpp=3),
                              pipeline_layout=(4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2))
    assert lay.problems(L40) == []
    pred = predict(L40, lay, HW)
    heavy = dataclasses.replace(lay, pipeline_layout=(10, 4, 4, 4, 1, 4, 3, 3, 1, 3, 1, 2))
    assert predict(L40, heavy, HW).iteration_time_s > pred.iteration_time_s  # 12 layers on stage 0, not 11


def test_request_key_and_cli_flag():
    req = PlanRequest(model="llama-13b", gpu="h100-sxm", gpus=64, tp=2, pp=4, pipeline_layout="Et*5|(t*5|)*6t*5L")
    assert req.pipeline_layout == (5,) * 8
    res = req.resolve()
    assert res.plan.vpp == 2 and res.plan.pipeline_layout == (5,) * 8  # VPP = virtual stages / PP
    assert PlanRequest.from_dict({"model": "x", "gpu": "y", "gpus": 8, "pipeline_layout": [2, 1]}).pipeline_layout \
        == (2, 1)
    for bad in ([2, -1], "2,x", [True, 1], []):
        with pytest.raises(PlannerError, match="pipeline"):
            PlanRequest(model="x", gpu="y", gpus=8, pipeline_layout=bad)
    runner = CliRunner()
    args = ["predict", "--model", "llama-13b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "2", "--pp", "4"]
    out = runner.invoke(app, args + ["--pipeline-layout", "4,4,4,4,4,4,3,3,3,3,2,2", "--format", "json"])
    assert out.exit_code == 0, out.output
    rec = json.loads(out.stdout)
    assert rec["plan"]["vpp"] == 3 and rec["plan"]["pipeline_layout"] == [4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2]
    out = runner.invoke(app, args + ["--pipeline-layout", "4,4,4,4"])
    assert out.exit_code == 2 and "holds 16 layers; the model has 40" in out.output
    # a plan without a layout keeps its JSON as before (no pipeline_layout key)
    assert "pipeline_layout" not in json.loads(runner.invoke(app, args + ["--format", "json"]).stdout)["plan"]


def test_exports_carry_the_layout():
    lay = dataclasses.replace(plan(gpus=32, gbs=128, seq=2048, tp=2, pp=4, vpp=3),
                              pipeline_layout=(4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2))
    text = export_plan(L40, lay, HW, predict(L40, lay, HW), "megatron")
    tokens = shlex.split(text, comments=True)
    layout = tokens[tokens.index("--pipeline-model-parallel-layout") + 1]
    assert parse_pipeline_layout(layout, 4) == (lay.pipeline_layout, 3)  # Megatron derives VPP = 12 / 4
    assert "--num-layers-per-virtual-pipeline-stage" not in tokens
    assert "--decoder-first-pipeline-num-layers" not in tokens
    parts = torchtitan_model_parts(lay)
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == list(lay.pipeline_layout)
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
