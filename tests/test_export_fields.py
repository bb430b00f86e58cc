"""Every architecture field a launcher needs reaches every export, read back with the target's own parser:
Megatron-LM flags by an argparse parser built from Megatron-LM's own add_argument specs, NeMo YAML with PyYAML
against NeMo's config keys, torchtitan TOML with tomllib against job_config.py's keys (fixtures in
tests/fixtures/launchers, each naming its source file and commit). A test fails when an export drops a field
the model or plan has: QKV bias, norm epsilon, RoPE base and fraction, tied embeddings, sliding window, GQA
groups, vocabulary, uneven pipeline split."""

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import resolve_model
from planner.export import export_plan
from tests.helpers import MEGATRON_ARGUMENTS, TITAN_MODELS, check_torchtitan_keys, hf_model, parse_megatron

FIX = Path(__file__).parent / "fixtures"
HW = load_catalogue().resolve("a100-80gb")
MEGATRON = MEGATRON_ARGUMENTS
NEMO = json.loads((FIX / "launchers" / "nemo_config_keys.json").read_text())
TITAN = json.loads((FIX / "launchers" / "torchtitan_job_config_keys.json").read_text())


def _hf(name):
    return hf_model(name)


def _plan(gpus=16, tp=2, pp=2, **kw):
    return ParallelPlan(gpus=gpus, gpus_per_node=8, gbs=64, seq_len=2048, tp=tp, pp=pp, **kw)


CASES = {
    "llama3-8b GQA rope 500k": (lambda: resolve_model("llama3-8b"), _plan()),
    "qwen2 qkv-bias eps 1e-6": (lambda: _hf("qwen2-7b"), _plan()),
    "mistral sliding window": (lambda: _hf("mistral-7b"), _plan()),
    "gpt2 tied learned bias": (lambda: _hf("gpt2"), _plan()),
    "neox partial rotary": (lambda: _hf("gpt-neox-20b"), _plan(pp=4, gpus=32)),
    "llama3-8b uneven split": (lambda: resolve_model("llama3-8b"), _plan(gpus=24, pp=3, layer_split=(12, 10, 10))),
    "llama3-8b uneven middle": (lambda: resolve_model("llama3-8b"), _plan(gpus=32, pp=4, layer_split=(9, 8, 7, 8))),
    "mixtral EP4 ETP1 MoE": (lambda: _hf("mixtral-8x7b"), _plan(ep=4, etp=1)),
    "deepseek-v3 MLA shared experts dense-first": (lambda: _hf("deepseek-v3"),
                                                   _plan(gpus=64, tp=1, pp=1, ep=64, moe_dispatcher="flex",
                                                         moe_imbalance=1.0)),
}


def expected(model):
    """The architecture fields, read from the ModelSpec and its config.json extras independently of the export."""
    ex = model.extra
    window = ex.get("sliding_window") if ex.get("use_sliding_window", True) else None
    return {
        "eps": next((ex[k] for k in ("norm_eps", "rms_norm_eps", "layer_norm_eps") if k in ex), None),
        "qkv_bias": ex.get("qkv_bias", False),
        "window": window,
        "rotary": ex.get("rotary_pct") or ex.get("partial_rotary_factor"),
        "gqa": model.num_kv_heads != model.num_heads,
    }


@pytest.mark.parametrize("case", CASES)
def test_megatron_export_has_every_field(case):
    make, plan = CASES[case]
    model = make()
    e = expected(model)
    a = parse_megatron(export_plan(model, plan, HW, None, "megatron"))
    assert (a.num_layers, a.hidden_size, a.num_attention_heads, a.ffn_hidden_size) == (
        model.num_layers, model.hidden_size, model.num_heads, model.ffn_hidden_size)
    assert a.vocab_size == model.vocab_size
    assert a.group_query_attention is e["gqa"] and (not e["gqa"] or a.num_query_groups == model.num_kv_heads)
    assert a.untie_embeddings_and_output_weights is (not model.tied_embeddings)
    assert a.disable_bias_linear is model.linear_bias  # store_false: True means "bias kept"
    assert a.add_qkv_bias is bool(e["qkv_bias"])
    assert a.norm_epsilon == e["eps"]
    assert a.window_size == ((e["window"], 0) if e["window"] else None)
    if model.position_embedding == "rope":
        assert a.position_embedding_type == "rope" and a.rotary_base == int(model.rope_theta)
        assert a.rotary_percent == e["rotary"]
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    if plan.layer_split is not None:
        split = plan.layer_split
        if len(set(split[1:-1])) == 1:
            assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (split[0], split[-1])
        else:
            stages = a.pipeline_model_parallel_layout.split("|")
            assert [int(s.split("t*")[1].split(",")[0]) for s in stages] == list(split)


