"""Exports (Megatron-LM flags, NeMo YAML, torchtitan TOML, Slurm script): parse each back and check every value."""

import dataclasses
import json
import math
import os
import shlex
import tomllib

import pytest
import yaml
from typer.testing import CliRunner

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from planner.checkpointing import save_interval
from planner.cli import app
from planner.export import (
    STARTUP_ALLOWANCE_S,
    export_plan,
    format_slurm_time,
    iterations_for_tokens,
    slurm_time_seconds,
)
from planner.prediction import predict
from tests.helpers import gpt, llama, plan

runner = CliRunner()
HW = load_catalogue().resolve("a100-80gb")

# Llama-style GQA model, TP=2 PP=4 VPP=2 with SP, distributed optimizer (ZeRO-1), full recompute.
LLAMA = llama(layers=32, hidden=4096, heads=32, kv=8, ffn=14336, vocab=128256, seq=4096, rope_theta=500000.0)
P_MEGATRON = plan(gpus=64, gpn=8, gbs=128, seq=4096, tp=2, pp=4, vpp=2, mbs=2, recompute="full",
                  sequence_parallel=True, zero=1)
# GPT-3-style model (learned positions, LayerNorm, GELU, biases, tied embeddings, dropout) under FSDP (ZeRO-3), fp16.
GPT = gpt(layers=24, hidden=2048, heads=16, vocab=50257, seq=2048, tied_embeddings=True)
P_FSDP = plan(gpus=16, gpn=8, gbs=256, seq=2048, mbs=4, recompute="selective", zero=3, dtype="fp16")


