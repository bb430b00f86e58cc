"""Every model field reaches every export target, and every shell script the exports write is valid bash.

``ROUTES`` is the table of fields per target: for each ModelSpec field and each architecture key of
``ModelSpec.extra`` (planner.export_arch.ARCHITECTURE_EXTRA), when it is set, which Megatron-LM flag(s), which NeMo
key(s) carry it, or else a ``# NOTE: <field>: ...`` line must be written; torchtitan takes the architecture from a
flavor, so there the field must be named in the ``# Architecture:`` header (what a flavor must be registered
with) or in a NOTE. A new ModelSpec field or extra key without a row fails :func:`test_every_field_has_a_route`.
The battery is every preset and every config.json fixture; bash -n runs on the Slurm export of every preset.
"""

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from costmodel.core.specs.presets import get_preset, preset_names
from planner.cli import app
from planner.export import export_plan
from planner.export_arch import ARCHITECTURE_EXTRA, REFERENCE_EXTRA
from planner.prediction import predict
from tests.helpers import check_torchtitan_keys, parse_megatron

FIX = Path(__file__).parent / "fixtures"
HW = load_catalogue().resolve("h100-sxm")
NEMO = json.loads((FIX / "launchers" / "nemo_config_keys.json").read_text())
TITAN_MODELS = json.loads((FIX / "launchers" / "torchtitan_models.json").read_text())


def _always(m):
    return True


def _extra(key, test=lambda v: v is not None):
    return lambda m: key in m.extra and test(m.extra[key])


def _window_on(m):
    return m.extra.get("sliding_window") is not None and m.extra.get("use_sliding_window") is not False


