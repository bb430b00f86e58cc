"""The Python API (planner.predict, explain, search, size, compare): the CLI's keywords and defaults, results whose
to_dict() is the command's --format json object, and errors as exceptions (never SystemExit)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import planner
from planner.calibrate import identity
from planner.requests import REQUEST_KEYS, PlanRequest
from tests.helpers import ROOT, cli_json

PLAN = dict(model="llama-13b", gpu="a100-80gb", gpus=16, tp=2, pp=2)
FLAGS = ["--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--pp", "2"]
SMALL_SEARCH = dict(model="llama-7b", gpus=16, tp="1,2", pp="1,2")


def _no_elapsed(obj):
    """A JSON object without its wall-clock figures (elapsed_s differs between two runs of the same search)."""
    if isinstance(obj, dict):
        return {k: _no_elapsed(v) for k, v in obj.items() if k != "elapsed_s"}
    if isinstance(obj, list):
        return [_no_elapsed(v) for v in obj]
    return obj


def test_the_package_exports_the_commands():
    assert {"predict", "explain", "search", "size", "compare", "PlannerError", "PlanError"} <= set(planner.__all__)
    assert all(callable(getattr(planner, name)) for name in ("predict", "explain", "search", "size", "compare"))
    from planner.search import engine  # the search package stays a package: its modules import as before

    assert callable(planner.search) and planner.search.engine is engine


def test_predict_keywords_are_the_plan_keys_with_the_requests_defaults():
    params = inspect.signature(planner.predict).parameters
    assert [k for k in REQUEST_KEYS if k != "id"] == list(params)[:len(REQUEST_KEYS) - 1]
    assert {"hardware_file", "models", "calibration"} <= set(params)
    for name, p in params.items():
        if name in ("model", "gpu", "gpus"):
            assert p.default is inspect.Parameter.empty
        elif name in REQUEST_KEYS:
            assert p.default == getattr(PlanRequest, name), name
    assert list(inspect.signature(planner.explain).parameters) == list(params)


def test_the_done_check_prints_what_the_cli_reports():
    code = ("import planner; print(planner.predict(model='llama-13b', gpu='a100-80gb', gpus=16, tp=2, pp=2)"
            ".iteration_time_s)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert float(out) == cli_json(["predict", *FLAGS])["iteration_time_s"]


def test_predict_and_explain_are_the_cli_json():
    assert planner.predict(**PLAN).to_dict() == cli_json(["predict", *FLAGS])
    assert planner.explain(**PLAN).to_dict() == cli_json(["explain", *FLAGS])


def test_to_dict_is_asdict():
    import dataclasses

    for plan in (PLAN, dict(model="mixtral-8x7b", gpu="h100-sxm", gpus=32, tp=2, ep=8, gbs=64, seq_len=4096)):
        res = planner.predict(**plan)
        assert res.to_dict() == dataclasses.asdict(res)
        d = res.to_dict()
        d["breakdown"][0]["time_s"] = -1.0  # a copy: the result is unchanged
        assert res.breakdown[0]["time_s"] > 0


def test_calibration_keyword_as_the_flag():
    default = planner.predict(**PLAN)
    plain = planner.predict(**PLAN, calibration="none")
    assert default.calibration == "default" and plain.calibration == "none"
    assert plain.to_dict() == cli_json(["predict", *FLAGS, "--calibration", "none"])
    assert plain.iteration_time_s < default.iteration_time_s
    mine = planner.predict(**PLAN, calibration=identity({"iteration_overhead_s": 1.0}, name="mine"))
    assert mine.calibration == "mine" and mine.iteration_time_s == pytest.approx(plain.iteration_time_s + 1.0)


def test_cli_text_forms_are_accepted():
    a = planner.predict(model="llama3-8b", gpu="h100-sxm", gpus=24, pp=3, layer_split="12,10,10",
                        tokens_per_batch="1M")
    b = planner.predict(model="llama3-8b", gpu="h100-sxm", gpus=24, pp=3, layer_split=[12, 10, 10],
                        tokens_per_batch=1_000_000)
    assert a.to_dict() == b.to_dict() and a.layer_split == [12, 10, 10]


def test_zero_auto_is_the_default_and_takes_the_stage_text_forms():
    """The API leaves zero to auto as the CLI does (the Llama 3 405B layout of issue 26 is costed at ZeRO-2, as
    --zero 2 costs it) and takes a stage as an integer or its digit."""
    plan = dict(model="llama3-405b", gpu="h100-sxm", gpus=16384, tp=8, pp=16, vpp=2, mbs=1, gbs=2048, seq_len=8192)
    auto = planner.predict(**plan)
    assert auto.plan["zero"] == 2 and auto.fits_in_memory
    assert auto.iteration_time_s == planner.predict(**plan, zero="2").iteration_time_s
    assert planner.predict(**plan, zero=1).fits_in_memory is False
    assert PlanRequest(model="llama3-8b", gpu="h100-sxm", gpus=8, zero="AUTO").zero == "auto"


def test_search_compare_and_size_are_the_cli_json():
    ranked = planner.search(**SMALL_SEARCH, progress=False)
    cli = cli_json(["search", "--model", "llama-7b", "--gpus", "16", "--tp", "1,2", "--pp", "1,2", "--no-progress"])
    assert _no_elapsed(ranked.to_dict()) == _no_elapsed(cli)
    assert ranked.best.rank == 1 and len(ranked.plans) == 10
    cmp = planner.compare(model="llama-7b", gpu=["a100-80gb"], gpus=8, space="megatron")
    cli = cli_json(["compare", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "8", "--space", "megatron"])
    assert _no_elapsed(cmp.to_dict()) == _no_elapsed(cli) and cmp.best
    need = planner.size(model="llama-7b", tokens="2B", deadline="7d", gpu=["h100-sxm"], max_gpus=8)
    cli = cli_json(["size", "--model", "llama-7b", "--tokens", "2B", "--deadline", "7d", "--gpu", "h100-sxm",
                    "--max-gpus", "8"])
    assert _no_elapsed(need.to_dict()) == _no_elapsed(cli)


def test_compare_and_size_take_a_node_type_per_gpu():
    """--cluster GPU=NODE_TYPE (or a node type alone, for its own GPU) picks the node type compare and size cost a
    GPU on, the CLI and the API alike; a node type of a GPU not asked for, two for one GPU, or one that does not
    carry the GPU are refused with what to pass instead."""
    cmp = planner.compare(model="llama-7b", gpu=["gh200", "a100-80gb"], gpus=16, space="megatron",
                          cluster=["gh200=vista", "perlmutter"])
    assert {r.gpu: r.hardware.cluster.name for r in cmp.rows} == {"gh200": "vista", "a100-80gb": "perlmutter"}
    cli = cli_json(["compare", "--model", "llama-7b", "--gpu", "gh200", "--gpu", "a100-80gb", "--gpus", "16",
                    "--space", "megatron", "--cluster", "gh200=vista", "--cluster", "perlmutter"])
    assert _no_elapsed(cmp.to_dict()) == _no_elapsed(cli)
    need = planner.size(model="llama-7b", tokens="2B", deadline="7d", gpu=["gh200"], max_gpus=8, cluster=["vista"],
                        progress=False)
    assert need.hardwares[0].cluster.name == "vista" and need.sizing.types[0].hardware.gpus_per_node == 1
    for cluster, needle in ((["dgx-h100"], "is for h100-sxm, which is not among"),
                            (["gh200=vista", "gh200=alps-gh200"], "two node types"),
                            (["gh200=dgx-a100"], "does not match --cluster dgx-a100")):
        with pytest.raises(planner.PlannerError, match=needle):
            planner.compare(model="llama-7b", gpu=["gh200"], gpus=16, cluster=cluster)


@pytest.mark.parametrize("call, error, needle", [
    (lambda: planner.predict(**{**PLAN, "tp": 3}), planner.PlanError, "TP*PP*CP = 3*2*1"),
    (lambda: planner.predict(**PLAN, dtype="fp9"), planner.PlannerError, "dtype='fp9'"),
    (lambda: planner.predict(**PLAN, modle="x"), planner.PlannerError, "unknown key(s) modle"),
    (lambda: planner.predict(model="llama-13b", gpus=8), planner.PlannerError, "missing required key(s) gpu"),
    (lambda: planner.predict(**PLAN, calibration="nope"), planner.PlannerError, "calibration 'nope' not found"),
    (lambda: planner.explain(**{**PLAN, "gpu": "z100"}), planner.PlannerError, "unknown GPU 'z100'"),
    (lambda: planner.search(model="llama-7b", progress=False), planner.PlannerError, "pass the allocation"),
    (lambda: planner.search(model="llama-7b", gpus=16, tp="1,x"), planner.PlannerError, "--tp '1,x'"),
    (lambda: planner.search(gpus=16), planner.PlannerError, "missing required key model"),
    (lambda: planner.search(model="llama-7b", gpus=16, top=0), planner.PlannerError, "--top"),
    (lambda: planner.size(model="llama-7b", tokens="1T", deadline="soon"), planner.PlannerError, "deadline"),
    (lambda: planner.compare(model="llama-7b", gpu=["a100-80gb"]), planner.PlannerError, "exactly one of"),
])
def test_errors_are_exceptions_not_exits(call, error, needle):
    with pytest.raises(error) as exc:
        call()
    assert needle in str(exc.value)
