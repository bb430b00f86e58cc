"""The default sequence length is a documented choice (a preset's cited pre-training context, else a common training
length, never a config's inference limit) and the output says so; a plan that does not fit names the memory term
that dominates and the flags that change it."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.presets import COMMON_TRAINING_SEQ_LEN, default_seq_len, get_preset, preset_names
from planner.advice import memory_advice, seq_len_note
from planner.cli import app
from planner.requests import PlanRequest

FIX = Path(__file__).parent / "fixtures" / "hf_configs"
runner = CliRunner()


def test_every_preset_cites_its_default_sequence_length():
    for name in preset_names():
        model = get_preset(name)
        seq, source = default_seq_len(model)
        assert seq == model.max_seq_len and model.extra.get("seq_len_source"), name
        assert "pre-training context" in source, name


def test_pretraining_context_not_the_inference_limit():
    # Qwen3 pre-trains at 4,096 (report sec. 3.2); config.json's 40,960 positions are a limit
    assert default_seq_len(get_preset("qwen3-30b-a3b"))[0] == 4096
    assert get_preset("qwen3-235b-a22b").extra["config_max_position_embeddings"] == 40960
    # Mixtral 8x7B's paper states training at a 32k context: the cited figure is kept
    assert default_seq_len(get_preset("mixtral-8x7b"))[0] == 32768
    # a config.json cites nothing: the common training length, or fewer positions when the model has fewer
    qwen = from_hf_config(FIX / "qwen3-30b-a3b.json")
    assert qwen.max_seq_len == 40960 and default_seq_len(qwen)[0] == COMMON_TRAINING_SEQ_LEN == 4096
    assert "inference limit" in default_seq_len(qwen)[1]
    gpt2 = from_hf_config(FIX / "gpt2.json")
    assert default_seq_len(gpt2) == (1024, "the model's 1024 positions")
    plan = PlanRequest(model=str(FIX / "qwen3-30b-a3b.json"), gpu="h100-sxm", gpus=8, ep=8).resolve().plan
    assert plan.seq_len == 4096


def test_predict_says_where_the_default_came_from_and_what_does_not_fit():
    cmd = ["predict", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "1", "--pp", "4",
           "--ep", "8"]
    r = runner.invoke(app, cmd, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "note: seq_len 32768 is the default for mixtral-8x7b: the preset's pre-training context" in text
    assert "does not fit: activations dominate" in text and "--seq-len (now 32768)" in text
    assert "--recompute full" in text and "--cp (now 1)" in text
    given = " ".join(runner.invoke(app, cmd + ["--seq-len", "4096"], env={"COLUMNS": "200"}).output.split())
    assert "is the default" not in given


def test_advice_names_the_dominant_term_and_its_levers():
    plan = {"zero": 0, "tp": 1, "pp": 1, "cp": 1, "seq_len": 2048, "mbs": 4, "recompute": "selective"}
    mem = {"weights": 10.0, "gradients": 10.0, "optimizer": 60.0, "activations": 5.0, "workspace": 1.0, "stage": 0}
    adv = memory_advice({"fits_in_memory": False, "memory": mem, "plan": plan})
    assert adv.startswith("optimizer dominate: 60.0 of 86.0 GiB per GPU") and "--zero 1 (now 0)" in adv
    mem.update(optimizer=5.0, weights=70.0)
    adv = memory_advice({"fits_in_memory": False, "memory": mem, "plan": plan}, moe=True)
    assert adv.startswith("weights dominate") and "--zero 3 (now 0)" in adv and "--ep" in adv
    mem.update(weights=5.0, activations=70.0)
    adv = memory_advice({"fits_in_memory": False, "memory": mem, "plan": plan})
    assert "--mbs (now 4)" in adv and "--seq-len (now 2048)" in adv
    assert memory_advice({"fits_in_memory": True, "memory": mem, "plan": plan}) is None
    assert seq_len_note(get_preset("llama-7b"), 4096) is None


def test_search_header_notes_the_default_sequence_length():
    r = runner.invoke(app, ["search", "--model", "llama-7b", "--gpu", "a100-80gb", "--gpus", "16", "--tp", "1,2",
                            "--pp", "1", "--cp", "1", "--vpp", "1", "--mbs", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "seq 4096 is the default for llama-7b: the preset's pre-training context (Touvron et al. 2023" in \
        " ".join(r.output.split())


LLAMA3_405B = ["--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "16384", "--tp", "8", "--pp", "16", "--vpp",
               "2", "--mbs", "1", "--gbs", "2048", "--seq-len", "8192"]
"""Llama 3 405B's layout (arXiv 2407.21783 Table 4: TP8 PP16 DP128 on 16,384 H100, 8K sequences), as issue 26 runs
it (no --zero)."""


def test_llama3_405b_layout_fits_at_the_zero_stage_auto_chooses_and_says_so():
    """With --zero left to auto the layout fits: ZeRO-1 does not, so the plan is costed at ZeRO-2 (the gradient
    sharding of Meta's FSDP, the paper's sec. 3.3.2), the same prediction as --zero 2, with a note naming the
    choice; JSON records the stage costed and the note."""
    res = runner.invoke(app, ["predict", *LLAMA3_405B, "--format", "json"])
    assert res.exit_code == 0, res.output
    auto = json.loads(res.stdout)
    assert auto["fits_in_memory"] is True and auto["plan"]["zero"] == 2
    note = next(w for w in auto["warnings"] if "chosen because --zero was left to auto" in w)
    assert note.startswith("ZeRO-2 chosen") and "at ZeRO-1 this layout does not fit in the 79.6 GiB usable" in note
    two = json.loads(runner.invoke(app, ["predict", *LLAMA3_405B, "--zero", "2", "--format", "json"]).stdout)
    assert auto["iteration_time_s"] == two["iteration_time_s"]
    assert auto["memory_gib_per_gpu"] == two["memory_gib_per_gpu"]
    assert not any("chosen because --zero" in w for w in two["warnings"])
    one = json.loads(runner.invoke(app, ["predict", *LLAMA3_405B, "--zero", "1", "--format", "json"]).stdout)
    assert one["fits_in_memory"] is False and one["plan"]["zero"] == 1


def test_zero_auto_keeps_zero_1_for_a_plan_that_fits_and_for_one_nothing_fits():
    """auto leaves a plan that fits at ZeRO-1 exactly as --zero 1 costs it (no note), and a plan that fits under no
    stage at ZeRO-1, with the advice --zero 1 gives."""
    small = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2"]
    auto = json.loads(runner.invoke(app, ["predict", *small, "--format", "json"]).stdout)
    one = json.loads(runner.invoke(app, ["predict", *small, "--zero", "1", "--format", "json"]).stdout)
    assert auto["plan"]["zero"] == 1 and auto == one
    huge = ["--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "8", "--mbs", "1",
            "--gbs", "64", "--seq-len", "8192"]
    rec = json.loads(runner.invoke(app, ["predict", *huge, "--format", "json"]).stdout)
    assert rec["fits_in_memory"] is False and rec["plan"]["zero"] == 1
    assert not any("chosen because --zero" in w for w in rec["warnings"])


@pytest.mark.parametrize("value", ["two", "4", "-1", "1.5"])
def test_zero_refuses_what_is_not_a_stage_or_auto(value):
    res = runner.invoke(app, ["predict", *LLAMA3_405B, "--zero", value])
    assert res.exit_code == 2
    assert "must be a ZeRO stage 0, 1, 2 or 3, or auto" in res.output and "Traceback" not in res.output


def test_a_plan_that_does_not_fit_names_the_one_flag_changes_that_make_it_fit():
    """Llama 3 405B's layout does not fit at ZeRO-1 (stated: auto would move it to ZeRO-2); the output names --zero 2
    (Meta's FSDP shards the gradients, the paper's sec. 3.3.2) among the changes under which it fits, each with its
    memory and time, and each of those really fits when run."""
    flags = [*LLAMA3_405B, "--zero", "1"]
    res = runner.invoke(app, ["predict", *flags], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("note: the same layout fits with"))
    assert "--zero 2 (" in line and "--recompute full (" in line
    # ZeRO-2 is costed with one reduce-scatter per iteration; the offer says so, and its prediction bounds the rest
    assert "s per iteration with one gradient reduce-scatter per iteration" in line.split("; or")[0]
    # the memory features that keep Megatron's ZeRO-1: bf16 main gradients, and the smallest fitting set of
    # fine-grained activation offloading (the norms' inputs), offered once
    assert "--main-grads-dtype bf16 (" in line and "--offload-modules attn_norm,mlp_norm (" in line
    assert line.count("--offload-modules") == 1
    for change in (["--zero", "2"], ["--recompute", "full"], ["--main-grads-dtype", "bf16"],
                   ["--offload-modules", "attn_norm,mlp_norm"]):
        alt = runner.invoke(app, ["predict", *flags, *change, "--format", "json"])
        assert '"fits_in_memory": true' in alt.stdout, change
    fits = runner.invoke(app, ["predict", *flags, "--zero", "2"], env={"COLUMNS": "400"})
    assert "the same layout fits with" not in fits.output
    assert "ZeRO-2: gradients costed as reduce-scattered once per iteration" in fits.output
    assert "with 16 micro-batches up to" in fits.output


def test_fitting_changes_offers_the_first_offload_set_that_fits_and_each_other_change_that_fits():
    """fitting_changes costs every one-flag change with the command's own predict; of the activation-offloading
    family it offers only the first set that fits, and it leaves out changes that do not fit or are refused."""
    from costmodel.core.errors import PlannerError
    from costmodel.core.specs.memory_features import OFFLOAD_STEPS
    from planner.advice import fitting_changes
    from planner.requests import PlanRequest

    req = PlanRequest(model="llama-13b", gpu="a100-80gb", gpus=8)
    rec = {"fits_in_memory": False, "plan": {"zero": 1, "recompute": "selective", "dtype": "bf16",
                                             "framework": "megatron"}}

    def fake(r):
        if r.zero == 3:
            raise PlannerError("refused")
        fits = r.offload_modules in OFFLOAD_STEPS[1:] or r.main_grads_dtype == "bf16"
        return {"fits_in_memory": fits, "memory_gib_per_gpu": 70.0, "iteration_time_s": 1.0, "warnings": []}

    text = fitting_changes(req, rec, fake)
    assert text == ("the same layout fits with --main-grads-dtype bf16 (70.0 GiB, 1 s per iteration); or "
                    f"--offload-modules {','.join(OFFLOAD_STEPS[1])} (70.0 GiB, 1 s per iteration)")
    assert fitting_changes(req, {**rec, "fits_in_memory": True}, fake) is None