def _flags(tokens: list[str]) -> dict:
    """['--a', '1', '--b'] -> {'--a': '1', '--b': True}; a repeated flag is an error."""
    out: dict = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("--") and flag not in out, tokens
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[flag] = tokens[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def _megatron(model, p, **kw) -> dict:
    return _flags(shlex.split(export_plan(model, p, HW, predict(model, p, HW), "megatron", **kw), comments=True))


# --------------------------------------------------------------------------------------------- Megatron
def test_megatron_tp_pp_vpp_sp_zero1_llama():
    f = _megatron(LLAMA, P_MEGATRON, iterations=500)
    # Daly's checkpoint interval (planner/checkpointing.py) in steps of the predicted iteration time
    assert f.pop("--save-interval") == str(save_interval(LLAMA, P_MEGATRON, predict(LLAMA, P_MEGATRON, HW))[0])
    assert f == {
        "--tensor-model-parallel-size": "2", "--pipeline-model-parallel-size": "4", "--context-parallel-size": "1",
        "--sequence-parallel": True, "--num-layers-per-virtual-pipeline-stage": "4",  # 32 / (4 * 2)
        "--micro-batch-size": "2", "--global-batch-size": "128", "--seq-length": "4096",
        "--max-position-embeddings": "4096", "--train-iters": "500",
        "--num-layers": "32", "--hidden-size": "4096", "--num-attention-heads": "32",
        "--group-query-attention": True, "--num-query-groups": "8", "--ffn-hidden-size": "14336",
        "--swiglu": True, "--normalization": "RMSNorm", "--position-embedding-type": "rope",
        "--rotary-base": "500000", "--untie-embeddings-and-output-weights": True, "--disable-bias-linear": True,
        "--vocab-size": "128256", "--attention-dropout": "0.0", "--hidden-dropout": "0.0",
        "--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": "1",
        "--use-distributed-optimizer": True, "--overlap-grad-reduce": True, "--overlap-param-gather": True,
        "--bf16": True,
    }


def test_megatron_fsdp_gpt_fp16():
    f = _megatron(GPT, P_FSDP)
    assert int(f.pop("--save-interval")) >= 1
    assert f == {
        "--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1", "--context-parallel-size": "1",
        "--micro-batch-size": "4", "--global-batch-size": "256", "--seq-length": "2048",
        "--max-position-embeddings": "2048", "--num-layers": "24", "--hidden-size": "2048",
        "--num-attention-heads": "16", "--ffn-hidden-size": "8192", "--normalization": "LayerNorm",
        "--position-embedding-type": "learned_absolute", "--vocab-size": "50257",
        "--recompute-granularity": "selective",
        "--use-distributed-optimizer": True, "--use-megatron-fsdp": True,
        "--data-parallel-sharding-strategy": "optim_grads_params", "--no-gradient-accumulation-fusion": True,
        "--ckpt-format": "fsdp_dtensor", "--overlap-grad-reduce": True, "--overlap-param-gather": True,
        "--fp16": True,
    }


def test_megatron_uneven_split_cp_fp8():
    p = plan(gpus=64, gpn=8, gbs=64, seq=4096, tp=2, pp=4, cp=2, mbs=1, layer_split=(9, 7, 7, 9),
             dtype="fp8", recompute="none", zero=0, overlap_param_gather=True)
    f = _megatron(LLAMA, p)
    assert f["--decoder-first-pipeline-num-layers"] == "9" and f["--decoder-last-pipeline-num-layers"] == "9"
    assert f["--context-parallel-size"] == "2" and f["--fp8-format"] == "hybrid" and f["--bf16"] is True
    for absent in ("--recompute-granularity", "--use-distributed-optimizer", "--overlap-param-gather",
                   "--num-layers-per-virtual-pipeline-stage"):
        assert absent not in f
    # unequal middle stages: not expressible with first/last flags -> --pipeline-model-parallel-layout
    p2 = dataclasses.replace(p, layer_split=(10, 8, 7, 7))
    text = export_plan(LLAMA, p2, HW, None, "megatron")
    assert "--decoder-first-pipeline-num-layers" not in shlex.split(text, comments=True)
    assert _megatron(LLAMA, p2)["--pipeline-model-parallel-layout"] == "E,t*10|t*8|t*7|t*7,L"
    # uneven + VPP: validate_args wants --num-virtual-stages-per-pipeline-rank
    p3 = plan(gpus=64, gpn=8, gbs=64, seq=4096, tp=2, pp=4, vpp=2, layer_split=(10, 6, 6, 10))
    f3 = _megatron(LLAMA, p3)
    assert f3["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in f3


# ------------------------------------------------------------------------------------------------ NeMo
def test_nemo_yaml_llama():
    cfg = yaml.safe_load(export_plan(LLAMA, P_MEGATRON, HW, None, "nemo", iterations=500))
    assert cfg["trainer"] == {"num_nodes": 8, "devices": 8, "precision": "bf16-mixed", "max_steps": 500}
    assert cfg["model"] == {
        "micro_batch_size": 2, "global_batch_size": 128, "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2, "context_parallel_size": 1,
        "sequence_parallel": True, "encoder_seq_length": 4096, "max_position_embeddings": 4096, "num_layers": 32,
        "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_query_groups": 8,
        "kv_channels": None, "normalization": "rmsnorm", "bias": False, "share_embeddings_and_output_weights": False,
        "activation": "swiglu", "position_embedding_type": "rope", "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "activations_checkpoint_granularity": "full", "activations_checkpoint_method": "uniform",
        "activations_checkpoint_num_layers": 1, "rotary_base": 500000,
        "optim": {"name": "distributed_fused_adam", "overlap_grad_sync": True, "overlap_param_sync": True},
    }


def test_nemo_yaml_fsdp_gpt():
    cfg = yaml.safe_load(export_plan(GPT, P_FSDP, HW, None, "nemo"))
    assert cfg["trainer"] == {"num_nodes": 2, "devices": 8, "precision": "16-mixed"}
    m = cfg["model"]
    assert m["fsdp"] is True and m["fsdp_sharding_strategy"] == "full" and m["optim"] == {"name": "fused_adam"}
    assert m["virtual_pipeline_model_parallel_size"] is None and m["num_query_groups"] is None
    assert (m["activation"], m["position_embedding_type"], m["normalization"]) == ("gelu", "learned_absolute",
                                                                                  "layernorm")
    assert m["bias"] is True and m["share_embeddings_and_output_weights"] is True and m["sequence_parallel"] is False
    assert "hidden_dropout" not in m  # the model trains with dropout: keep NeMo's own value
    assert (m["activations_checkpoint_granularity"], m["activations_checkpoint_method"]) == ("selective", None)
    assert (m["micro_batch_size"], m["global_batch_size"], m["encoder_seq_length"]) == (4, 256, 2048)


# ------------------------------------------------------------------------------------------ torchtitan
def test_torchtitan_toml_pipeline():
    text = export_plan(LLAMA, P_MEGATRON, HW, None, "torchtitan", iterations=500)
    t = tomllib.loads(text)
    assert t == {
        # LLAMA is Llama 3 8B's architecture: torchtitan's own flavor builds it
        "model": {"name": "llama3", "flavor": "8B"},
        # with PP: local batch = GBS / DP = 128 / 8, cut into micro-batches of MBS
        "training": {"local_batch_size": 16, "global_batch_size": 128, "seq_len": 4096, "steps": 500,
                     "mixed_precision_param": "bfloat16"},
        # torchtitan refuses DDP next to TP/PP ("DDP has not supported > 1D parallelism"): FSDP over the DP ranks
        "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 8,
                        "tensor_parallel_degree": 2, "pipeline_parallel_degree": 4, "context_parallel_degree": 1,
                        "pipeline_parallel_schedule": "Interleaved1F1B", "pipeline_parallel_microbatch_size": 2,
                        "pipeline_parallel_layers_per_stage": 4},
        "activation_checkpoint": {"mode": "full"},
        # the plan is costed as Megatron (fused kernels): compiled, as --framework torchtitan is costed
        "compile": {"enable": True, "components": ["model", "loss"]},
    }
    assert "# NOTE: torchtitan has no ZeRO-1 and runs DDP only without other parallelism" in text
    # torchtitan's llama3 (at the pinned commit) applies Llama 3.1 RoPE scaling, which this Llama 3 model lacks
    assert "# NOTE: rope_scaling: torchtitan's llama3 8B flavor has 'llama3 x8.0'" in text
    assert "predict with --framework torchtitan" in text


def test_torchtitan_compile_follows_the_costed_framework():
    """--framework torchtitan is costed with fused (compiled) element-wise kernels, torchtitan-eager without."""
    for framework, compiled in (("torchtitan", True), ("torchtitan-eager", False)):
        text = export_plan(LLAMA, dataclasses.replace(P_MEGATRON, framework=framework), HW, None, "torchtitan")
        assert tomllib.loads(text)["compile"]["enable"] is compiled
        assert "predict with --framework torchtitan" not in text


def test_torchtitan_toml_fsdp():
    text = export_plan(GPT, P_FSDP, HW, None, "torchtitan")
    t = tomllib.loads(text)
    assert t == {
        "model": {"name": "llama3", "flavor": GPT.name},  # no flavor is GPT-3 style: named for the user to register
        # without PP: local batch = MBS, gradient accumulation = 256 / (4 * 16) = 4 steps
        "training": {"local_batch_size": 4, "global_batch_size": 256, "seq_len": 2048},
        "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 16,
                        "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "context_parallel_degree": 1},
        "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"},
        "compile": {"enable": True, "components": ["model", "loss"]},
    }
    assert "fp16" in text  # the unsupported fp16 is named in a comment
    fp8 = tomllib.loads(export_plan(LLAMA, dataclasses.replace(P_MEGATRON, dtype="fp8"), HW, None, "torchtitan"))
    assert fp8["model"]["converters"] == ["quantize.linear.float8"]  # torchtitan/components/quantization/float8.py


