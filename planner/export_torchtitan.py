"""torchtitan job config (TOML) for one plan: keys of torchtitan/config/job_config.py (pytorch/torchtitan,
commit 028a455c1e3c; dataclasses Model, Training, Parallelism, ActivationCheckpoint, Compile, Debug), the model
name and flavor from torchtitan's own model registry (:mod:`planner.export_titan_models`).

torchtitan facts this export relies on (same commit): data parallelism without sharding is DDP, which
``parallelize_llama`` / ``parallelize_deepseekv3`` / ``parallelize_qwen3`` refuse next to any other parallelism
("DDP has not supported > 1D parallelism"); ``[compile] enable`` (default false) compiles ``components`` (default
model and loss); a model whose TrainSpec has no ``pipelining_fn`` (qwen3) stops when PP > 1 ("does not support
pipelining", train.py); ``[debug] moe_force_load_balance`` routes tokens round-robin."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from costmodel.core.errors import PlannerError
from costmodel.core.specs.framework import get_framework
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from planner.checkpointing import save_interval
from planner.export_arch import Architecture, architecture, header, is_uneven, note_lines
from planner.export_memory import torchtitan_memory_keys
from planner.export_moe import torchtitan_moe
from planner.export_titan_models import TORCHTITAN_COMMIT, match, moe_refusal

if TYPE_CHECKING:  # planner.prediction pulls in the cost model; exports only read a finished Prediction
    from planner.prediction import Prediction


def llama3_unsupported(model: ModelSpec, arch: Architecture) -> list[str]:
    """Architecture features torchtitan's dense models (llama3, qwen3: RMSNorm, RoPE, SwiGLU, no bias) lack."""
    out = []
    if model.activation != "swiglu" or arch.gate is not None:
        out.append(f"activation {arch.gate or model.activation} (torchtitan's models use SwiGLU)")
    if model.norm != "rmsnorm":
        out.append(f"norm: {model.norm} (torchtitan's models use RMSNorm)")
    if model.position_embedding != "rope":
        out.append(f"position_embedding: {model.position_embedding} (torchtitan's models use RoPE)")
    if model.linear_bias or arch.qkv_bias:
        out.append("linear_bias: linear-layer biases (torchtitan's models have none)")
    if arch.sliding_window is not None:
        out.append(f"sliding_window: {arch.sliding_window} tokens")
    if arch.rotary_percent is not None:
        out.append(f"rotary_pct: partial rotary embeddings ({arch.rotary_percent:g} of each head)")
    if model.attention_sinks:
        out.append("attention_sinks: learned attention sinks")
    if model.dropout:
        out.append("dropout: torchtitan's models have no dropout")
    return out + [n for n in arch.notes if n.startswith((
        "use_parallel_residual", "embedding_layernorm", "clip_qkv", "parallel_attention", "norms_per_layer",
        "attn_logit_softcap", "final_logit_softcap", "scale_embeddings", "query_pre_attn_scalar"))]


def refusal(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why torchtitan cannot train this model with this plan (one line), or None."""
    arch = architecture(model)
    why = moe_refusal(model, arch)
    if why is None and plan.pp > 1 and match(model, arch)[0] == "qwen3":
        why = (f"torchtitan's qwen3 (commit {TORCHTITAN_COMMIT}) has no pipeline support (TrainSpec pipelining_fn="
               f"None); the plan has PP={plan.pp}: export it --to megatron, or plan with --pp 1")
    return why


def _model_section(model: ModelSpec, plan: ParallelPlan, notes: list[str]) -> dict:
    arch = architecture(model)
    name, flavor, flavor_notes = match(model, arch)
    notes += flavor_notes
    section: dict = {"name": name, "flavor": flavor or model.name}
    if flavor is None:
        missing = llama3_unsupported(model, arch)
        if missing:
            notes.append(f"torchtitan's {name} model cannot build " + "; ".join(missing))
        notes.append(f"no torchtitan {name} flavor is this model: register flavor {model.name!r} with the "
                     f"architecture above in torchtitan/models/{name}/__init__.py; until then torchtitan stops on the "
                     "unknown flavor")
    if plan.dtype == "fp8":
        section["converters"] = ["quantize.linear.float8"]  # torchtitan/components/quantization/float8.py
    if plan.dtype == "fp8-block":
        notes.append("block-scaled FP8 is not written: torchtitan's MX converter (quantize.linear.mx, Blackwell) is "
                     "configured per version; add it to [model] converters")
    return section


def _data_parallel(plan: ParallelPlan, notes: list[str]) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree)."""
    if plan.zero == 3:
        return 1, plan.dp
    if plan.dp > 1 and (plan.tp > 1 or plan.pp > 1 or plan.cp > 1 or plan.ep > 1):
        notes.append(f"torchtitan has no ZeRO-{plan.zero} and runs DDP only without other parallelism (\"DDP has "
                     "not supported > 1D parallelism\"): the export shards with FSDP; predict with --zero 3 to cost it")
        return 1, plan.dp
    if plan.zero > 0 and plan.dp > 1:
        notes.append(f"torchtitan has no ZeRO-{plan.zero}: data parallelism is DDP (full optimizer states per GPU, "
                     "more memory than planned) unless you switch to FSDP (data_parallel_shard_degree)")
    return plan.dp, 1


def _parallelism(model: ModelSpec, plan: ParallelPlan, notes: list[str]) -> dict:
    replicate, shard = _data_parallel(plan, notes)
    par = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
           "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
           "context_parallel_degree": plan.cp}
    moe_keys, moe_notes = torchtitan_moe(model, plan, shard)
    par.update(moe_keys)
    notes += moe_notes
    if plan.tp > 1 and not plan.sequence_parallel:
        notes.append("torchtitan's tensor parallelism always shards the sequence (sequence parallel) in norms")
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = plan.mbs
        if is_uneven(plan):
            par["module_fqns_per_model_part"] = torchtitan_model_parts(plan)
        elif plan.vpp > 1:
            par["pipeline_parallel_layers_per_stage"] = model.num_layers // (plan.pp * plan.vpp)
            notes.append("torchtitan versions that count the embedding/output as pipeline layers need those "
                         "weights set to 0 to get exactly PP x VPP stages")
    return par


