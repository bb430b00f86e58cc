"""Plan files (`predict` / `explain` / `export --plan`) and spec files (`search` / `size` / `compare --spec`):
the file gives what the flags give, a flag given overrides the file, and a bad file is one line and exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import planner
from planner.cli import app
from tests.helpers import ROOT

PLAN = ROOT / "examples" / "llama13b_a100_tp2pp2.toml"
SEARCH = ROOT / "examples" / "search_llama13b_128.toml"
SIZE = ROOT / "examples" / "size_llama70b_300b.toml"
# the plan of PLAN as flags (keys the file leaves at their defaults are left out here too)
PLAN_FLAGS = ["--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "2", "--pp", "2",
              "--tokens-per-batch", "4M", "--seq-len", "4096"]
SEARCH_FLAGS = ["--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "128", "--tp", "1,2,4,8", "--pp", "1,2,4",
                "--top", "5", "--no-progress"]


def _run(args: list[str]):
    return CliRunner().invoke(app, args)


def _ok(args: list[str]) -> str:
    res = _run(args)
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


def _bad_file_is_one_line(tmp_path, body: str, words: list[str], command: list[str]) -> None:
    """``command FILE`` with ``body`` in FILE exits 2 with one stderr line that names FILE and holds ``words``."""
    f = tmp_path / "bad.toml"
    f.write_text(body)
    res = _run([*command, str(f)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0], res.stderr
    for w in words:
        assert w in lines[0]


def _search_json(args: list[str]) -> dict:
    out = json.loads(_ok(["search", *args, "--format", "json"]))
    out["search"].pop("elapsed_s")
    return out


def test_predict_plan_file_gives_the_same_json_as_the_flags():
    assert _ok(["predict", "--plan", str(PLAN), "--format", "json"]) == \
        _ok(["predict", *PLAN_FLAGS, "--format", "json"])


def test_a_flag_given_overrides_the_plan_file():
    rec = json.loads(_ok(["predict", "--plan", str(PLAN), "--pp", "4", "--format", "json"]))
    assert rec["plan"]["pp"] == 4 and rec["plan"]["tp"] == 2
    flags = json.loads(_ok(["predict", *PLAN_FLAGS[:-6], "--pp", "4", "--tokens-per-batch", "4M", "--seq-len",
                            "4096", "--format", "json"]))
    assert rec == flags


def test_a_flag_given_at_its_default_value_still_overrides_the_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('model = "llama-13b"\ngpu = "a100-80gb"\ngpus = 16\ntp = 4\n')
    rec = json.loads(_ok(["predict", "--plan", str(f), "--tp", "1", "--format", "json"]))
    assert rec["plan"]["tp"] == 1  # --tp 1 is the default, but it was given


def test_explain_and_export_take_the_plan_file():
    assert _ok(["explain", "--plan", str(PLAN), "--format", "json"]) == \
        _ok(["explain", *PLAN_FLAGS, "--format", "json"])
    assert _ok(["export", "--plan", str(PLAN), "--to", "megatron"]) == \
        _ok(["export", *PLAN_FLAGS, "--to", "megatron"])


def test_yaml_plan_file_equals_toml(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("model: llama-13b\ngpu: a100-80gb\ngpus: 16\ntp: 2\npp: 2\ntokens_per_batch: 4M\nseq_len: 4096\n")
    assert _ok(["predict", "--plan", str(f), "--format", "json"]) == \
        _ok(["predict", "--plan", str(PLAN), "--format", "json"])


def test_python_api_takes_a_plan_file():
    by_file = planner.predict(plan=PLAN).to_dict()
    assert by_file == json.loads(_ok(["predict", "--plan", str(PLAN), "--format", "json"]))
    assert planner.predict(plan=PLAN, pp=4).to_dict()["plan"]["pp"] == 4


@pytest.mark.parametrize("body, words", [
    ('model = "llama-13b"\ngpu = "a100-80gb"\ngpus = 16\ntpp = 2\n', ["unknown key 'tpp'", "allowed keys", "tp,"]),
    ('model = "llama-13b"\ngpu = "a100-80gb"\ngpus = 16\ntp = "two"\n', ["tp='two' must be an integer"]),
    ('model = "llama-13b"\ngpu = "a100-80gb"\ngpus = 16\nsequence_parallel = 1\n',
     ["sequence_parallel=1 must be true or false"]),
    ('model = "llama-13b"\ngpus = [\n', ["not valid TOML"]),
])
def test_a_bad_plan_file_is_one_line_naming_file_and_key(tmp_path, body, words):
    _bad_file_is_one_line(tmp_path, body, words, ["predict", "--plan"])


@pytest.mark.parametrize("name, words", [("missing.toml", ["not found"]), ("plan.json", ["must end in .toml"])])
def test_missing_or_misnamed_plan_file(tmp_path, name, words):
    res = _run(["explain", "--plan", str(tmp_path / name)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert all(w in res.stderr for w in words)


def test_plan_and_batch_together_are_refused(tmp_path):
    res = _run(["predict", "--plan", str(PLAN), "--batch", str(tmp_path / "b.jsonl")])
    assert res.exit_code == 2 and "pass one of them" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_yaml_without_pyyaml_says_so(tmp_path, monkeypatch):
    import sys

    f = tmp_path / "p.yaml"
    f.write_text("model: llama-13b\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    res = _run(["predict", "--plan", str(f)])
    assert res.exit_code == 2 and "PyYAML is not installed" in res.stderr and "TOML" in res.stderr


def test_search_spec_file_equals_the_flags():
    assert _search_json(["--spec", str(SEARCH), "--no-progress"]) == _search_json(SEARCH_FLAGS)


def test_a_flag_given_overrides_the_spec_file():
    out = _search_json(["--spec", str(SEARCH), "--top", "3", "--tp", "2"])
    assert len(out["plans"]) == 3 and {p["tp"] for p in out["plans"]} == {2}


@pytest.mark.parametrize("body, words", [
    ('model = "llama-13b"\ngpus = "x"\n', ["gpus = 'x'", "integer"]),
    ('model = "llama-13b"\ngpus = true\n', ["gpus = true", "boolean"]),
    ('model = "llama-13b"\ngpus = 128\nfoo = 1\n', ["unknown key 'foo'", "planner search", "objective"]),
])
def test_a_bad_spec_file_is_one_line(tmp_path, body, words):
    _bad_file_is_one_line(tmp_path, body, words, ["search", "--spec"])


def test_size_spec_gives_the_required_options_and_without_them_one_line(tmp_path):
    res = _run(["size", "--model", "llama-13b"])
    assert res.exit_code == 2 and "missing --tokens, --deadline" in res.stderr
    f = tmp_path / "s.toml"
    f.write_text('model = "llama-13b"\ntokens = "20B"\ndeadline = "30d"\ngpu = ["a100-80gb"]\nmax_gpus = 64\n'
                 'format = "json"\nprogress = false\n')
    by_file = json.loads(_ok(["size", "--spec", str(f)]))
    by_flags = json.loads(_ok(["size", "--model", "llama-13b", "--tokens", "20B", "--deadline", "30d", "--gpu",
                               "a100-80gb", "--max-gpus", "64", "--format", "json", "--no-progress"]))
    for d in (by_file, by_flags):
        d.pop("elapsed_s", None)
        d.get("search", {}).pop("elapsed_s", None)
    assert by_file == by_flags


def test_shipped_examples_parse():
    from planner.plan_file import plan_file_values, read_settings

    assert plan_file_values(PLAN)["model"] == "llama-13b"
    assert read_settings(SEARCH, "spec file")["gpus"] == 128
    assert read_settings(SIZE, "spec file")["deadline"] == "21d"