_NUM = (int, float)
# field: (is set?, Megatron-LM flags, NeMo keys, torchtitan header label); any listed flag / key, or a NOTE naming
# the field, is evidence; an empty tuple means only a NOTE can carry it.
ROUTES = {
    "num_layers": (_always, ("--num-layers",), ("num_layers",), "layers"),
    "hidden_size": (_always, ("--hidden-size",), ("hidden_size",), "hidden"),
    "num_heads": (_always, ("--num-attention-heads",), ("num_attention_heads",), "heads"),
    "num_kv_heads": (lambda m: m.num_kv_heads != m.num_heads, ("--num-query-groups",), ("num_query_groups",),
                     "KV heads"),
    "ffn_hidden_size": (_always, ("--ffn-hidden-size",), ("ffn_hidden_size",), "FFN hidden"),
    "vocab_size": (_always, ("--vocab-size",), (), "vocab"),
    "head_dim": (lambda m: m.head_dim * m.num_heads != m.hidden_size, ("--kv-channels",), ("kv_channels",),
                 "head dim"),
    "activation": (lambda m: m.activation != "gelu", ("--swiglu", "--squared-relu", "--quick-geglu"),
                   ("activation",), "activation"),
    "norm": (_always, ("--normalization",), ("normalization",), "norm"),
    "tied_embeddings": (lambda m: not m.tied_embeddings, ("--untie-embeddings-and-output-weights",),
                        ("share_embeddings_and_output_weights",), "tied embeddings"),
    "position_embedding": (_always, ("--position-embedding-type",), ("position_embedding_type",), "position"),
    "max_seq_len": (_always, ("--max-position-embeddings",), ("max_position_embeddings",), "max positions"),
    "linear_bias": (lambda m: not m.linear_bias, ("--disable-bias-linear",), ("bias",), "bias"),
    "dropout": (lambda m: not m.dropout, ("--attention-dropout",), ("hidden_dropout",), "dropout"),
    "num_experts": (lambda m: m.is_moe, ("--num-experts",), ("num_moe_experts",), "experts"),
    "experts_per_token": (lambda m: m.is_moe, ("--moe-router-topk",), ("moe_router_topk",), "top-k"),
    "moe_ffn_hidden_size": (lambda m: m.is_moe, ("--moe-ffn-hidden-size",), ("moe_ffn_hidden_size",), "expert FFN"),
    "num_shared_experts": (lambda m: m.num_shared_experts > 0, ("--moe-shared-expert-intermediate-size",),
                           ("moe_shared_expert_intermediate_size",), "shared experts"),
    "shared_expert_ffn_hidden_size": (lambda m: m.shared_expert_ffn_hidden_size > 0,
                                      ("--moe-shared-expert-intermediate-size",),
                                      ("moe_shared_expert_intermediate_size",), "shared experts"),
    "first_dense_layers": (lambda m: m.first_dense_layers > 0, ("--moe-layer-freq",), ("moe_layer_freq",),
                           "dense-first layers"),
    "moe_layer_freq": (lambda m: m.is_moe and m.moe_layer_freq > 1, ("--moe-layer-freq",), ("moe_layer_freq",),
                       "MoE every"),
    "router": (lambda m: m.is_moe, ("--moe-router-score-function",), ("moe_router_score_function",), "router"),
    "capacity_factor": (lambda m: m.capacity_factor > 0, ("--moe-expert-capacity-factor",),
                        ("moe_expert_capacity_factor",), "capacity factor"),
    "q_lora_rank": (lambda m: m.q_lora_rank > 0, ("--q-lora-rank",), ("q_lora_rank",), "q LoRA rank"),
    "kv_lora_rank": (lambda m: m.is_mla, ("--kv-lora-rank",), ("kv_lora_rank",), "KV LoRA rank"),
    "qk_rope_head_dim": (lambda m: m.is_mla, ("--qk-pos-emb-head-dim",), ("qk_pos_emb_head_dim",), "rope head dim"),
    "v_head_dim": (lambda m: m.is_mla, ("--v-head-dim",), ("v_head_dim",), "V head dim"),
    "sliding_window": (lambda m: m.sliding_window > 0, ("--window-size",), ("window_size",), "sliding window"),
    "sliding_window_every": (lambda m: m.sliding_window > 0 and m.sliding_window_every > 1,
                             ("--window-attn-skip-freq",), ("window_attn_skip_freq",), "window layers"),
    "attention_sinks": (lambda m: m.attention_sinks, ("--softmax-type",), ("softmax_type",), "attention sinks"),
    "rope_theta": (lambda m: m.position_embedding == "rope", ("--rotary-base",), ("rotary_base",), "rope theta"),
    "parallel_attention": (lambda m: m.parallel_attention, (), (), "parallel_attention"),
    "norms_per_layer": (lambda m: m.norms_per_layer != 2, (), (), "norms_per_layer"),
    "attn_logit_softcap": (lambda m: m.attn_logit_softcap > 0, (), (), "attn_logit_softcap"),
    "final_logit_softcap": (lambda m: m.final_logit_softcap > 0, (), (), "final_logit_softcap"),
    "mtp_layers": (lambda m: m.mtp_layers > 0, ("--mtp-num-layers",), ("mtp_num_layers",), "MTP layers"),
}
_EPS = ("--norm-epsilon",), ("layernorm_epsilon",), "norm eps"
EXTRA_ROUTES = {
    **{k: (_extra(k), *_EPS) for k in ("norm_eps", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                                       "layernorm_epsilon")},
    "qkv_bias": (_extra("qkv_bias", lambda v: v is True), ("--add-qkv-bias",), ("qkv_bias",), "bias QKV only"),
    "attention_bias": (_extra("attention_bias", lambda v: v is True), ("--add-qkv-bias",), ("qkv_bias",), "bias"),
    "mlp_bias": (_extra("mlp_bias", lambda v: v is True), (), (), "bias"),
    "sliding_window": (_window_on, ("--window-size",), ("window_size",), "sliding window"),
    "use_sliding_window": (lambda m: _window_on(m) and "use_sliding_window" in m.extra, ("--window-size",),
                           ("window_size",), "sliding window"),
    "max_window_layers": (lambda m: _window_on(m) and 0 < (m.extra.get("max_window_layers") or 0) < m.num_layers,
                          (), (), "max_window_layers"),
    "rotary_pct": (_extra("rotary_pct", lambda v: v != 1.0), ("--rotary-percent",), ("rotary_percentage",),
                   "rotary percent"),
    "partial_rotary_factor": (_extra("partial_rotary_factor", lambda v: v != 1.0), ("--rotary-percent",),
                              ("rotary_percentage",), "rotary percent"),
    "qk_norm": (_extra("qk_norm", lambda v: v is True), ("--qk-layernorm",), ("qk_layernorm",), "QK norm"),
    "use_qk_norm": (_extra("use_qk_norm", lambda v: v is True), ("--qk-layernorm",), ("qk_layernorm",), "QK norm"),
    "num_nextn_predict_layers": (_extra("num_nextn_predict_layers", lambda v: v > 0), ("--mtp-num-layers",),
                                 ("mtp_num_layers",), "MTP layers"),
    "rope_scaling": (_extra("rope_scaling", lambda v: isinstance(v, dict)),
                     ("--rotary-scaling-factor", "--use-rope-scaling", "--rope-type"),
                     ("rotary_scaling_factor", "rope_type"), "rope_scaling"),
    "rope_parameters": (_extra("rope_parameters", lambda v: isinstance(v, dict)),
                        ("--rotary-scaling-factor", "--use-rope-scaling", "--rope-type"),
                        ("rotary_scaling_factor", "rope_type"), "rope_parameters"),
    "gated_activation": (lambda m: m.gated and "gated_activation" in m.extra, ("--quick-geglu",),
                         ("glu_linear_offset",), "gate"),
    "swiglu_limit": (_extra("swiglu_limit"), ("--activation-func-clamp-value",), ("activation_func_clamp_value",),
                     "swiglu_limit"),
    "use_parallel_residual": (_extra("use_parallel_residual", lambda v: v is True), (), (), "use_parallel_residual"),
    "embedding_layernorm": (_extra("embedding_layernorm", lambda v: v is True), (), (), "embedding_layernorm"),
    "clip_qkv": (_extra("clip_qkv"), (), (), "clip_qkv"),
    "norm_topk_prob": (lambda m: m.is_moe and m.extra.get("norm_topk_prob") is False, ("--moe-router-pre-softmax",),
                       ("moe_router_pre_softmax",), "norm_topk_prob"),
    "routed_scaling_factor": (lambda m: m.is_moe and m.extra.get("routed_scaling_factor", 1.0) != 1.0,
                              ("--moe-router-topk-scaling-factor",), ("moe_router_topk_scaling_factor",),
                              "routed_scaling_factor"),
    "topk_method": (lambda m: m.is_moe and m.extra.get("topk_method") == "noaux_tc",
                    ("--moe-router-enable-expert-bias",), ("moe_router_enable_expert_bias",), "topk_method"),
    "n_group": (lambda m: m.is_moe and (m.extra.get("n_group") or 0) > 1 and m.extra.get("topk_method") in (
        "group_limited_greedy", "noaux_tc"), ("--moe-router-num-groups",), ("moe_router_num_groups",), "n_group"),
    "topk_group": (lambda m: m.is_moe and (m.extra.get("n_group") or 0) > 1 and m.extra.get("topk_method") in (
        "group_limited_greedy", "noaux_tc"), ("--moe-router-group-topk",), ("moe_router_group_topk",), "topk_group"),
    "router_aux_loss_coef": (lambda m: m.is_moe and isinstance(m.extra.get("router_aux_loss_coef"), _NUM),
                             ("--moe-aux-loss-coeff",), ("moe_aux_loss_coeff",), "router_aux_loss_coef"),
    "aux_loss_alpha": (lambda m: m.is_moe and isinstance(m.extra.get("aux_loss_alpha"), _NUM),
                       ("--moe-aux-loss-coeff",), ("moe_aux_loss_coeff",), "aux_loss_alpha"),
    "seq_aux": (lambda m: m.is_moe and m.extra.get("seq_aux") is True, ("--moe-router-load-balancing-type",),
                ("moe_router_load_balancing_type",), "seq_aux"),
    "router_jitter_noise": (lambda m: m.is_moe and (m.extra.get("router_jitter_noise") or 0) > 0,
                            ("--moe-input-jitter-eps",), ("moe_input_jitter_eps",), "router_jitter_noise"),
    "shared_expert_gate": (_extra("shared_expert_gate", lambda v: v is True), (), (), "shared_expert_gate"),
    "query_pre_attn_scalar": (lambda m: float(m.extra.get("query_pre_attn_scalar", m.head_dim)) != m.head_dim, (),
                              (), "query_pre_attn_scalar"),
    "scale_embeddings": (_extra("scale_embeddings", lambda v: v is True), (), (), "scale_embeddings"),
}


