"""The plan's memory features as launcher settings (costmodel/core/specs/memory_features.py).

* Megatron-LM (NVIDIA/Megatron-LM @d98e8a64ddf3 megatron/training/arguments.py; the fine-grained offloading flags
  are TransformerConfig fields that arguments.py exports through argument_utils.ArgumentGroupFactory):
  ``--use-precision-aware-optimizer`` with ``--main-grads-dtype``, ``--main-params-dtype``, ``--exp-avg-dtype``,
  ``--exp-avg-sq-dtype``; ``--grad-reduce-in-bf16`` for bf16 main gradients without it; ``--fp8-param-gather``;
  ``--optimizer-cpu-offload --optimizer-offload-fraction`` (which Megatron-LM asserts runs on the precision-aware
  optimizer); ``--fine-grained-activation-offloading --offload-modules``.
* NeMo 1 (launcher megatron_gpt configs): ``model.fp8_params`` (NVIDIA/NeMo v2.0.0 megatron_base_model.py
  ``cfg.get('fp8_params')``), ``optim.grad_sync_dtype`` and ``optim.dtype`` of the Apex distributed_fused_adam
  (the same file's setup_optimization; NeMo-Framework-Launcher tag 24.07 launcher_scripts/conf/peft/llama/sft.yaml).
* torchtitan: ``parallelism.fsdp_reshard_after_forward`` "always" / "never" (torchtitan/config/configs.py
  @b5bcd76c).
"""

from __future__ import annotations

from costmodel.core.specs.memory_features import uses_precision_aware_optimizer
from costmodel.core.specs.plan import ParallelPlan


def megatron_memory_args(plan: ParallelPlan) -> tuple[list[tuple[str, object]], list[str]]:
    """(Megatron-LM (flag, value or None) pairs, notes) of the plan's memory features."""
    out: list[tuple[str, object]] = []
    notes: list[str] = []
    if uses_precision_aware_optimizer(plan):
        out.append(("--use-precision-aware-optimizer", None))
        if plan.main_grads_dtype == "bf16":
            out.append(("--main-grads-dtype", "bf16"))
        if plan.main_params_dtype in ("fp32", "fp16"):
            out.append(("--main-params-dtype", plan.main_params_dtype))
        else:
            notes.append(f"main_params_dtype {plan.main_params_dtype}: Megatron-LM's --main-params-dtype takes fp32 or "
                         "fp16 only (Megatron-FSDP: --megatron-fsdp-main-params-dtype)")
        out += [("--exp-avg-dtype", plan.exp_avg_dtype), ("--exp-avg-sq-dtype", plan.exp_avg_sq_dtype)]
    elif plan.main_grads_dtype == "bf16":
        out.append(("--grad-reduce-in-bf16", None))
    if plan.fp8_param_gather:
        out.append(("--fp8-param-gather", None))
    if plan.optimizer_offload_fraction > 0:
        out += [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", plan.optimizer_offload_fraction)]
    if plan.offload_modules:
        out += [("--fine-grained-activation-offloading", None), ("--offload-modules", " ".join(plan.offload_modules))]
    if plan.reshard_after_forward is False:
        notes.append("reshard_after_forward=false has no Megatron-LM flag; Megatron-FSDP's optim_grads strategy "
                     "(ZeRO-2) keeps the parameters unsharded")
    return out, notes


def nemo_memory_keys(plan: ParallelPlan) -> tuple[dict, dict, list[str]]:
    """(model keys, optim keys, notes) of the plan's memory features in a NeMo 1 megatron_gpt config."""
    model: dict = {}
    optim: dict = {}
    notes: list[str] = []
    if plan.fp8_param_gather:
        model["fp8_params"] = True
    if plan.main_grads_dtype == "bf16":
        optim["grad_sync_dtype"] = "bf16"
    moments = {plan.exp_avg_dtype, plan.exp_avg_sq_dtype}
    if moments == {"bf16"} and plan.main_params_dtype in ("bf16", "none"):
        optim["dtype"] = "bf16"
    elif moments != {"fp32"} or plan.main_params_dtype != "fp32":
        notes.append("NeMo's distributed_fused_adam sets one optimizer-state dtype (optim.dtype fp32 or bf16); "
                     "other combinations of main-parameter and moment precisions need Megatron-LM's flags")
    if plan.optimizer_offload_fraction > 0 or plan.offload_modules:
        notes.append("optimizer and fine-grained activation offloading: pass Megatron-Core's optimizer_cpu_offload / "
                     "offload_modules through the NeMo recipe; this config does not set them")
    return model, optim, notes


def torchtitan_memory_keys(plan: ParallelPlan) -> dict:
    """torchtitan ``parallelism`` keys of the plan's memory features."""
    if plan.reshard_after_forward is None:
        return {}
    return {"fsdp_reshard_after_forward": "always" if plan.reshard_after_forward else "never"}