# ----------------------------------------------------------------------------------------------- Slurm
def _slurm(text: str) -> tuple[dict, list[str]]:
    sbatch = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            sbatch[key] = value
    cmd = text[text.index("\nsrun ") + 1:].replace("\\\n", " ")
    return sbatch, shlex.split(cmd, comments=True)


def test_slurm_time_arithmetic():
    assert format_slurm_time(2500) == "0-00:41:40"
    assert format_slurm_time(90061) == "1-01:01:01"
    # 1000 iterations x 2.0 s x 1.25 = 2500 s (0-00:41:40) + the 600 s start-up allowance = 3100 s
    assert STARTUP_ALLOWANCE_S == 600
    assert slurm_time_seconds(1000, 2.0, 1.25) == 3100
    assert format_slurm_time(slurm_time_seconds(1000, 2.0, 1.25)) == "0-00:51:40"
    assert slurm_time_seconds(3, 1.0001, 1.0, startup_s=0) == 4  # rounded up, never cut short


def test_slurm_script():
    pred = dataclasses.replace(predict(LLAMA, P_MEGATRON, HW), iteration_time_s=2.0, iteration_time_high_s=None)
    text = export_plan(LLAMA, P_MEGATRON, HW, pred, "slurm", iterations=1000, margin=1.25, job_name="llama-run",
                       cpus_per_task=96)
    assert text.startswith("#!/bin/bash\n")
    sbatch, argv = _slurm(text)
    assert sbatch == {"--job-name": "llama-run", "--nodes": "8", "--ntasks-per-node": "1", "--gpus-per-node": "8",
                      "--cpus-per-task": "96", "--time": "0-00:51:40"}
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text  # TP > 1 without FSDP
    i = argv.index("pretrain_gpt.py")
    assert argv[:i] == ["srun", "torchrun", "--nnodes", "$SLURM_NNODES", "--nproc-per-node", "8", "--rdzv-id",
                        "$SLURM_JOB_ID", "--rdzv-backend", "c10d", "--rdzv-endpoint", "$head_node:29500"]
    flags, same = _flags(argv[i + 1:]), _megatron(LLAMA, P_MEGATRON, iterations=1000)
    assert flags.pop("--save-interval") == str(save_interval(LLAMA, P_MEGATRON, pred)[0])  # at 2.0 s per step
    same.pop("--save-interval")
    assert flags == same
    # the limit comes from the header's iteration time; an interval beyond the margin is a warning, not a silent
    # change of the time per iteration
    wide = dataclasses.replace(pred, iteration_time_high_s=3.0)
    text = export_plan(LLAMA, P_MEGATRON, HW, wide, "slurm", iterations=1000)
    sbatch, _ = _slurm(text)
    assert sbatch["--time"] == "0-00:51:40" and "# Predicted iteration time 2 s" in text
    assert "1000 iterations x 2 s (the predicted iteration time above) x margin 1.25 (+25 %" in text
    assert "# WARNING: the prediction interval reaches 3 s per iteration, beyond margin 1.25; pass --margin 1.5" in text
    narrow = dataclasses.replace(pred, iteration_time_high_s=2.2)
    assert "upper end, 2.2 s per iteration, lies inside the margin" in export_plan(
        LLAMA, P_MEGATRON, HW, narrow, "slurm", iterations=1000)