def test_every_field_has_a_route():
    """A ModelSpec field or an architecture key of ``extra`` without a row in the table fails here: give it a flag /
    key per target or a NOTE, then a row."""
    spec_fields = {f.name for f in fields(ModelSpec)} - {"name", "source", "extra"}
    assert set(ROUTES) == spec_fields, (spec_fields - set(ROUTES), set(ROUTES) - spec_fields)
    assert set(EXTRA_ROUTES) == set(ARCHITECTURE_EXTRA), set(ARCHITECTURE_EXTRA) ^ set(EXTRA_ROUTES)
    for model in MODELS.values():
        unknown = set(model.extra) - set(ARCHITECTURE_EXTRA) - set(REFERENCE_EXTRA)
        assert not unknown, f"{model.name}: extra keys {unknown} are neither exported nor marked reference-only"


def _fixture(path):
    return from_hf_config(path)


MODELS = {**{n: get_preset(n) for n in preset_names()},
          **{f"config:{p.stem}": _fixture(p) for p in sorted((FIX / "hf_configs").glob("*.json"))}}


def plan_for(model: ModelSpec, gpus: int = 16) -> ParallelPlan:
    """A small valid plan (TP 1, PP 2; EP the largest of 8, 4, 2, 1 that divides the experts)."""
    for ep in (8, 4, 2, 1):
        if model.is_moe and model.num_experts % ep:
            continue
        p = ParallelPlan(gpus=gpus, gpus_per_node=8, gbs=64, seq_len=1024, pp=2,
                         ep=ep if model.is_moe else 1)
        try:
            p.validate(model)
            return p
        except PlannerError:
            continue
    raise AssertionError(f"no small plan for {model.name}")


