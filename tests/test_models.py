"""Model specs from Hugging Face config.json, the shipped presets and `planner models`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hf_config import SUPPORTED_MODEL_TYPES, from_hf_config
from costmodel.core.specs.presets import get_preset, preset_names, resolve_model
from planner.cli import app

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"

# (fixture, expected fields). Values are the ones in the public config.json each fixture copies.
EXPECTED = {
    "llama2-7b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
                      ffn_hidden_size=11008, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                      position_embedding="rope", tied_embeddings=False, linear_bias=False, dropout=False,
                      max_seq_len=4096, rope_theta=None, num_experts=0),
    "mistral-7b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                       ffn_hidden_size=14336, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                       position_embedding="rope", tied_embeddings=False, linear_bias=False, max_seq_len=32768,
                       rope_theta=10000.0),
    "qwen2-7b": dict(num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4, head_dim=128,
                     ffn_hidden_size=18944, vocab_size=152064, activation="swiglu", norm="rmsnorm",
                     tied_embeddings=False, linear_bias=False, max_seq_len=131072, rope_theta=1e6),
    "gpt-neox-20b": dict(num_layers=44, hidden_size=6144, num_heads=64, num_kv_heads=64, head_dim=96,
                         ffn_hidden_size=24576, vocab_size=50432, activation="gelu", norm="layernorm",
                         position_embedding="rope", tied_embeddings=False, linear_bias=True, dropout=False,
                         max_seq_len=2048, rope_theta=10000.0),
    "gpt2": dict(num_layers=12, hidden_size=768, num_heads=12, num_kv_heads=12, ffn_hidden_size=3072,
                 vocab_size=50257, activation="gelu", norm="layernorm", position_embedding="learned",
                 tied_embeddings=True, linear_bias=True, dropout=True, max_seq_len=1024, rope_theta=None),
    "minitron-8b": dict(num_layers=32, hidden_size=4096, num_heads=48, num_kv_heads=8, head_dim=128,
                        ffn_hidden_size=16384, vocab_size=256000, activation="squared_relu", norm="layernorm",
                        position_embedding="rope", tied_embeddings=False, linear_bias=False, max_seq_len=4096,
                        rope_theta=10000.0),
    "mpt-7b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32, ffn_hidden_size=16384,
                   vocab_size=50432, activation="gelu", norm="layernorm", position_embedding="alibi",
                   tied_embeddings=True, linear_bias=False, dropout=False, max_seq_len=2048, rope_theta=None),
    "bloom-560m": dict(num_layers=24, hidden_size=1024, num_heads=16, num_kv_heads=16, ffn_hidden_size=4096,
                       vocab_size=250880, activation="gelu", norm="layernorm", position_embedding="alibi",
                       tied_embeddings=True, linear_bias=True, dropout=False, max_seq_len=2048),
    "mixtral-8x7b": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                         vocab_size=32000, activation="swiglu", norm="rmsnorm", num_experts=8,
                         experts_per_token=2, max_seq_len=32768, rope_theta=1e6, moe_ffn_hidden_size=14336),
    # MoE families (sources of each fixture: fixtures/hf_configs/README.md)
    "mixtral-8x22b": dict(num_layers=56, hidden_size=6144, num_heads=48, num_kv_heads=8, ffn_hidden_size=16384,
                          moe_ffn_hidden_size=16384, num_experts=8, experts_per_token=2, vocab_size=32000,
                          max_seq_len=65536, router="softmax", num_shared_experts=0),
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
                          ffn_hidden_size=6144, moe_ffn_hidden_size=768, num_experts=128, experts_per_token=8,
                          num_shared_experts=0, first_dense_layers=0, moe_layer_freq=1, router="softmax",
                          vocab_size=151936, linear_bias=False, max_seq_len=40960, rope_theta=1e6),
    "qwen1.5-moe-a2.7b-chat": dict(num_layers=24, hidden_size=2048, num_heads=16, num_kv_heads=16, head_dim=128,
                                   ffn_hidden_size=5632, moe_ffn_hidden_size=1408, num_experts=60,
                                   experts_per_token=4, num_shared_experts=1, shared_expert_ffn_hidden_size=5632,
                                   moe_layer_freq=1, router="softmax", linear_bias=False, vocab_size=151936),
    "deepseek-v3": dict(num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128, head_dim=192,
                        v_head_dim=128, qk_rope_head_dim=64, q_lora_rank=1536, kv_lora_rank=512,
                        ffn_hidden_size=18432, moe_ffn_hidden_size=2048, num_experts=256, experts_per_token=8,
                        num_shared_experts=1, first_dense_layers=3, moe_layer_freq=1, router="sigmoid",
                        vocab_size=129280, tied_embeddings=False, rope_theta=10000.0),
    "deepseek-v2-lite": dict(num_layers=27, hidden_size=2048, num_heads=16, num_kv_heads=16, head_dim=192,
                             v_head_dim=128, qk_rope_head_dim=64, q_lora_rank=0, kv_lora_rank=512,
                             ffn_hidden_size=10944, moe_ffn_hidden_size=1408, num_experts=64, experts_per_token=6,
                             num_shared_experts=2, first_dense_layers=1, router="softmax", vocab_size=102400),
    "gpt-oss-120b": dict(num_layers=36, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
                         ffn_hidden_size=2880, moe_ffn_hidden_size=2880, num_experts=128, experts_per_token=4,
                         linear_bias=True, attention_sinks=True, sliding_window=128, sliding_window_every=2,
                         activation="swiglu", vocab_size=201088, max_seq_len=131072, rope_theta=150000.0),
    # dense families of issue 27 (sources: fixtures/hf_configs/README.md)
    "qwen3-4b": dict(num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8, head_dim=128,
                     ffn_hidden_size=9728, vocab_size=151936, activation="swiglu", norm="rmsnorm",
                     tied_embeddings=True, linear_bias=False, max_seq_len=40960, rope_theta=1e6, norms_per_layer=2),
    "gemma-2-9b": dict(num_layers=42, hidden_size=3584, num_heads=16, num_kv_heads=8, head_dim=256,
                       ffn_hidden_size=14336, vocab_size=256000, activation="swiglu", norm="rmsnorm",
                       tied_embeddings=True, linear_bias=False, max_seq_len=8192, rope_theta=10000.0,
                       norms_per_layer=4, sliding_window=4096, sliding_window_every=2, attn_logit_softcap=50.0,
                       final_logit_softcap=30.0, parallel_attention=False),
    "falcon-7b-instruct": dict(num_layers=32, hidden_size=4544, num_heads=71, num_kv_heads=1, head_dim=64,
                               ffn_hidden_size=18176, vocab_size=65024, activation="gelu", norm="layernorm",
                               position_embedding="rope", tied_embeddings=True, linear_bias=False,
                               max_seq_len=2048, rope_theta=10000.0, parallel_attention=True, norms_per_layer=1),
    "falcon-40b-instruct": dict(num_layers=60, hidden_size=8192, num_heads=128, num_kv_heads=8, head_dim=64,
                                ffn_hidden_size=32768, vocab_size=65024, activation="gelu", norm="layernorm",
                                tied_embeddings=True, parallel_attention=True, norms_per_layer=2),
}


def _cfg(fixture: str) -> dict:
    return json.loads((FIXTURES / f"{fixture}.json").read_text())


# ------------------------------------------------------------------ config.json parsing
@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_fixture_parses_to_expected_fields(fixture):
    spec = from_hf_config(FIXTURES / f"{fixture}.json")
    for field, value in EXPECTED[fixture].items():
        assert getattr(spec, field) == value, field
    assert spec.name == fixture
    assert spec.source.endswith(f"{fixture}.json")


def test_every_supported_model_type_has_a_fixture():
    types = {_cfg(f)["model_type"] for f in EXPECTED}
    assert types == set(SUPPORTED_MODEL_TYPES)


def test_extra_keeps_parsed_fields_without_spec_slot():
    assert from_hf_config(FIXTURES / "gpt-neox-20b.json").extra["rotary_pct"] == 0.25
    assert from_hf_config(FIXTURES / "mistral-7b.json").extra["sliding_window"] == 4096
    assert from_hf_config(FIXTURES / "qwen2-7b.json").extra["qkv_bias"] is True
    assert from_hf_config(FIXTURES / "minitron-8b.json").extra["partial_rotary_factor"] == 0.5
    assert from_hf_config(FIXTURES / "gpt2.json").extra["hidden_act"] == "gelu_new"


def test_param_counts_of_fixtures_match_published_sizes():
    # Published totals: GPT-2 124M (HF model card), BLOOM-560m 559M (bigscience model card),
    # Mixtral 8x7B 46.7B (Jiang et al. 2024), Qwen2-7B 7.6B (Qwen2 model card).
    for fixture, published in (("gpt2", 124.4e6), ("bloom-560m", 559.2e6), ("mixtral-8x7b", 46.7e9),
                               ("qwen2-7b", 7.62e9)):
        total = from_hf_config(FIXTURES / f"{fixture}.json").total_params()
        assert total == pytest.approx(published, rel=0.01), fixture


def test_inline_dict_and_name():
    cfg = _cfg("llama2-7b")
    spec = from_hf_config(cfg, name="my-llama")
    assert spec.name == "my-llama" and spec.num_layers == 32
    assert spec.source == "inline config.json dict"
    assert from_hf_config({**cfg, "_name_or_path": "meta-llama/Llama-2-7b-hf"}).name == "Llama-2-7b-hf"


def test_folder_with_config_json(tmp_path):
    folder = tmp_path / "Mistral-7B-v0.1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_cfg("mistral-7b")))
    assert from_hf_config(folder).name == "Mistral-7B-v0.1"
    assert from_hf_config(folder / "config.json").name == "Mistral-7B-v0.1"


@pytest.mark.parametrize("rope_keys", [
    {"rope_theta": 500000.0},                                                    # transformers < 5
    {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},        # transformers >= 5
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}},
])
def test_rope_theta_old_and_new_keys(rope_keys):
    cfg = {k: v for k, v in _cfg("llama2-7b").items() if k not in ("rope_theta", "rope_scaling")}
    spec = from_hf_config({**cfg, **rope_keys})
    assert spec.rope_theta == 500000.0


def test_rope_parameters_scaling_kept_in_extra():
    cfg = {**_cfg("llama2-7b"), "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}
    spec = from_hf_config(cfg)
    assert spec.extra["rope_parameters"] == {"rope_type": "llama3", "factor": 8.0}


def test_neox_rope_theta_new_key():
    cfg = {k: v for k, v in _cfg("gpt-neox-20b").items() if k != "rotary_emb_base"}
    assert from_hf_config({**cfg, "rope_theta": 25000}).rope_theta == 25000.0


def test_family_defaults_and_aliases():
    gpt2 = {k: v for k, v in _cfg("gpt2").items() if k not in ("n_positions", "n_ctx")}
    gpt2.update(n_inner=1000, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    spec = from_hf_config(gpt2)
    assert spec.ffn_hidden_size == 1000 and spec.max_seq_len == 1024 and spec.dropout is False
    mpt = _cfg("mpt-7b")
    mpt["attn_config"] = {"alibi": False, "attn_type": "grouped_query_attention", "kv_n_heads": 8}
    spec = from_hf_config({**mpt, "expansion_ratio": 3.5})
    assert (spec.num_kv_heads, spec.position_embedding, spec.ffn_hidden_size) == (8, "learned", 14336)
    mini = {k: v for k, v in _cfg("minitron-8b").items() if k != "head_dim"}
    assert from_hf_config({**mini, "kv_channels": 128}).head_dim == 128
    assert from_hf_config({**_cfg("llama2-7b"), "attention_bias": True}).linear_bias is True


def test_mixtral_require_dense_raises():
    spec = from_hf_config(FIXTURES / "mixtral-8x7b.json")
    with pytest.raises(PlannerError, match="mixture-of-experts"):
        spec.require_dense()
    from_hf_config(FIXTURES / "mistral-7b.json").require_dense()  # dense: no error


# ------------------------------------------------------------------ malformed input
def test_bad_json_names_path_and_position(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}')
    with pytest.raises(PlannerError) as err:
        from_hf_config(bad)
    assert str(bad) in str(err.value) and "line 3" in str(err.value)


def test_missing_path(tmp_path):
    with pytest.raises(PlannerError, match="does not exist"):
        from_hf_config(tmp_path / "nope.json")


def test_json_not_an_object(tmp_path):
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(PlannerError, match="not an object"):
        from_hf_config(p)


def test_missing_field_names_file_and_field(tmp_path):
    cfg = _cfg("llama2-7b")
    del cfg["intermediate_size"]
    p = tmp_path / "cut.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(PlannerError) as err:
        from_hf_config(p)
    assert str(p) in str(err.value) and "intermediate_size" in str(err.value)
    with pytest.raises(PlannerError, match="num_local_experts"):
        from_hf_config({k: v for k, v in _cfg("mixtral-8x7b").items() if k != "num_local_experts"})
    with pytest.raises(PlannerError, match="model_type"):
        from_hf_config({k: v for k, v in _cfg("gpt2").items() if k != "model_type"})


@pytest.mark.parametrize("key,value", [
    ("num_hidden_layers", "32"), ("num_hidden_layers", -4), ("num_hidden_layers", 0), ("hidden_size", True),
    ("hidden_size", 4096.5), ("vocab_size", [32000]), ("tie_word_embeddings", "no"), ("rope_theta", -1.0),
    ("attention_dropout", "0.1"),
])
def test_wrong_types_rejected(key, value):
    with pytest.raises(PlannerError, match=key):
        from_hf_config({**_cfg("mistral-7b"), key: value})


def test_unknown_model_type_lists_supported():
    with pytest.raises(PlannerError) as err:
        from_hf_config({**_cfg("llama2-7b"), "model_type": "t5"})
    for t in SUPPORTED_MODEL_TYPES:
        assert t in str(err.value)


def test_unknown_activation_and_keys():
    with pytest.raises(PlannerError, match="hidden_act"):
        from_hf_config({**_cfg("gpt-neox-20b"), "hidden_act": "tanh"})
    spec = from_hf_config({**_cfg("llama2-7b"), "some_future_key": {"x": 1}})
    assert "some_future_key" not in spec.extra


def test_inconsistent_heads_rejected():
    with pytest.raises(PlannerError, match="multiple of num_kv_heads"):
        from_hf_config({**_cfg("mistral-7b"), "num_key_value_heads": 5})


# ------------------------------------------------------------------ presets
# Published totals (tolerance 1 %): parameter counts on the Hugging Face model pages of
# meta-llama/Llama-2-{7b,13b,70b}-hf (6.74/13.0/69.0 B), Meta-Llama-3-{8B,70B} (8.03/70.6 B),
# Llama-3.1-405B (405.9 B) and mistralai/Mistral-7B-v0.1 (7.24 B); GPT-3 174.6 B (Narayanan et al. 2021
# Table 2); GPT-NeoX-20B 20.6 B (Black et al. 2022); MPT-7B 6.7 B and MPT-30B 30 B (MosaicML model cards).
PUBLISHED_PARAMS_B = {
    "llama-7b": 6.74, "llama-13b": 13.0, "llama-70b": 69.0, "llama3-8b": 8.03, "llama3-70b": 70.6,
    "llama3-405b": 405.9, "gpt3-175b": 174.6, "gpt-20b": 20.6, "mistral-7b": 7.24, "mpt-7b": 6.7,
    "mpt-30b": 30.0,
}


MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b",
               "gpt-oss-120b")


def test_preset_list():
    names = preset_names()
    assert set(names) == {"llama-7b", "llama-13b", "llama-70b", "llama3-8b", "llama3-70b", "llama3-405b",
                          "gpt-20b", "llemma-7b", "gpt3-175b", "mpt-7b", "mpt-30b", "mistral-7b", "qwen3-4b",
                          "gemma-2-9b", "falcon-7b", "falcon-40b"} | set(MOE_PRESETS)
    assert names.index("llama-7b") < names.index("llama-13b")


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_PARAMS_B.items()))
def test_preset_params_match_published(name, billions):
    assert get_preset(name).total_params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_every_preset_names_a_source():
    for name in preset_names():
        spec = get_preset(name)
        assert spec.source.strip(), name
        assert spec.is_moe == (name in MOE_PRESETS), name
        if not spec.is_moe:
            spec.require_dense()


def test_preset_values_from_public_configs():
    l13 = get_preset("llama-13b")
    assert (l13.num_layers, l13.hidden_size, l13.num_heads, l13.ffn_hidden_size, l13.vocab_size,
            l13.max_seq_len) == (40, 5120, 40, 13824, 32000, 4096)
    l70 = get_preset("llama3-70b")
    assert (l70.num_kv_heads, l70.ffn_hidden_size, l70.vocab_size, l70.rope_theta) == (8, 28672, 128256, 5e5)
    assert get_preset("mpt-7b").position_embedding == "alibi"
    assert get_preset("llemma-7b").vocab_size == 32016
    g3 = get_preset("gpt3-175b")
    assert (g3.num_layers, g3.hidden_size, g3.head_dim, g3.ffn_hidden_size) == (96, 12288, 128, 4 * 12288)


def test_new_dense_families_match_published_counts():
    """Gemma 2 report (arXiv 2408.00118) Table 2: 9B non-embedding 8,324,201,984 (layers and the final norm);
    its embedding count uses the 256,128-entry tokenizer, config.json's vocab_size is 256,000. Qwen3-4B model card:
    4.0B total, 3.6B non-embedding. Falcon model cards: 7B and 40B (nominal); exactly, the sum of FalconForCausalLM's
    module shapes (word_embeddings V x h tied to lm_head; per layer query_key_value h x (q + 2 kv), dense q x h,
    dense_h_to_4h, dense_4h_to_h, LayerNorm weight + bias per norm; ln_f)."""
    gemma = from_hf_config(FIXTURES / "gemma-2-9b.json")
    assert gemma.non_embedding_params() + gemma.head_params() == 8_324_201_984
    assert gemma.embedding_params() == 256_000 * 3584
    qwen = from_hf_config(FIXTURES / "qwen3-4b.json")
    assert qwen.total_params() / 1e9 == pytest.approx(4.0, rel=0.01)
    assert qwen.non_embedding_params() / 1e9 == pytest.approx(3.6, rel=0.015)

    def falcon_modules(h, layers, heads, kv, norms, vocab=65024):
        d = h // heads
        layer = h * (heads + 2 * kv) * d + heads * d * h + 2 * h * 4 * h + norms * 2 * h
        return vocab * h + layers * layer + 2 * h
    f7 = from_hf_config(FIXTURES / "falcon-7b-instruct.json")
    f40 = from_hf_config(FIXTURES / "falcon-40b-instruct.json")
    assert f7.total_params() == falcon_modules(4544, 32, 71, 1, 1) == 6_921_720_704
    assert f40.total_params() == falcon_modules(8192, 60, 128, 8, 2) == 41_303_293_952
    assert f7.total_params() / 1e9 == pytest.approx(7, rel=0.02)
    assert f40.total_params() / 1e9 == pytest.approx(40, rel=0.04)
    for preset, fixture in (("gemma-2-9b", "gemma-2-9b"), ("qwen3-4b", "qwen3-4b"),
                            ("falcon-7b", "falcon-7b-instruct"), ("falcon-40b", "falcon-40b-instruct")):
        assert get_preset(preset).total_params() == from_hf_config(FIXTURES / f"{fixture}.json").total_params()


def test_preset_matches_its_fixture_config():
    # The Mistral preset and the hand-copied config.json must describe the same model.
    preset, parsed = get_preset("mistral-7b"), from_hf_config(FIXTURES / "mistral-7b.json")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                  "activation", "norm", "rope_theta", "tied_embeddings", "linear_bias"):
        assert getattr(preset, field) == getattr(parsed, field), field
    # max_seq_len: the preset's is the cited 8192 context (seq_len_source); the config's 32768 positions are kept
    assert (preset.max_seq_len, parsed.max_seq_len) == (8192, 32768)
    assert preset.extra["config_max_position_embeddings"] == parsed.max_seq_len
    assert get_preset("gpt-20b").total_params() == from_hf_config(FIXTURES / "gpt-neox-20b.json").total_params()
    assert get_preset("mpt-7b").total_params() == from_hf_config(FIXTURES / "mpt-7b.json").total_params()


def test_lookup_is_case_insensitive_and_cached():
    assert get_preset("LLaMA-13B") is get_preset("llama-13b")


def test_unknown_preset_lists_names():
    with pytest.raises(PlannerError) as err:
        get_preset("llama-9000b")
    assert "llama-13b" in str(err.value) and "planner models" in str(err.value)


def test_resolve_model_accepts_name_path_and_dict():
    assert resolve_model("Llama3-8B").name == "llama3-8b"
    assert resolve_model(str(FIXTURES / "qwen2-7b.json")).num_kv_heads == 4
    assert resolve_model(FIXTURES / "gpt2.json").name == "gpt2"
    assert resolve_model(_cfg("bloom-560m")).position_embedding == "alibi"
    spec = get_preset("mpt-30b")
    assert resolve_model(spec) is spec
    with pytest.raises(PlannerError, match="planner models"):
        resolve_model("not-a-model")
    with pytest.raises(PlannerError, match="does not exist"):
        resolve_model("missing/config.json")


# ------------------------------------------------------------------ CLI
def test_cli_models_table():
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    for name in preset_names():
        assert name in result.output
    assert "params" in result.output and "[B]" in result.output and "405.85" in result.output


def test_cli_models_json():
    result = CliRunner().invoke(app, ["models", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert set(rows) == set(preset_names())
    assert rows["llama-13b"]["params_billion"] == pytest.approx(13.0, rel=0.01)
    assert rows["llama3-70b"]["num_kv_heads"] == 8
    assert rows["gpt3-175b"]["source"].startswith("Brown et al. 2020")


def test_cli_models_bad_format():
    result = CliRunner().invoke(app, ["models", "--format", "xml"])
    assert result.exit_code != 0


# ---- unknown config.json keys (issue #6): ignored silently only when known to be irrelevant
def test_unread_config_keys_are_named_in_a_warning():
    import json

    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.core.specs.hf_config import from_hf_config
    from costmodel.core.specs.plan import ParallelPlan
    from planner.prediction import predict

    fx = Path(__file__).parent / "fixtures" / "hf_configs" / "llama2-7b.json"
    data = json.loads(fx.read_text())
    assert from_hf_config(dict(data)).extra.get("unread_keys") is None          # every key read or irrelevant
    m = from_hf_config({**data, "num_experts": 8, "my_new_trick": True, "bos_token_id": 7, "n_null": None})
    assert m.extra["unread_keys"] == ["my_new_trick", "num_experts"]             # irrelevant and null keys: silent
    hw = load_catalogue().resolve("a100-80gb")
    p = predict(m, ParallelPlan(gpus=8, gpus_per_node=8, gbs=64, seq_len=2048, tp=2), hw)
    assert any("keys planner does not read, ignored: my_new_trick, num_experts" in w for w in p.warnings)
    qwen = from_hf_config(Path(__file__).parent / "fixtures" / "hf_configs" / "qwen2-7b.json")
    assert "sliding_window" in qwen.extra["unread_keys"]                         # relevant at long sequences


# ---- mixture-of-experts configs and presets (issue #17)
# Published total / active parameters, and what the publisher's "active" counts:
# - Mixtral 8x7B 46.7B / 12.9B and Mixtral 8x22B 141B / 39B (Mistral AI announcements "Mixtral of experts",
#   2023-12-11, and "Cheaper, Better, Faster, Stronger", 2024-04-17): active includes the embedding table.
# - Qwen3-30B-A3B 30.5B / 3.3B and Qwen3-235B-A22B 235B / 22B (Qwen3 Technical Report, arXiv 2505.09388):
#   active includes the embedding table.
# - DeepSeek-V3 671B / 37B (arXiv 2412.19437 abstract); deepseek-ai/DeepSeek-V3 README_WEIGHTS.md (the revision
#   copied in tenstorrent/tt-metal models/demos/deepseek_v3/reference/README_WEIGHTS.md) gives the main model 671B
#   and 36.6B activated "including 0.9B for the output Head", i.e. without the 0.9B input embedding (a later
#   revision, 0b39205, says 36.7B including embedding and head, which no count of config.json reproduces: 37.55B
#   with both); the 685B download adds the MTP module (11.5B unique), which planner does not model.
# - gpt-oss-120b 116.83B / 5.13B and gpt-oss-20b 20.91B / 3.61B (gpt-oss Model Card, arXiv 2508.10925, Table 1):
#   active without the embedding.
# Tolerance 0.5 %: the publishers round to 3 significant figures (46.7, 12.9, 30.5, 3.3 -> 2 figures: 2 %).
PUBLISHED_MOE = {  # preset: (total, active, active counts the input embedding, relative tolerance of active)
    "mixtral-8x7b": (46.7e9, 12.9e9, True, 0.005),
    "mixtral-8x22b": (141e9, 39e9, True, 0.005),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True, 0.02),
    "qwen3-235b-a22b": (235e9, 22e9, True, 0.01),
    "deepseek-v3": (671e9, 36.6e9, False, 0.005),
    "gpt-oss-120b": (116.83e9, 5.13e9, False, 0.001),
    "gpt-oss-20b": (20.91e9, 3.61e9, False, 0.001),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MOE))
def test_moe_preset_params_match_published(name):
    total, active, with_embedding, tol = PUBLISHED_MOE[name]
    spec = get_preset(name)
    assert spec.total_params() == pytest.approx(total, rel=0.005)
    got = spec.active_params() - (0 if with_embedding else spec.embedding_params())
    assert got == pytest.approx(active, rel=tol)


def test_deepseek_v3_is_671b_without_the_mtp_module_and_37b_active():
    spec = get_preset("deepseek-v3")
    assert spec.total_params() == pytest.approx(671e9, rel=0.001)   # the hub's 685B adds the MTP module
    # the paper's 37B (2 significant figures: 36.5-37.5B) counts without the input embedding, as README_WEIGHTS does
    assert spec.active_params() - spec.embedding_params() == pytest.approx(37e9, rel=0.014)
    assert (spec.num_moe_layers, spec.is_moe_layer(2), spec.is_moe_layer(3)) == (58, False, True)


@pytest.mark.parametrize("fixture,published_total,published_active,with_embedding", [
    ("qwen1.5-moe-a2.7b-chat", 14.3e9, 2.7e9, True),   # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated
    ("deepseek-v2-lite", 15.7e9, 2.4e9, False),        # DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated
])
def test_moe_fixture_params_match_published(fixture, published_total, published_active, with_embedding):
    # active counted as DeepSeek-V3's README_WEIGHTS does (no input embedding) gives 2.45B for V2-Lite: the
    # published 2.4B has 2 significant figures (2.35-2.45, up to 2.1 % off), hence 2.5 %
    spec = from_hf_config(FIXTURES / f"{fixture}.json")
    assert spec.total_params() == pytest.approx(published_total, rel=0.005)
    active = spec.active_params() - (0 if with_embedding else spec.embedding_params())
    assert active == pytest.approx(published_active, rel=0.025)


@pytest.mark.parametrize("preset,fixture", [("mixtral-8x7b", "mixtral-8x7b"), ("mixtral-8x22b", "mixtral-8x22b"),
                                            ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("deepseek-v3", "deepseek-v3"),
                                            ("gpt-oss-120b", "gpt-oss-120b")])
def test_moe_preset_matches_its_config(preset, fixture):
    a, b = get_preset(preset), from_hf_config(FIXTURES / f"{fixture}.json")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size",
                  "vocab_size", "num_experts", "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts",
                  "shared_expert_ffn_hidden_size", "first_dense_layers", "moe_layer_freq", "router", "q_lora_rank",
                  "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "sliding_window", "sliding_window_every",
                  "attention_sinks", "linear_bias", "tied_embeddings", "rope_theta"):
        assert getattr(a, field) == getattr(b, field), field
    assert a.total_params() == b.total_params()


def test_qwen2_moe_shared_expert_has_its_own_width():
    spec = from_hf_config(FIXTURES / "qwen1.5-moe-a2.7b-chat.json")
    assert (spec.expert_ffn, spec.shared_ffn) == (1408, 5632)
    assert spec.extra["qkv_bias"] is True and spec.extra["shared_expert_gate"] is True
    no_shared = from_hf_config({**_cfg("qwen1.5-moe-a2.7b-chat"), "shared_expert_intermediate_size": 0})
    assert no_shared.num_shared_experts == 0


def test_qwen_moe_layer_pattern():
    cfg = _cfg("qwen3-30b-a3b")
    every_other = from_hf_config({**cfg, "decoder_sparse_step": 2})
    assert [every_other.is_moe_layer(i) for i in range(4)] == [False, True, False, True]  # (i + 1) % 2 == 0
    leading = from_hf_config({**cfg, "mlp_only_layers": [0, 1]})
    assert (leading.first_dense_layers, leading.num_moe_layers) == (2, 46)
    for bad in ({"mlp_only_layers": [3, 7]}, {"mlp_only_layers": [0], "decoder_sparse_step": 2}):
        with pytest.raises(PlannerError, match="mlp_only_layers"):
            from_hf_config({**cfg, **bad})
    with pytest.raises(PlannerError, match="decoder_sparse_step=49"):
        from_hf_config({**cfg, "decoder_sparse_step": 49})
    with pytest.raises(PlannerError, match="first_dense_layers"):               # every layer dense: refused
        from_hf_config({**cfg, "mlp_only_layers": list(range(48))})
    # sliding_window / max_window_layers act only with use_sliding_window: not warned about
    assert "max_window_layers" not in from_hf_config(cfg).extra.get("unread_keys", [])


def test_deepseek_mla_and_router():
    v3 = from_hf_config(FIXTURES / "deepseek-v3.json")
    assert (v3.is_mla, v3.router, v3.shared_ffn) == (True, "sigmoid", 2048)
    assert v3.mtp_layers == 1 and "num_nextn_predict_layers" not in v3.extra["unread_keys"]  # MTP: costmodel.memory.mtp
    lite = from_hf_config(FIXTURES / "deepseek-v2-lite.json")
    assert (lite.q_lora_rank, lite.router, lite.shared_ffn) == (0, "softmax", 2 * 1408)  # q_lora_rank null
    assert from_hf_config({**_cfg("deepseek-v3"), "n_shared_experts": None}).num_shared_experts == 0
    with pytest.raises(PlannerError, match="moe_layer_freq"):
        from_hf_config({**_cfg("deepseek-v3"), "moe_layer_freq": 2})
    with pytest.raises(PlannerError, match="scoring_func"):
        from_hf_config({**_cfg("deepseek-v3"), "scoring_func": "sqrtsoftplus"})
    with pytest.raises(PlannerError, match="kv_lora_rank"):
        from_hf_config({k: v for k, v in _cfg("deepseek-v3").items() if k != "kv_lora_rank"})


def test_gpt_oss_layer_types():
    cfg = _cfg("gpt-oss-120b")
    spec = from_hf_config(cfg)
    assert [spec.uses_sliding_window(i) for i in range(4)] == [True, False, True, False]
    assert spec.extra["gated_activation"] == "gpt_oss_clamped_swiglu"
    assert from_hf_config({**cfg, "layer_types": ["full_attention"] * 36}).sliding_window_every == 0
    assert from_hf_config({**cfg, "layer_types": ["sliding_attention"] * 36}).sliding_window_every == 1
    assert from_hf_config({k: v for k, v in cfg.items() if k != "layer_types"}).sliding_window_every == 2
    with pytest.raises(PlannerError, match="layer_types"):
        from_hf_config({**cfg, "layer_types": ["full_attention", "sliding_attention"] * 18})


def test_capacity_factor_read_where_given():
    assert from_hf_config(FIXTURES / "mixtral-8x7b.json").capacity_factor == 0.0                 # dropless
    assert from_hf_config({**_cfg("qwen3-30b-a3b"), "moe_expert_capacity_factor": 1.25}).capacity_factor == 1.25
    with pytest.raises(PlannerError, match="capacity_factor"):
        from_hf_config({**_cfg("mixtral-8x7b"), "capacity_factor": -1})


def test_cli_models_lists_moe_facts():
    result = CliRunner().invoke(app, ["models", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    ds = rows["deepseek-v3"]
    assert (ds["num_experts"], ds["experts_per_token"], ds["num_shared_experts"]) == (256, 8, 1)
    assert ds["params_billion"] == pytest.approx(671.0, rel=0.001)
    assert ds["active_params_billion"] == pytest.approx(37.55, rel=0.001)
    dense = rows["llama3-8b"]
    assert (dense["num_experts"], dense["active_params_billion"]) == (0, dense["params_billion"])
    table = CliRunner().invoke(app, ["models"])
    assert "256/8" in table.output and "37.55" in table.output