def test_slurm_fsdp_and_missing_run_length():
    pred = predict(GPT, P_FSDP, HW)
    text = export_plan(GPT, P_FSDP, HW, pred, "slurm", iterations=10)
    sbatch, argv = _slurm(text)
    assert sbatch["--nodes"] == "2" and "--cpus-per-task" not in sbatch
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in text
    assert _flags(argv[argv.index("pretrain_gpt.py") + 1:])["--use-megatron-fsdp"] is True
    with pytest.raises(PlannerError, match="--iterations"):
        export_plan(GPT, P_FSDP, HW, pred, "slurm")
    whole = export_plan(GPT, P_FSDP, HW, pred, "all")  # all: Slurm part without --time, and says why
    assert "#SBATCH --time" not in whole and "--time not set" in whole
    assert all(f"==== {n} ====" in whole for n in ("megatron", "nemo", "torchtitan", "slurm"))


@pytest.mark.parametrize("kw,needle", [
    (dict(fmt="docx"), "docx"),
    (dict(fmt="megatron", iterations=-5), "iterations=-5"),
    (dict(fmt="megatron", iterations=0), "iterations=0"),
    (dict(fmt="slurm", iterations=10, margin=0.5), "margin"),
    (dict(fmt="slurm", iterations=10, job_name="two words"), "job name"),
])
def test_export_plan_bad_input(kw, needle):
    with pytest.raises(PlannerError, match=needle):
        export_plan(GPT, P_FSDP, HW, None, **kw)


def test_iterations_for_tokens():
    assert iterations_for_tokens(1e9, P_FSDP) == math.ceil(1e9 / (256 * 2048))
    with pytest.raises(PlannerError):
        iterations_for_tokens(-1.0, P_FSDP)


# ------------------------------------------------------------------------------------------------- CLI
BASE = ["export", "--model", "llama-13b", "--gpu", "a100-80gb", "--gpus", "64", "--tp", "2", "--pp", "4",
        "--gbs", "256"]


