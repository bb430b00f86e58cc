"""The one plan-request dataclass: CLI flags and batch lines build the same PlanRequest; fields are
documented; unknown keys are refused; the commands share one declaration of each option."""

from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import fields

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from planner import cli_options, requests
from planner.cli import app
from planner.requests import REQUEST_KEYS, PlanRequest

FLAGS = ["--model", "llama-13b", "--gpu", "h100-sxm", "--gpus", "64", "--gpus-per-node", "8", "--cluster",
         "dgx-h100", "--tp", "2", "--pp", "4", "--cp", "1", "--vpp", "2", "--mbs", "2", "--gbs", "256", "--seq-len",
         "2048", "--recompute", "full", "--no-sequence-parallel", "--zero", "0", "--dtype", "fp8",
         "--layer-split", "10,10,10,10"]
LINE = ('{"model": "llama-13b", "gpu": "h100-sxm", "gpus": 64, "gpus_per_node": 8, "cluster": "dgx-h100", '
        '"tp": 2, "pp": 4, "cp": 1, "vpp": 2, "mbs": 2, "gbs": 256, "seq_len": 2048, "recompute": "full", '
        '"sequence_parallel": false, "zero": 0, "dtype": "fp8", "layer_split": [10, 10, 10, 10]}')


def _captured_request(command: str, args: list[str], monkeypatch) -> PlanRequest:
    """Run `planner COMMAND ARGS` and return the PlanRequest the command resolved."""
    seen = []

    def capture(self, hardware_files=()):
        seen.append(self)
        raise PlannerError("captured")

    monkeypatch.setattr(PlanRequest, "resolve", capture)
    r = CliRunner().invoke(app, [command, *args])
    assert r.exit_code == 2 and "captured" in r.output, r.output
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("command", ["predict", "explain", "export"])
def test_cli_flags_and_batch_line_build_the_same_request(command, monkeypatch):
    from_line = PlanRequest.from_dict(json.loads(LINE))
    assert _captured_request(command, FLAGS, monkeypatch) == from_line
    assert from_line.layer_split == (10, 10, 10, 10) and from_line.zero == 0 and from_line.sequence_parallel is False


def test_flag_defaults_are_the_dataclass_defaults(monkeypatch):
    req = _captured_request("predict", ["--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "8"], monkeypatch)
    assert req == PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=8)
    # explain and export take the same defaults (and, as predict, require --gpu)
    for command in ("explain", "export"):
        req = _captured_request(command, ["--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "8"], monkeypatch)
        assert req == PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=8)


def test_batch_line_and_cli_predictions_are_equal():
    from planner.cli_predict import run_batch

    batch = next(run_batch([LINE]))
    r = CliRunner().invoke(app, ["predict", *FLAGS, "--format", "json", "--calibration", "none"])  # as run_batch's
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == batch


def test_every_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(requests))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PlanRequest")
    documented = set()
    for stmt, nxt in zip(cls.body, cls.body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str) and nxt.value.value.strip():
            documented.add(stmt.target.id)
    names = [f.name for f in fields(PlanRequest)]
    assert [n for n in names if n not in documented] == []
    assert tuple(names) == REQUEST_KEYS


def test_batch_keys_are_the_readme_keys():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Batch requests", 1)[1].split("Each output", 1)[0]
    assert set(re.findall(r"`([a-z0-9_]+)`", section)) == set(REQUEST_KEYS)


@pytest.mark.parametrize("key", ["TP", "tensor_parallel", "ünknown"])
def test_unknown_batch_key_refused_with_one_line_naming_it(key):
    raw = {"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, key: 2}
    with pytest.raises(PlannerError) as exc:
        PlanRequest.from_dict(raw)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"unknown key(s) {key};")
    from planner.cli_predict import run_batch

    rec = next(run_batch([json.dumps(raw)]))
    assert set(rec) == {"id", "line", "error"} and key in rec["error"]


@pytest.mark.parametrize("raw, needle", [
    ({"gpu": "a100-80gb", "gpus": 8}, "missing required key(s) model"),
    ({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "tp": 0}, "tp=0 must be a positive integer"),
    ({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "tp": 2.5}, "tp=2.5 must be an integer"),
    ({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "recompute": "most"}, "recompute='most' must be one of"),
    ({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "sequence_parallel": 1}, "must be true or false"),
    ({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8, "layer_split": [4, 0]}, "list of positive integers"),
])
def test_bad_values_refused_by_the_constructor_too(raw, needle):
    with pytest.raises(PlannerError, match=re.escape(needle)):
        PlanRequest.from_dict(raw)
    with pytest.raises(PlannerError, match=re.escape(needle)):
        PlanRequest(**{"model": None, "gpu": None, "gpus": None, **raw})


def test_integral_floats_and_none_take_the_batch_meaning():
    req = PlanRequest.from_dict({"model": "llama-13b", "gpu": "a100-80gb", "gpus": 8.0, "tp": None, "gbs": None})
    assert req == PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=8) and isinstance(req.gpus, int)