def _compile(plan: ParallelPlan, notes: list[str]) -> dict:
    """``[compile]`` as the framework the prediction costed: torchtitan's element-wise kernels are costed compiled
    (fused), torchtitan-eager's as PyTorch eager chains (costmodel.core.specs.framework)."""
    framework = get_framework(plan.framework)
    if not plan.framework.startswith("torchtitan"):
        notes.append(f"the prediction costs the {plan.framework} stack; predict with --framework torchtitan (compiled)"
                     " or torchtitan-eager to cost this config")
    return {"enable": framework.compiled, "components": ["model", "loss"]} if framework.compiled else \
        {"enable": False}


def torchtitan_config(model: ModelSpec, plan: ParallelPlan, iterations: int | None = None) -> tuple[dict, list[str]]:
    """torchtitan job-config sections (torchtitan/config/job_config.py) and notes; PlannerError when torchtitan
    cannot train the model with this plan (:func:`refusal`)."""
    why = refusal(model, plan)
    if why is not None:
        raise PlannerError(why)
    notes: list[str] = []
    par = _parallelism(model, plan, notes)
    par.update(torchtitan_memory_keys(plan))  # planner.export_memory
    # with PP, local_batch_size is split into micro-batches of pipeline_parallel_microbatch_size; without PP,
    # gradient accumulation steps = global_batch_size / (local_batch_size x DP)
    local = plan.gbs // plan.dp if plan.pp > 1 else plan.mbs
    training: dict = {"local_batch_size": local, "global_batch_size": plan.gbs,
                      "seq_len": plan.seq_len}
    if iterations is not None:
        training["steps"] = iterations
    if plan.dtype == "fp16":
        notes.append("torchtitan's mixed_precision_param offers bfloat16 or float32 only, not fp16")
    else:
        training["mixed_precision_param"] = "bfloat16"
    ac: dict = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac["selective_ac_option"] = "op"  # per-operator selective recompute (ActivationCheckpoint docstring)
    sections: dict = {"model": _model_section(model, plan, notes), "training": training, "parallelism": par,
                      "activation_checkpoint": ac, "compile": _compile(plan, notes)}
    if model.is_moe and plan.moe_imbalance == 1.0:  # balanced routing asked for: torchtitan's benchmarking switch
        sections["debug"] = {"moe_force_load_balance": True}
    return sections, notes


def torchtitan_model_parts(plan: ParallelPlan) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` (torchtitan/config/job_config.py, Parallelism: "a list of
    lists containing the FQNs of modules for each model chunk", e.g. [['tok_embeddings', 'layers.0'], ...]) for
    the plan's split, chunks in virtual-stage order (chunk a of rank b is stage a*PP + b, torchtitan's looped
    stage assignment); module names of torchtitan's models (tok_embeddings, layers.N, norm, output)."""
    chunks = plan.chunk_layers(sum(plan.layer_split or ()))  # the plan's pipeline_layout when it has one
    parts = []
    pos = 0
    for a in range(plan.vpp):
        for b in range(plan.pp):
            part = [f"layers.{i}" for i in range(pos, pos + chunks[a][b])]
            pos += chunks[a][b]
            if a == 0 and b == 0:
                part.insert(0, "tok_embeddings")
            if a == plan.vpp - 1 and b == plan.pp - 1:
                part += ["norm", "output"]
            parts.append(part)
    return parts


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string of ASCII text is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def dump_toml(sections: dict) -> str:
    """Tables of scalars / lists (all torchtitan needs); read back with tomllib."""
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


def export_torchtitan(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None",
                      iterations: int | None = None) -> str:
    sections, notes = torchtitan_config(model, plan, iterations)
    if (ckpt := save_interval(model, plan, prediction)) is not None:  # job_config.py Checkpoint.interval (steps)
        sections["checkpoint"], notes = {"enable": True, "interval": ckpt[0]}, notes + [ckpt[1]]
    lines = header("torchtitan job config", model, plan, hardware, prediction)
    lines.append(f"# Keys checked against pytorch/torchtitan torchtitan/config/job_config.py (commit "
                 f"{TORCHTITAN_COMMIT}); set the dataset and tokenizer ([model] hf_assets_path) yourself.")
    lines += note_lines(notes)
    return "\n".join(lines) + "\n" + dump_toml(sections)