def _noted(text: str, field: str) -> bool:
    return re.search(rf"^# NOTE: .*\b{re.escape(field)}\b", text, re.M) is not None


def _routes(model):
    for field, row in ROUTES.items():
        yield field, row
    for key, row in EXTRA_ROUTES.items():
        yield key, row


@pytest.mark.parametrize("name", MODELS)
def test_megatron_and_nemo_carry_every_field(name):
    model = MODELS[name]
    plan = plan_for(model)
    meg = export_plan(model, plan, HW, None, "megatron")
    tokens = set(shlex.split(meg, comments=True))
    parse_megatron(meg)  # every flag and value is one Megatron-LM's argparse takes
    nemo_text = export_plan(model, plan, HW, None, "nemo")
    m = yaml.safe_load(nemo_text)["model"]
    assert set(m) <= set(NEMO["model"]), set(m) - set(NEMO["model"])
    for field, (is_set, flags, keys, _) in _routes(model):
        if not is_set(model):
            continue
        assert any(f in tokens for f in flags) or _noted(meg, field), f"Megatron export of {name} drops {field}"
        assert any(m.get(k) is not None for k in keys) or _noted(nemo_text, field), \
            f"NeMo export of {name} drops {field}"


@pytest.mark.parametrize("name", MODELS)
def test_torchtitan_names_every_field_or_refuses_in_one_line(name):
    model = MODELS[name]
    plan = dataclasses.replace(plan_for(model), pp=1, gpus=8, zero=3)
    try:
        text = export_plan(model, plan, HW, None, "torchtitan")
    except PlannerError as exc:  # torchtitan has no model for this MoE architecture
        assert model.is_moe and "\n" not in str(exc) and "--to megatron" in str(exc)
        return
    t = tomllib.loads(text)
    check_torchtitan_keys(t)
    assert t["model"]["name"] in TITAN_MODELS["supported_models"]
    assert t["model"]["flavor"] in TITAN_MODELS["models"][t["model"]["name"]] or "register flavor" in text
    arch = next(line for line in text.splitlines() if line.startswith("# Architecture:"))
    for field, (is_set, _, _, label) in _routes(model):
        if is_set(model):
            assert label in arch or _noted(text, field), f"torchtitan export of {name} drops {field}"


# ------------------------------------------------------------------------------------- the cases of the issue
def _megatron(model_name, **plan_kw):
    model = get_preset(model_name)
    plan = dataclasses.replace(plan_for(model), **plan_kw)
    return parse_megatron(export_plan(model, plan, HW, None, "megatron"))


def test_qwen3_235b_has_qk_norm_and_its_epsilon():
    a = _megatron("qwen3-235b-a22b")
    assert a.qk_layernorm is True and a.norm_epsilon == 1e-6  # Qwen3MoeAttention q_norm/k_norm; config.json 1e-06
    assert a.moe_router_load_balancing_type == ["aux_loss"] and a.moe_aux_loss_coeff == [0.001]
    assert a.moe_router_pre_softmax is False  # norm_topk_prob true: top-k then softmax, Megatron's default


def test_deepseek_v3_keeps_router_groups_scaling_bias_and_mtp():
    a = _megatron("deepseek-v3")
    assert (a.moe_router_score_function, a.moe_router_num_groups, a.moe_router_group_topk) == ("sigmoid", 8, 4)
    assert a.moe_router_topk_scaling_factor == 2.5 and a.moe_router_enable_expert_bias is True
    assert a.moe_router_load_balancing_type == ["seq_aux_loss"] and a.moe_aux_loss_coeff == [0.0001]
    assert a.mtp_num_layers == 1 and a.multi_latent_attention and a.qk_layernorm  # latent norms (MLA specs)
    assert a.moe_layer_freq == [0] * 3 + [1] * 58 and a.norm_epsilon == 1e-6
    assert a.rope_type == "rope"  # pre-training at 4K: no YaRN (Megatron's MLA default is yarn)
    nemo = yaml.safe_load(export_plan(get_preset("deepseek-v3"), plan_for(get_preset("deepseek-v3")), HW, None,
                                      "nemo"))["model"]
    assert (nemo["moe_router_num_groups"], nemo["moe_router_group_topk"], nemo["moe_router_topk_scaling_factor"],
            nemo["moe_router_enable_expert_bias"], nemo["mtp_num_layers"]) == (8, 4, 2.5, True, 1)