def test_cli_export_stdout_and_out_file(tmp_path):
    res = runner.invoke(app, [*BASE, "--to", "megatron", "--tokens", "1e9"])
    assert res.exit_code == 0, res.output
    f = _flags(shlex.split(res.stdout, comments=True))
    assert f["--tensor-model-parallel-size"] == "2" and f["--num-layers"] == "40" and f["--global-batch-size"] == "256"
    assert f["--train-iters"] == str(math.ceil(1e9 / (256 * 4096)))  # llama-13b preset: seq 4096
    out = tmp_path / "job.sbatch"
    res = runner.invoke(app, [*BASE, "--to", "slurm", "--iterations", "100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    sbatch, _ = _slurm(out.read_text())
    assert sbatch["--nodes"] == "8" and sbatch["--time"].startswith("0-")
    assert os.listdir(tmp_path) == ["job.sbatch"]  # the temporary file was renamed, not left behind
    res = runner.invoke(app, [*BASE, "--to", "nemo"])
    assert yaml.safe_load(res.stdout)["model"]["tensor_model_parallel_size"] == 2


@pytest.mark.parametrize("args,needle", [
    (["--to", "docx"], "docx"),
    (["--iterations", "-5"], "-5"),
    (["--iterations", "0"], "--iterations"),
    (["--tokens", "-1e9"], "--tokens"),
    (["--iterations", "10", "--tokens", "1e9"], "not both"),
    (["--to", "slurm"], "--iterations"),
    (["--margin", "0.5", "--iterations", "10"], "margin"),
    (["--tp", "3"], "TP=3"),
])
def test_cli_export_bad_input_exit_2_one_line(args, needle):
    res = runner.invoke(app, [*BASE, *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err


def test_cli_export_unwritable_out(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    res = runner.invoke(app, [*BASE, "--to", "megatron", "--out", str(blocker / "x.args")])
    assert res.exit_code == 2 and "cannot write" in res.stderr


def test_cli_export_all_into_directory(tmp_path):
    """--to all --out DIR: one file per target, each readable by its own parser; --tokens takes 1T like size."""
    out = tmp_path / "job"
    res = runner.invoke(app, [*BASE, "--to", "all", "--tokens", "1T", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(out)) == ["megatron.args", "nemo.yaml", "slurm.sbatch", "torchtitan.toml"]
    iters = str(math.ceil(1e12 / (256 * 4096)))
    assert _flags(shlex.split((out / "megatron.args").read_text(), comments=True))["--train-iters"] == iters
    assert yaml.safe_load((out / "nemo.yaml").read_text())["trainer"]["max_steps"] == int(iters)
    assert tomllib.loads((out / "torchtitan.toml").read_text())["training"]["steps"] == int(iters)
    sbatch, argv = _slurm((out / "slurm.sbatch").read_text())
    assert "--time" in sbatch and _flags(argv[argv.index("pretrain_gpt.py") + 1:])["--train-iters"] == iters


@pytest.mark.parametrize("name", ["plan.txt", "existing"])
def test_cli_export_all_refuses_a_file(tmp_path, name):
    target = tmp_path / name
    if name == "existing":
        target.write_text("a file")
    res = runner.invoke(app, [*BASE, "--to", "all", "--out", str(target)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "pass a directory" in lines[0], res.stderr


def test_cli_export_walltime_warning():
    """A run longer than --max-walltime (default 7 days) warns on stderr and in the script, naming the fix."""
    res = runner.invoke(app, [*BASE, "--to", "slurm", "--tokens", "2T"])
    assert res.exit_code == 0, res.output
    assert "exceeds the 7-00:00:00 walltime limit (--max-walltime)" in res.stderr
    assert "# WARNING: --time" in res.stdout and "chained jobs of --iterations" in res.stdout
    quiet = runner.invoke(app, [*BASE, "--to", "slurm", "--tokens", "1e9", "--max-walltime", "48h"])
    assert quiet.exit_code == 0 and "walltime" not in quiet.stderr
    bad = runner.invoke(app, [*BASE, "--to", "slurm", "--tokens", "1e9", "--max-walltime", "soon"])
    assert bad.exit_code == 2 and "--max-walltime 'soon'" in bad.stderr


def test_predict_json_plan_and_explain_take_the_layer_split():
    """The JSON plan carries layer_split, and explain accepts --layer-split (issue 16)."""
    args = ["--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "24", "--pp", "3", "--layer-split", "12,10,10"]
    res = runner.invoke(app, ["predict", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["plan"]["layer_split"] == [12, 10, 10]
    res = runner.invoke(app, ["explain", *args, "--format", "json"])
    assert res.exit_code == 0, res.output