@pytest.mark.parametrize("case", CASES)
def test_nemo_export_has_every_field(case):
    make, plan = CASES[case]
    model = make()
    e = expected(model)
    cfg = yaml.safe_load(export_plan(model, plan, HW, None, "nemo"))
    assert set(cfg["trainer"]) <= set(NEMO["trainer"]), set(cfg["trainer"]) - set(NEMO["trainer"])
    m = cfg["model"]
    assert set(m) <= set(NEMO["model"]), set(m) - set(NEMO["model"])
    assert set(m["optim"]) <= set(NEMO["optim"])
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["ffn_hidden_size"]) == (
        model.num_layers, model.hidden_size, model.num_heads, model.ffn_hidden_size)
    assert m["num_query_groups"] == (model.num_kv_heads if e["gqa"] else None)
    assert m["share_embeddings_and_output_weights"] is model.tied_embeddings
    assert m["bias"] is model.linear_bias and m.get("qkv_bias", False) is bool(e["qkv_bias"])
    assert m.get("layernorm_epsilon") == e["eps"]
    assert m.get("window_size") == ([e["window"], 0] if e["window"] else None)
    if model.position_embedding == "rope":
        assert m["rotary_base"] == int(model.rope_theta) and m.get("rotary_percentage") == e["rotary"]
    if plan.layer_split is not None and len(set(plan.layer_split[1:-1])) == 1:
        assert (m["num_layers_in_first_pipeline_stage"], m["num_layers_in_last_pipeline_stage"]) == (
            plan.layer_split[0], plan.layer_split[-1])
    elif plan.layer_split is not None:
        assert m["pipeline_model_parallel_layout"].count("|") == plan.pp - 1


@pytest.mark.parametrize("case", CASES)
def test_torchtitan_export_keys_and_architecture(case):
    make, plan = CASES[case]
    model = make()
    e = expected(model)
    if model.is_moe and model.extra.get("model_type") == "mixtral":  # torchtitan has no Mixtral model: one line
        with pytest.raises(PlannerError, match="torchtitan .* has no model for .*export it --to megatron"):
            export_plan(model, plan, HW, None, "torchtitan")
        return
    text = export_plan(model, plan, HW, None, "torchtitan")
    t = tomllib.loads(text)
    check_torchtitan_keys(t)
    name = {"deepseek_v3": "deepseek_v3"}.get(model.extra.get("model_type"), "llama3")
    assert t["model"]["name"] == name
    flavor = {"llama3-8b": "8B", "deepseek-v3": "671B"}.get(model.name, model.name)
    assert t["model"]["flavor"] == flavor
    assert flavor == model.name or flavor in TITAN_MODELS["models"][name]  # a flavor torchtitan registers
    # torchtitan takes the architecture from the flavor: the header names every field for registering one
    arch = next(line for line in text.splitlines() if line.startswith("# Architecture:"))
    for needle in (f"layers {model.num_layers},", f"hidden {model.hidden_size},", f"KV heads {model.num_kv_heads},",
                   f"FFN hidden {model.ffn_hidden_size},", f"vocab {model.vocab_size},",
                   f"tied embeddings {'yes' if model.tied_embeddings else 'no'}",
                   f"sliding window {e['window'] or 'none'}"):
        assert needle in arch, (needle, arch)
    if e["eps"] is not None:
        assert f"norm eps {e['eps']!r}" in arch
    if e["qkv_bias"]:
        assert "bias QKV only" in arch
    if plan.layer_split is not None:
        parts = t["parallelism"]["module_fqns_per_model_part"]
        assert [sum(p.startswith("layers.") for p in part) for part in parts] == list(plan.layer_split)


def test_qwen2_window_off_and_mistral_window_on():
    """Qwen2's config states sliding_window 131072 with use_sliding_window false: no window is exported."""
    qwen = parse_megatron(export_plan(_hf("qwen2-7b"), _plan(), HW, None, "megatron"))
    assert qwen.window_size is None and qwen.add_qkv_bias and qwen.norm_epsilon == 1e-6
    assert qwen.rotary_base == 1000000
    mistral = parse_megatron(export_plan(_hf("mistral-7b"), _plan(), HW, None, "megatron"))
    assert mistral.window_size == (4096, 0)


def test_parser_catches_a_dropped_or_misspelt_flag():
    """The fixture parser refuses a flag Megatron-LM lacks, so a typo in an export cannot pass."""
    with pytest.raises(AssertionError, match="refuse"):
        parse_megatron("--num-layer 32")
    with pytest.raises(AssertionError, match="refuse"):
        parse_megatron("--normalization rmsnorm")