def test_gpt_oss_gate_sinks_and_alternating_window():
    a = _megatron("gpt-oss-20b")
    assert a.quick_geglu and a.swiglu is False and a.glu_linear_offset == 1.0 and a.activation_func_clamp_value == 7.0
    assert a.softmax_type == "learnable" and a.window_size == (128, 0) and a.window_attn_skip_freq == 2


def test_torchtitan_uses_its_own_moe_model_names():
    for preset, name, flavor in (("deepseek-v3", "deepseek_v3", "671B"), ("qwen3-235b-a22b", "qwen3", "235B-A22B"),
                                 ("qwen3-30b-a3b", "qwen3", "30B-A3B"), ("llama3-70b", "llama3", "70B")):
        model = get_preset(preset)
        plan = dataclasses.replace(plan_for(model), pp=1, gpus=8, zero=3)
        text = export_plan(model, plan, HW, None, "torchtitan")
        assert tomllib.loads(text)["model"] == {"name": name, "flavor": flavor}, preset
    text = export_plan(get_preset("qwen3-235b-a22b"), dataclasses.replace(
        plan_for(get_preset("qwen3-235b-a22b")), pp=1, gpus=8, zero=3), HW, None, "torchtitan")
    assert "# NOTE: rope_theta: torchtitan's qwen3 235B-A22B flavor has 5000000.0, the model 1000000.0" in text
    ds = export_plan(get_preset("deepseek-v3"), dataclasses.replace(plan_for(get_preset("deepseek-v3")), pp=1,
                                                                     gpus=8, zero=3), HW, None, "torchtitan")
    assert "# NOTE: num_nextn_predict_layers: torchtitan's deepseek_v3 671B flavor has 0" in ds
    assert "# NOTE: n_group: torchtitan" in ds  # group-limited routing is not implemented there


def test_torchtitan_refusals_are_one_line_exit_2():
    r = CliRunner().invoke(app, ["export", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--pp",
                                 "4", "--ep", "8", "--seq-len", "4096", "--to", "torchtitan"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "has no model for mixtral-8x7b" in r.output
    r = CliRunner().invoke(app, ["export", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "64", "--pp",
                                 "4", "--ep", "8", "--seq-len", "4096", "--to", "torchtitan"])
    assert r.exit_code == 2 and "no pipeline support" in r.output
    # --to all writes the other three and says why torchtitan is missing
    r = CliRunner().invoke(app, ["export", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--pp",
                                 "4", "--ep", "8", "--seq-len", "4096", "--to", "all"])
    assert r.exit_code == 0 and "warning: torchtitan not written: torchtitan" in r.output
    assert "# not written: torchtitan" in r.output and "[model]" not in r.output


# ------------------------------------------------------------------------------------------- shell scripts
BASH = shutil.which("bash")


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("name", preset_names())
def test_every_preset_slurm_script_passes_bash_n(name, tmp_path):
    model = get_preset(name)
    plan = plan_for(model)
    text = export_plan(model, plan, HW, predict(model, plan, HW), "slurm", iterations=100)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _check_quoting(text)


def _check_quoting(text: str) -> None:
    """Every argument of the srun line is one shlex.quote'd token (a flag's values after it)."""
    body = text[text.index("\nsrun ") + 1:].replace("\\\n", " ")
    argv = shlex.split(body, comments=True)
    for token in argv[argv.index("pretrain_gpt.py") + 1:]:
        assert shlex.quote(token) in body, token


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_pipeline_layout_and_layer_pattern_are_quoted(tmp_path):
    model = get_preset("deepseek-v3")
    plan = ParallelPlan(gpus=512, gpus_per_node=8, gbs=512, seq_len=4096, pp=8, ep=64,
                        pipeline_layout=(8,) + (7,) * 6 + (11,))
    text = export_plan(model, plan, HW, predict(model, plan, HW), "slurm", iterations=10)
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in text
    layout = next(t for t in shlex.split(text[text.index("\nsrun "):].replace("\\\n", " "), comments=True)
                  if t.startswith("E,"))
    assert "|" in layout and f"--pipeline-model-parallel-layout {shlex.quote(layout)}" in text
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True).returncode == 0
    _check_quoting(text)
