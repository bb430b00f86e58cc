"""torchtitan job config (TOML) for one plan: keys of torchtitan/config/job_config.py (pytorch/torchtitan,
commit 6404b932421f; dataclasses Model, Training, Parallelism, ActivationCheckpoint), the model flavor from
torchtitan/models/llama3/__init__.py (llama3_configs)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan
from planner.checkpointing import save_interval
from planner.export_arch import architecture, header, is_uneven, torchtitan_flavor, torchtitan_unsupported
from planner.export_moe import torchtitan_moe

if TYPE_CHECKING:  # planner.predict pulls in the cost model; exports only read a finished Prediction
    from planner.predict import Prediction


# ---------------------------------------------------------------------------------------- torchtitan
def torchtitan_config(model: ModelSpec, plan: ParallelPlan, iterations: int | None = None) -> tuple[dict, list[str]]:
    """torchtitan job-config sections (torchtitan/config/job_config.py) and notes."""
    notes: list[str] = []
    fsdp = plan.zero == 3
    if 0 < plan.zero < 3:
        notes.append(f"torchtitan has no ZeRO-{plan.zero}: data parallelism is DDP (full optimizer states per GPU, "
                     "more memory than planned) unless you switch to FSDP (data_parallel_shard_degree)")
    par = {
        "data_parallel_replicate_degree": 1 if fsdp else plan.dp,
        "data_parallel_shard_degree": plan.dp if fsdp else 1,
        "tensor_parallel_degree": plan.tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
    }
    moe_keys, moe_notes = torchtitan_moe(model, plan, par["data_parallel_shard_degree"])
    par.update(moe_keys)
    notes += moe_notes
    if plan.tp > 1 and not plan.sequence_parallel:
        notes.append("torchtitan's tensor parallelism always shards the sequence (sequence parallel) in norms")
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch_size
        if is_uneven(plan):
            par["module_fqns_per_model_part"] = torchtitan_model_parts(plan)
        elif plan.vpp > 1:
            par["pipeline_parallel_layers_per_stage"] = model.num_layers // (plan.pp * plan.vpp)
            notes.append("torchtitan versions that count the embedding/output as pipeline layers need those "
                         "weights set to 0 to get exactly PP x VPP stages")
        # with PP, local_batch_size is split into micro-batches of pipeline_parallel_microbatch_size
        local = plan.global_batch_size // plan.dp
    else:
        # without PP, gradient accumulation steps = global_batch_size / (local_batch_size x DP)
        local = plan.micro_batch_size
    training: dict = {"local_batch_size": local, "global_batch_size": plan.global_batch_size,
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
    # torchtitan builds the architecture from [model] name + flavor (torchtitan/models/llama3/__init__.py,
    # llama3_configs); without a flavor it trains its tiny default "debugmodel"
    arch = architecture(model)
    flavor = torchtitan_flavor(model, arch)
    model_sec: dict = {"name": "llama3", "flavor": flavor or model.name}
    if flavor is None:
        missing = torchtitan_unsupported(model, arch)
        if missing:
            notes.append("torchtitan's llama3 model cannot build " + "; ".join(missing))
        notes.append(f"no torchtitan llama3 flavor (8B, 70B, 405B) is this model: register flavor {model.name!r} "
                     "with the architecture above in torchtitan/models/llama3/__init__.py; until then torchtitan "
                     "stops on the unknown flavor")
    if plan.dtype == "fp8":
        model_sec["converters"] = ["float8"]
    if plan.dtype == "fp8-block":
        notes.append("block-scaled FP8 is not written: torchtitan's MXFP8 converter (torchtitan/components/"
                     "quantization/mxfp8.md, Blackwell) is configured per version; add it to [model] converters")
    sections: dict = {"model": model_sec}
    sections.update({"training": training, "parallelism": par, "activation_checkpoint": ac})
    return sections, notes


def torchtitan_model_parts(plan: ParallelPlan) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` (torchtitan/config/job_config.py, Parallelism: "a list of
    lists containing the FQNs of modules for each model chunk", e.g. [['tok_embeddings', 'layers.0'], ...]) for
    the plan's split, chunks in virtual-stage order (chunk a of rank b is stage a*PP + b, torchtitan's looped
    stage assignment); module names of torchtitan's Llama (tok_embeddings, layers.N, norm, output)."""
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
        sections["checkpoint"], notes = {"enable_checkpoint": True, "interval": ckpt[0]}, notes + [ckpt[1]]
    lines = header("torchtitan job config", model, plan, hardware, prediction)
    lines.append("# Keys checked against pytorch/torchtitan torchtitan/config/job_config.py; set the dataset "
                 "and tokenizer yourself.")
    lines += [f"# NOTE: {n}." for n in notes]
    return "\n".join(lines) + "\n" + dump_toml(sections)