def _help_of(command: str) -> dict[str, str]:
    """--flag -> help text of one command, from the click command typer builds."""
    cmd = get_command(app).commands[command]
    return {opt: p.help or "" for p in cmd.params for opt in p.opts}


PLAN_FLAGS = ["--model", "--gpu", "--gpus", "--gpus-per-node", "--cluster", "--tp", "--pp", "--cp", "--vpp", "--mbs",
              "--gbs", "--seq-len", "--recompute", "--sequence-parallel", "--zero", "--dtype", "--layer-split",
              "--hardware-file"]


def test_plan_commands_share_every_plan_option():
    helps = {c: _help_of(c) for c in ("predict", "explain", "export")}
    for flag in PLAN_FLAGS:
        texts = {c: h.get(flag) for c, h in helps.items()}
        assert len(set(texts.values())) == 1 and None not in texts.values(), (flag, texts)
    assert helps["predict"]["--tp"] == "Tensor-parallel degree."


def test_search_commands_share_the_per_plan_options():
    note = " Required, no default."  # what predict says of a required plan flag it checks itself
    helps = {c: {f: h.replace(note, "") for f, h in _help_of(c).items()} for c in ("predict", "search", "compare",
                                                                                 "size")}
    for flag in ("--model", "--gbs", "--seq-len", "--hardware-file"):
        assert len({h[flag] for h in helps.values()}) == 1, flag
    assert helps["search"]["--cluster"] == helps["predict"]["--cluster"]
    assert helps["search"]["--gpus-per-node"] == helps["predict"]["--gpus-per-node"]
    for flag in ("--price", "--space", "--report", "--tokens", "--nodes"):
        present = [c for c in ("search", "compare", "size") if flag in helps[c]]
        assert len({helps[c][flag] for c in present}) == 1, flag


def test_no_option_declared_twice_in_the_command_modules():
    """Every plan flag is one row of planner.cli_options.PLAN_OPTIONS (name, type, help; the default is
    PlanRequest's); a command module declares only the flags no other command module declares (its own --format
    and --top choices excepted)."""
    import planner.cli_export
    import planner.cli_predict
    import planner.cli_search

    declared: dict[str, list[str]] = {}
    for mod in (planner.cli_predict, planner.cli_export, planner.cli_search):
        for flag in re.findall(r'typer\.Option\([^"]*"(--[a-z-]+)', inspect.getsource(mod)):
            declared.setdefault(flag, []).append(mod.__name__)
    dup = {f: m for f, m in declared.items() if len(m) > 1 and f not in ("--format", "--top")}
    assert dup == {}, dup
    table = [o.name for o in cli_options.PLAN_OPTIONS]
    assert sorted(table) == sorted(k for k in REQUEST_KEYS if k != "id"), "PLAN_OPTIONS lists every PlanRequest field"
    assert set(declared) & {"--" + n.replace("_", "-") for n in table} == set(), "a plan flag declared twice"
    for o in cli_options.PLAN_OPTIONS:
        default = getattr(PlanRequest, o.name, None) if o.name not in ("model", "gpu", "gpus") else None
        assert o.default == (None if isinstance(default, tuple) else default), o.name


def test_plan_commands_take_every_plan_flag():
    flags = {"--" + o.name.replace("_", "-") for o in cli_options.PLAN_OPTIONS}
    for command in ("predict", "explain", "export"):
        assert flags <= set(_help_of(command)), (command, flags - set(_help_of(command)))


def test_search_request_replaces_positional_arguments():
    from planner.search.api import SearchRequest, run_search

    assert list(inspect.signature(run_search).parameters) == ["r"]
    req = SearchRequest.from_flags({"model": "llama-13b", "gpu": ["h100-sxm"], "gpus": 8, "top": 3})
    assert req.gpu == ("h100-sxm",) and req.gpus == 8 and req.trials == 200
