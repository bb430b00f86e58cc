"""Turn one plan into launcher settings: Megatron-LM flags, a NeMo YAML fragment, torchtitan TOML, Slurm.

Every flag and key name below was checked against the launcher's own source (cited next to each
format); what a launcher cannot express is written as a comment in the output, never guessed.
Sources:

* Megatron-LM: ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM, commit 000c4ac24f61), functions
  ``_add_network_size_args``, ``_add_training_args``, ``_add_distributed_args``,
  ``_add_mixed_precision_args``, ``_add_transformer_engine_args``, ``_add_data_args``,
  ``_add_regularization_args`` and ``validate_args``; Megatron-FSDP flags from
  ``examples/megatron_fsdp/README.md`` and the Megatron-FSDP user guide ("Required Configurations").
* NeMo: ``launcher_scripts/conf/training/llama/llama3_1_70b.yaml`` (NVIDIA/NeMo-Framework-Launcher, a
  full megatron_gpt config with context_parallel_size / num_query_groups / distributed_fused_adam);
  FSDP keys from NeMo ``examples/nlp/language_modeling/tuning/conf/megatron_gpt_finetuning_config.yaml``;
  precision strings from NeMo ``nemo/collections/nlp/parts/megatron_trainer_builder.py``
  (``precision in [16, '16', 'bf16', '16-mixed', 'bf16-mixed']``).
* torchtitan: ``torchtitan/config/job_config.py`` (pytorch/torchtitan, commit 028a455c1e3c), dataclasses
  ``Training``, ``Parallelism``, ``ActivationCheckpoint``, ``Model``, ``Compile``, ``Debug``; its model registry
  (:mod:`planner.export_titan_models`).
* torchrun: ``torch/distributed/run.py`` (``--nproc-per-node``, ``--rdzv-backend``, ``--rdzv-endpoint``,
  ``--rdzv-id``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from typing import TYPE_CHECKING

import yaml

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan, account_for
from costmodel.cost import fp8_block
from planner.checkpointing import save_interval
from planner.export_arch import architecture, header, is_uneven, note_lines
from planner.export_megatron import megatron_arch_args, nemo_arch_keys
from planner.export_memory import megatron_memory_args, nemo_memory_keys
from planner.export_moe import megatron_mla_args, megatron_moe_args, megatron_router_args, nemo_moe_keys
from planner.export_torchtitan import dump_toml, export_torchtitan, torchtitan_config, torchtitan_model_parts
from planner.export_torchtitan import refusal as torchtitan_refusal

__all__ = ["FORMATS", "TARGET_FILES", "arg_lines", "dump_toml", "export_plan", "export_targets", "join_targets",
           "megatron_args", "nemo_config", "skipped_targets", "torchtitan_config", "torchtitan_model_parts"]

if TYPE_CHECKING:  # planner.prediction pulls in the cost model; exports only read a finished Prediction
    from planner.prediction import Prediction

FORMATS = ("megatron", "nemo", "torchtitan", "slurm", "all")
TARGET_FILES = {"megatron": "megatron.args", "nemo": "nemo.yaml", "torchtitan": "torchtitan.toml",
                "slurm": "slurm.sbatch"}
"""File written per target by ``planner export --to all --out DIR``."""

STARTUP_ALLOWANCE_S = 600
"""Time added to a Slurm limit for launch, NCCL set-up and checkpoint load/save: 10 minutes, the 5 + 5
minutes NVIDIA's MLPerf Training v5.1 NeMo configs add to one run's time
(``WALLTIME=$((5 + NEXP * (WALLTIME_RUNANDTIME + 5)))``, mlcommons/training_results_v5.1
NVIDIA/benchmarks/llama31_405b/implementations/theia_ngpu512_ngc25.09_nemo/config_DGXB200_64x8x144xtp4pp8cp2_cg.sh)."""

DEFAULT_MAX_WALLTIME_S = 7 * 86400
"""Walltime past which the Slurm export warns: 168 h, the longest queue limit on the DoD HPCMP ERDC Carpenter
system (its long-walltime ``*_lw`` queues; its standard queues allow 24 h; https://erdc.hpc.mil/docs/queueSummary.html).
Partitions differ: your site's MaxTime (``scontrol show partition``) goes to ``--max-walltime``."""

RDZV_PORT = 29500
"""torchrun rendezvous port; 29500 is torch.distributed's default master port (torch/distributed/run.py)."""

_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


# ------------------------------------------------------------------------------------------ helpers
def slurm_time_seconds(iterations: int, iteration_time_s: float, margin: float,
                       startup_s: float = STARTUP_ALLOWANCE_S) -> int:
    """Slurm limit in whole seconds: iterations x iteration time x margin + start-up allowance, rounded up."""
    return math.ceil(iterations * iteration_time_s * margin + startup_s)


def slurm_budget(iterations: int, prediction: "Prediction", margin: float, startup_s: float = STARTUP_ALLOWANCE_S,
                 max_walltime_s: float = DEFAULT_MAX_WALLTIME_S) -> tuple[int, list[str], list[str]]:
    """The Slurm limit (s) from the header's predicted iteration time, the comment lines that explain it, and
    warnings (prediction interval wider than the margin, limit past ``max_walltime_s``)."""
    t = prediction.iteration_time_s
    limit = slurm_time_seconds(iterations, t, margin, startup_s)
    lines = [f"# --time = {iterations} iterations x {t:.4g} s (the predicted iteration time above) x margin {margin:g} "
             f"(+{(margin - 1) * 100:.3g} % for prediction error and slow steps) + {startup_s:g} s start-up allowance "
             "(launch, NCCL set-up, checkpoint load/save; the 5 + 5 min of MLPerf v5.1 NVIDIA NeMo configs), "
             "rounded up to a second."]
    warnings = []
    high = prediction.iteration_time_high_s
    if high is not None and high > t * margin:
        need = math.ceil(high / t * 100) / 100
        warnings.append(f"the prediction interval reaches {high:.4g} s per iteration, beyond margin {margin:g}; "
                        f"pass --margin {need:g} to cover it")
    elif high is not None and high > t:
        lines.append(f"# The prediction interval's upper end, {high:.4g} s per iteration, lies inside the margin.")
    if limit > max_walltime_s:
        per_job = max(1, math.floor((max_walltime_s - startup_s) / (t * margin)))
        warnings.append(f"--time {format_slurm_time(limit)} exceeds the {format_slurm_time(int(max_walltime_s))} "
                        f"walltime limit (--max-walltime) that partitions commonly enforce; run chained jobs of "
                        f"--iterations {per_job} that resume from checkpoints (sbatch --dependency=afterok), or set "
                        "--max-walltime to your partition's MaxTime (scontrol show partition)")
    return limit, lines, warnings


def format_slurm_time(seconds: int) -> str:
    """Seconds -> Slurm's ``days-hours:minutes:seconds`` (e.g. 3100 -> ``0-00:51:40``)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def iterations_for_tokens(tokens: float, plan: ParallelPlan) -> int:
    """Optimizer steps needed to consume ``tokens`` (GBS x seq_len tokens per step), rounded up."""
    if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens > 0):
        raise PlannerError(f"tokens={tokens!r} must be a positive number, e.g. --tokens 1e12")
    return math.ceil(tokens / plan.tokens_per_iteration)


def _uneven_first_last(split: tuple[int, ...]) -> tuple[int, int] | None:
    """(first, last) when Megatron's first/last-stage flags express the split (middle stages equal)."""
    middle = split[1:-1]
    if len(split) >= 2 and len(set(middle)) <= 1:
        return split[0], split[-1]
    return None


def megatron_layout(plan: ParallelPlan) -> str:
    """The plan's split as Megatron-Core's --pipeline-model-parallel-layout string: stages separated by '|',
    virtual stage a of pipeline rank b at position a*PP + b, 'E' the embedding, 't' a decoder layer, 'L' the
    loss, 't*n' n layers, commas cosmetic (PipelineParallelLayerLayout docstring and parse_str_to_list,
    NVIDIA/Megatron-LM megatron/core/transformer/pipeline_parallel_layer_layout.py). Each stage's layers are
    split over its VPP chunks as :func:`costmodel.core.specs.plan.chunk_layers` says, or as the plan's
    ``pipeline_layout`` gives them."""
    stages = []
    chunks = plan.chunk_layers(sum(plan.layer_split or ()))
    for a in range(plan.vpp):
        for b in range(plan.pp):
            part = f"t*{chunks[a][b]}"
            if a == 0 and b == 0:
                part = "E," + part
            if a == plan.vpp - 1 and b == plan.pp - 1:
                part += ",L"
            stages.append(part)
    return "|".join(stages)


# --------------------------------------------------------------------------------------- Megatron-LM
Pairs = list[tuple[str, object]]


def _pipeline_args(model: ModelSpec, plan: ParallelPlan) -> Pairs:
    """Uneven splits, interleaving and the micro-batch group (_add_distributed_args, validate_args)."""
    out: Pairs = []
    uneven = is_uneven(plan)
    layout = plan.pipeline_layout is not None
    flags = account_for(plan.layer_split, plan.vpp) if uneven and not layout else None
    if layout:  # layers per virtual stage: only the layout expresses them (it also sets VPP: validate_args)
        out.append(("--pipeline-model-parallel-layout", megatron_layout(plan)))
    elif flags is not None and any(n % plan.vpp for n in plan.layer_split):
        # chunks of a stage differ in size: only the account-for options build this split
        if flags[0]:
            out.append(("--account-for-embedding-in-pipeline-split", None))
        if flags[1]:
            out.append(("--account-for-loss-in-pipeline-split", None))
    elif uneven:
        fl = _uneven_first_last(plan.layer_split)
        if fl is not None:
            out += [("--decoder-first-pipeline-num-layers", fl[0]), ("--decoder-last-pipeline-num-layers", fl[1])]
        else:  # unequal middle stages: only the layout expresses them (it also sets VPP: validate_args)
            out.append(("--pipeline-model-parallel-layout", megatron_layout(plan)))
    if plan.vpp > 1 and not layout and not (uneven and _uneven_first_last(plan.layer_split) is None):
        if uneven:  # validate_args: uneven PP needs --num-virtual-stages-per-pipeline-rank
            out.append(("--num-virtual-stages-per-pipeline-rank", plan.vpp))
        else:
            out.append(("--num-layers-per-virtual-pipeline-stage", model.num_layers // (plan.pp * plan.vpp)))
    if plan.vpp > 1 and plan.vpp_microbatch_group not in (None, plan.pp):
        # micro-batches not a multiple of PP: Megatron-Core's default group (PP) is refused (schedules.py)
        out.append(("--microbatch-group-size-per-virtual-pipeline-stage", plan.vpp_microbatch_group))
    return out


def _training_args(model: ModelSpec, plan: ParallelPlan, iterations: int | None) -> Pairs:
    """Batch, sequence, recomputation (_add_training_args; selective takes no --recompute-method, validate_args)."""
    out: Pairs = [("--micro-batch-size", plan.mbs), ("--global-batch-size", plan.gbs),
                  ("--seq-length", plan.seq_len), ("--max-position-embeddings", max(model.max_seq_len, plan.seq_len))]
    if iterations is not None:
        out.append(("--train-iters", iterations))
    if plan.recompute == "full":
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif plan.recompute == "selective":
        out.append(("--recompute-granularity", "selective"))
        if plan.recompute_modules:  # _add_training_args --recompute-modules (nargs='*'; default core_attn)
            out.append(("--recompute-modules", list(plan.recompute_modules)))
    return out


def _sharding_args(plan: ParallelPlan) -> Pairs:
    """ZeRO-1 = distributed optimizer; ZeRO-2/3 = Megatron-FSDP, whose required flags are --use-megatron-fsdp,
    --data-parallel-sharding-strategy, --no-gradient-accumulation-fusion, --use-distributed-optimizer,
    --ckpt-format fsdp_dtensor (Megatron-FSDP user guide)."""
    out: Pairs = []
    if plan.zero >= 1:
        out.append(("--use-distributed-optimizer", None))
    if plan.zero >= 2:
        out += [("--use-megatron-fsdp", None),
                ("--data-parallel-sharding-strategy", "optim_grads" if plan.zero == 2 else "optim_grads_params"),
                ("--no-gradient-accumulation-fusion", None), ("--ckpt-format", "fsdp_dtensor")]
    if plan.overlap_grad_reduce:
        out.append(("--overlap-grad-reduce", None))
    # validate_args: --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce
    if plan.overlap_param_gather and plan.zero >= 1 and plan.overlap_grad_reduce:
        out.append(("--overlap-param-gather", None))
    if plan.tp_comm_overlap and plan.sp:  # validate_args: --tp-comm-overlap needs SP (plan.sp: TP > 1)
        out.append(("--tp-comm-overlap", None))
    return out


def _kernel_args(plan: ParallelPlan) -> Pairs:
    """CUDA graphs and the single-kernel loss (TransformerConfig.cuda_graph_impl, cross_entropy_loss_fusion with
    cross_entropy_fusion_impl 'te', Transformer Engine's Triton cross entropy: megatron/core/transformer/
    transformer_config.py; the default impl 'native' keeps the fp32 chain the plan costs without the fusion)."""
    out: Pairs = [("--cuda-graph-impl", "local")] if plan.cuda_graphs else []
    if plan.cross_entropy_fusion:
        out += [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", "te")]
    return out


def _precision_args(plan: ParallelPlan, hardware: Hardware | None, notes: list[str]) -> Pairs:
    """_add_mixed_precision_args, _add_transformer_engine_args."""
    out: Pairs = [("--fp16", None)] if plan.dtype == "fp16" else [("--bf16", None)]
    if plan.dtype == "fp8":
        out.append(("--fp8-format", "hybrid"))
    if plan.dtype == fp8_block.DTYPE:  # --fp8-recipe choices tensorwise, delayed, mxfp8, blockwise (arguments.py
        # _add_transformer_engine_args, NVIDIA/Megatron-LM @307dcf37); e4m3 as Megatron's blockwise/mxfp8 examples
        recipe = fp8_block.megatron_recipe(hardware.gpu.measured_as if hardware is not None else None)
        out += [("--fp8-format", "e4m3"), ("--fp8-recipe", recipe)]
        notes.append(f"--fp8-recipe {recipe}: " + fp8_block.RECIPE_NOTES[recipe])
    return out


def megatron_pairs(model: ModelSpec, plan: ParallelPlan, iterations: int | None = None,
                   hardware: Hardware | None = None) -> tuple[Pairs, list[str]]:
    """(flag, value / None / list) pairs of :func:`megatron_args` and its notes."""
    pairs: Pairs = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp),
                    ("--context-parallel-size", plan.cp)]
    if plan.sp:
        pairs.append(("--sequence-parallel", None))
    pairs += megatron_mla_args(model) + megatron_moe_args(model, plan)  # planner.export_moe
    notes = megatron_router_args(model)[1]
    pairs += _pipeline_args(model, plan) + _training_args(model, plan, iterations)
    arch_pairs, arch_notes = megatron_arch_args(model)  # planner.export_megatron
    pairs += arch_pairs
    notes += arch_notes
    pairs += _sharding_args(plan) + _kernel_args(plan) + _precision_args(plan, hardware, notes)
    mem_pairs, mem_notes = megatron_memory_args(plan)  # planner.export_memory
    return pairs + mem_pairs, notes + mem_notes


def megatron_args(model: ModelSpec, plan: ParallelPlan, iterations: int | None = None,
                  hardware: Hardware | None = None) -> tuple[list[str], list[str]]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the plan (a flag, then its values as separate tokens), and
    notes on what they cannot express.

    Flag names: NVIDIA/Megatron-LM megatron/training/arguments.py (commit 000c4ac24f61).
    """
    pairs, notes = megatron_pairs(model, plan, iterations, hardware)
    return [token for flag, value in pairs for token in (flag, *_values(value))], notes


def _values(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def arg_lines(tokens: list[str]) -> list[str]:
    """One line per flag with its values, every token quoted for a POSIX shell (shlex.quote), so the lines paste
    into bash and read back with ``shlex.split`` (a flag's values follow it until the next ``--`` token)."""
    lines: list[list[str]] = []
    for token in tokens:
        if token.startswith("--") or not lines:
            lines.append([token])
        else:
            lines[-1].append(token)
    return [" ".join(shlex.quote(t) for t in line) for line in lines]


def _needs_single_connection(plan: ParallelPlan) -> bool:
    """validate_args: TP or CP > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (not with FSDP)."""
    return (plan.tp > 1 or plan.cp > 1) and plan.zero < 2


def export_megatron(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None",
                    iterations: int | None = None) -> str:
    """Comment header plus one flag (and its values) per line; ``shlex.split(text, comments=True)`` reads it."""
    args, notes = megatron_args(model, plan, iterations, hardware)
    if (ckpt := save_interval(model, plan, prediction)) is not None:  # arguments.py _add_checkpointing_args
        args, notes = args + ["--save-interval", str(ckpt[0])], notes + [ckpt[1]]
    lines = header("Megatron-LM pretrain_gpt.py flags", model, plan, hardware, prediction)
    lines.append("# Flag names checked against NVIDIA/Megatron-LM megatron/training/arguments.py "
                 "(commit 000c4ac24f61).")
    lines.append("# Add data, tokenizer, optimizer and checkpoint flags (--data-path, --tokenizer-type, --lr, ...).")
    if _needs_single_connection(plan):
        lines.append("# Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP/CP > 1 on pre-Blackwell GPUs.")
    if plan.zero >= 2:
        lines.append("# Megatron-FSDP: unset CUDA_DEVICE_MAX_CONNECTIONS (Megatron-FSDP user guide).")
    lines += note_lines(notes)
    lines += arg_lines(args)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- NeMo
def _nemo_architecture(model: ModelSpec, m: dict, notes: list[str]) -> None:
    """Architecture keys: megatron_gpt's own names, then the TransformerConfig fields NeMo passes on."""
    act = {"gelu": "gelu", "swiglu": "swiglu", "squared_relu": "squared-relu"}.get(model.activation)
    if act is None:
        notes.append(f"activation: {model.activation} is not among NeMo's activation options; set it by hand")
    else:
        m["activation"] = act
    pos = {"rope": "rope", "learned": "learned_absolute", "alibi": "alibi"}.get(model.position_embedding)
    if pos is None:
        notes.append(f"position_embedding: {model.position_embedding!r} is not among NeMo's options; set it by hand")
    else:
        m["position_embedding_type"] = pos
    arch = architecture(model)
    if model.position_embedding == "rope":
        # NeMo megatron_gpt_model.py: GPTModel(rotary_base=self.cfg.get('rotary_base', 10000),
        # rotary_percent=self.cfg.get('rotary_percentage', 1.0))
        if model.rope_theta is not None:
            m["rotary_base"] = int(model.rope_theta)
        else:
            notes.append("rope_theta: the model's source states no RoPE base; NeMo's default rotary_base 10000 applies")
        if arch.rotary_percent is not None:
            m["rotary_percentage"] = arch.rotary_percent
    # layernorm_epsilon and window_size are TransformerConfig fields, which NeMo's build_transformer_config
    # copies from the model config; qkv_bias -> add_qkv_bias (megatron_base_model.py)
    if arch.norm_eps is not None:
        m["layernorm_epsilon"] = arch.norm_eps
    else:
        notes.append("norm_eps: the model's source states no norm epsilon; NeMo's layernorm_epsilon default applies")
    if arch.qkv_bias:
        m["qkv_bias"] = True
    if arch.sliding_window is not None:
        m["window_size"] = [arch.sliding_window, 0]  # (left, right); NeMo's MistralConfig7B: [4096, 0]
    keys, key_notes = nemo_arch_keys(model)  # planner.export_megatron
    m.update(keys)
    notes += key_notes
    gate_notes = megatron_arch_args(model)[1]
    notes += [n for n in gate_notes if n.startswith(("gated_activation", "rope_scaling"))] + list(arch.notes)
    notes.append(f"vocab_size: the vocabulary ({model.vocab_size} tokens) comes from model.tokenizer: use the model's "
                 "own")
    if not model.dropout:
        m["hidden_dropout"] = 0.0
        m["attention_dropout"] = 0.0


def _nemo_pipeline(plan: ParallelPlan, m: dict) -> None:
    if plan.vpp > 1 and plan.vpp_microbatch_group != plan.pp:
        # micro-batches not a multiple of PP: Megatron-Core's default group (PP) is refused (schedules.py)
        m["microbatch_group_size_per_vp_stage"] = plan.vpp_microbatch_group
    if plan.pipeline_layout is not None:  # TransformerConfig.pipeline_model_parallel_layout
        m["pipeline_model_parallel_layout"] = megatron_layout(plan)
    elif is_uneven(plan):
        # Megatron-Core TransformerConfig fields (transformer_config.py), which NeMo's model config passes on
        fl = _uneven_first_last(plan.layer_split)
        flags = account_for(plan.layer_split, plan.vpp)
        if flags is not None and any(n % plan.vpp for n in plan.layer_split):
            m["account_for_embedding_in_pipeline_split"] = bool(flags[0])
            m["account_for_loss_in_pipeline_split"] = bool(flags[1])
        elif fl is not None:
            m["num_layers_in_first_pipeline_stage"], m["num_layers_in_last_pipeline_stage"] = fl
        else:
            m["pipeline_model_parallel_layout"] = megatron_layout(plan)


def _nemo_training(plan: ParallelPlan, m: dict, notes: list[str]) -> None:
    """Recomputation, precision and the optimizer's sharding."""
    m["activations_checkpoint_granularity"] = None if plan.recompute == "none" else plan.recompute
    m["activations_checkpoint_method"] = "uniform" if plan.recompute == "full" else None
    m["activations_checkpoint_num_layers"] = 1 if plan.recompute == "full" else None
    if plan.recompute_modules:  # Megatron-Core TransformerConfig.recompute_modules, passed on as window_size
        m["recompute_modules"] = list(plan.recompute_modules)
    if plan.dtype == "fp8":
        m.update({"transformer_engine": True, "fp8": True, "fp8_hybrid": True})
    if plan.dtype == fp8_block.DTYPE:
        m.update({"transformer_engine": True, "fp8": True, "fp8_e4m3": True})
        notes.append("block-scaled FP8: set the Transformer Engine recipe (Megatron --fp8-recipe blockwise on Hopper, "
                     "mxfp8 on Blackwell) in the NeMo recipe; this config sets only fp8 / fp8_e4m3")
    if plan.zero >= 2:  # torch FSDP: 'grad' shards gradients + optimizer states, 'full' also parameters
        m.update({"fsdp": True, "fsdp_sharding_strategy": "grad" if plan.zero == 2 else "full"})
        m["optim"] = {"name": "fused_adam"}
        notes.append("FSDP shards the optimizer states itself, so optim.name stays fused_adam")
    elif plan.zero == 1:
        m["optim"] = {"name": "distributed_fused_adam", "overlap_grad_sync": plan.overlap_grad_reduce,
                      "overlap_param_sync": plan.overlap_param_gather}
    else:
        m["optim"] = {"name": "fused_adam"}


def nemo_config(model: ModelSpec, plan: ParallelPlan, iterations: int | None = None) -> tuple[dict, list[str]]:
    """NeMo megatron_gpt config fragment (trainer + model) and notes on what it cannot express."""
    notes: list[str] = megatron_router_args(model)[1]
    trainer = {"num_nodes": plan.num_nodes, "devices": plan.gpus_per_node,
               "precision": "16-mixed" if plan.dtype == "fp16" else "bf16-mixed"}
    if iterations is not None:
        trainer["max_steps"] = iterations
    m: dict = {
        "micro_batch_size": plan.mbs,
        "global_batch_size": plan.gbs,
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
        "context_parallel_size": plan.cp,
        "sequence_parallel": plan.sp,
        "encoder_seq_length": plan.seq_len,
        "max_position_embeddings": max(model.max_seq_len, plan.seq_len),
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_heads,
        "num_query_groups": model.num_kv_heads if model.num_kv_heads != model.num_heads else None,
        "kv_channels": model.head_dim if model.head_dim * model.num_heads != model.hidden_size else None,
        "normalization": model.norm,
        "bias": model.linear_bias,
        "share_embeddings_and_output_weights": model.tied_embeddings,
        **nemo_moe_keys(model, plan),
    }
    _nemo_architecture(model, m, notes)
    _nemo_pipeline(plan, m)
    _nemo_training(plan, m, notes)
    mem_model, mem_optim, mem_notes = nemo_memory_keys(plan)  # planner.export_memory
    m.update(mem_model)
    m["optim"].update(mem_optim)
    return {"trainer": trainer, "model": m}, notes + mem_notes


def export_nemo(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None",
                iterations: int | None = None) -> str:
    cfg, notes = nemo_config(model, plan, iterations)
    if (ckpt := save_interval(model, plan, prediction)) is not None:  # the launcher saves at validation (val_loss)
        cfg["trainer"]["val_check_interval"] = ckpt[0]
        notes.append(ckpt[1] + "; NeMo's exp_manager checkpoint callback saves at each validation, so "
                     "trainer.val_check_interval sets the save interval")
    lines = header("NeMo megatron_gpt config fragment", model, plan, hardware, prediction)
    lines.append("# Keys checked against NeMo-Framework-Launcher conf/training/llama/llama3_1_70b.yaml; merge into "
                 "your megatron_gpt config (tokenizer, data and optimizer settings are not included).")
    if model.is_moe:
        lines.append("# MoE keys: NeMo-Framework-Launcher conf/training/mixtral (num_moe_experts, moe_router_topk, "
                     "expert_model_parallel_size, ...) and Megatron-Core TransformerConfig fields (export_moe.py).")
    lines += note_lines(notes)
    return "\n".join(lines) + "\n" + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------------------------- Slurm
def export_slurm(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None",
                 iterations: int | None = None, margin: float = 1.25, job_name: str = "planner",
                 cpus_per_task: int | None = None, startup_s: float = STARTUP_ALLOWANCE_S,
                 max_walltime_s: float = DEFAULT_MAX_WALLTIME_S) -> str:
    """``#SBATCH`` header (one task per node) plus an ``srun torchrun ... pretrain_gpt.py`` line."""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={plan.num_nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={plan.gpus_per_node}"]
    if cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    budget = None
    if prediction is not None and iterations is not None:
        budget = slurm_budget(iterations, prediction, margin, startup_s, max_walltime_s)
        lines.append(f"#SBATCH --time={format_slurm_time(budget[0])}")
    lines += header("Slurm job", model, plan, hardware, prediction)
    lines.append("# Assumptions: one srun task per node runs torchrun, which starts one process per GPU; "
                 "pretrain_gpt.py is Megatron-LM's, run from its checkout.")
    if budget is not None:
        lines += budget[1] + [f"# WARNING: {w}." for w in budget[2]]
    else:
        lines.append("# --time not set: it needs a prediction and --iterations N or --tokens T.")
    if cpus_per_task is None:
        lines.append("# --cpus-per-task not set: the hardware catalogue records no CPU count; give --cpus-per-task.")
    lines.append("# Add data, tokenizer, optimizer and checkpoint flags to the pretrain_gpt.py line.")
    lines.append("set -euo pipefail")
    lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    if _needs_single_connection(plan):
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts it with TP/CP > 1 (arguments.py)")
    args, notes = megatron_args(model, plan, iterations, hardware)
    if (ckpt := save_interval(model, plan, prediction)) is not None:  # as export_megatron
        args, notes = args + ["--save-interval", str(ckpt[0])], notes + [ckpt[1]]
    lines += note_lines(notes)
    cmd = (f'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node {plan.gpus_per_node} '
           f'--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$head_node:{RDZV_PORT}" pretrain_gpt.py')
    lines.append(" \\\n    ".join([cmd] + arg_lines(args)))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- entry
def _check(model: ModelSpec, plan: ParallelPlan, fmt: str, iterations, margin: float, job_name: str) -> None:
    if fmt not in FORMATS:
        raise PlannerError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations <= 0):
        raise PlannerError(f"iterations={iterations!r} must be a positive integer")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 1.0):
        raise PlannerError(f"margin={margin!r} must be a number >= 1 (1.25 adds 25 % to the predicted run time)")
    if not isinstance(job_name, str) or not _JOB_NAME.match(job_name):
        raise PlannerError(f"job name {job_name!r} must be 1-64 characters of letters, digits, '.', '_' or '-'")
    plan.validate(model)


def export_plan(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None", fmt: str,
                iterations: int | None = None, margin: float = 1.25, job_name: str = "planner",
                cpus_per_task: int | None = None, max_walltime_s: float = DEFAULT_MAX_WALLTIME_S) -> str:
    """Launcher settings for one plan as text. ``fmt``: megatron, nemo, torchtitan, slurm or all (all four,
    one after another under banner comments: for reading; :func:`export_targets` gives one text per file).

    ``slurm`` needs ``prediction`` and ``iterations`` for its time limit (``all`` writes the script without
    ``--time`` and says why). A plan whose layers PP x VPP does not divide is exported with the split the
    prediction chose (``prediction.layer_split``), else with the count-based default split.
    """
    texts = export_targets(model, plan, hardware, prediction, fmt, iterations, margin, job_name, cpus_per_task,
                           max_walltime_s)
    if fmt != "all":
        return texts[fmt]
    return join_targets(texts, skipped_targets(model, plan, fmt))


def join_targets(texts: dict[str, str], skipped: dict[str, str]) -> str:
    """The texts of ``--to all`` one after another under banner comments; a target left out says why."""
    return "\n".join(f"# ======================== {name} ========================\n"
                     + (texts[name] if name in texts else f"# not written: {skipped[name]}.\n")
                     for name in TARGET_FILES if name in texts or name in skipped)


def skipped_targets(model: ModelSpec, plan: ParallelPlan, fmt: str) -> dict[str, str]:
    """{target: why} for the targets ``fmt == 'all'`` leaves out: torchtitan when it has no model for the MoE
    architecture or cannot run the plan (:func:`planner.export_torchtitan.refusal`)."""
    why = torchtitan_refusal(model, plan) if fmt == "all" else None
    return {} if why is None else {"torchtitan": why}


def export_targets(model: ModelSpec, plan: ParallelPlan, hardware: Hardware, prediction: "Prediction | None",
                   fmt: str, iterations: int | None = None, margin: float = 1.25, job_name: str = "planner",
                   cpus_per_task: int | None = None,
                   max_walltime_s: float = DEFAULT_MAX_WALLTIME_S) -> dict[str, str]:
    """{target: text} for ``fmt`` (one target, or all four for ``all``); arguments as :func:`export_plan`."""
    if plan.needs_layer_split(model.num_layers):
        split = prediction.layer_split if prediction is not None and prediction.layer_split else \
            plan.stage_layers(model.num_layers)
        plan = dataclasses.replace(plan, layer_split=tuple(split))
    _check(model, plan, fmt, iterations, margin, job_name)
    if not (isinstance(max_walltime_s, (int, float)) and max_walltime_s > 0):
        raise PlannerError(f"max_walltime_s={max_walltime_s!r} must be a positive number of seconds")
    if cpus_per_task is not None and (isinstance(cpus_per_task, bool) or not isinstance(cpus_per_task, int)
                                      or cpus_per_task <= 0):
        raise PlannerError(f"cpus_per_task={cpus_per_task!r} must be a positive integer")
    if fmt == "slurm" and (prediction is None or iterations is None):
        raise PlannerError("the Slurm export needs a prediction and a run length for --time; "
                           "pass --iterations N or --tokens T")
    makers = {
        "megatron": lambda: export_megatron(model, plan, hardware, prediction, iterations),
        "nemo": lambda: export_nemo(model, plan, hardware, prediction, iterations),
        "torchtitan": lambda: export_torchtitan(model, plan, hardware, prediction, iterations),
        "slurm": lambda: export_slurm(model, plan, hardware, prediction, iterations, margin, job_name, cpus_per_task,
                                      max_walltime_s=max_walltime_s),
    }
    skipped = skipped_targets(model, plan, fmt)
    return {name: make() for name, make in makers.items() if fmt in (name, "all") and name not in skipped}
