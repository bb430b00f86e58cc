"""Memory features of a plan (precision of the optimizer states, fp8 weights, host offloading) and their checks.

Each feature is a :class:`costmodel.core.specs.plan.ParallelPlan` field named after the framework flag it models;
:func:`memory_feature_problems` lists what is wrong with a plan's choice (``ParallelPlan.problems`` calls it).
Flag names and rules are read from NVIDIA/Megatron-LM at commit d98e8a64ddf3 (2026-08-22):
``megatron/training/arguments.py`` (``--use-precision-aware-optimizer``, ``--main-grads-dtype``,
``--main-params-dtype``, ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``, ``--fp8-param-gather``,
``--optimizer-cpu-offload``, ``--optimizer-offload-fraction``, ``--grad-reduce-in-bf16``) and
``megatron/core/transformer/transformer_config.py`` (``fine_grained_activation_offloading``, ``offload_modules``).
"""

from __future__ import annotations

GRAD_DTYPES = ("fp32", "bf16", "fp16")
"""Main-gradient precisions: Megatron --main-grads-dtype {fp32, bf16} (or --grad-reduce-in-bf16, NeMo
``grad_reduce_in_fp32=False``); fp16 is fp16 training's model gradient ("fp16 parameters, fp16 gradients",
Megatron-LM docs/user-guide/features/dist_optimizer.md)."""
MAIN_PARAM_DTYPES = ("fp32", "fp16", "bf16", "none")
"""Optimizer copy of the parameters: Megatron --main-params-dtype {fp32, fp16}; bf16 (Megatron-FSDP
--megatron-fsdp-main-params-dtype bf16; NeMo 1's Apex DistributedFusedAdam with ``optim.dtype: bf16``, which keeps
bf16 master parameters when fp8_params is set: NeMo v2.0.0 megatron_base_model.py ``store_params``); ``none`` = no
separate copy, the optimizer steps the training-dtype parameters (a PyTorch optimizer on a bf16 model, as NeMo
AutoModel builds it: nemo_automodel/_transformers/auto_model.py ``torch_dtype`` "auto" -> torch.bfloat16)."""
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
"""Adam moment precisions: Megatron --exp-avg-dtype / --exp-avg-sq-dtype {fp32, fp16, bf16, fp8}."""
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
"""Megatron-Core fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules): each
module's input moves to host memory after its forward and back before its backward (transformer_config.py
``offload_modules``; ``fused_group_mlp`` and ``gdp_qkv`` belong to kernels and layers not modelled)."""
OFFLOAD_STEPS = (("attn_norm", "mlp_norm"), ("attn_norm", "mlp_norm", "core_attn", "attn_proj"),
                 ("attn_norm", "mlp_norm", "core_attn", "attn_proj", "qkv_linear"))
"""Sets of :data:`OFFLOAD_MODULES` a dense model's activations are offloaded by, smallest first, tried in turn where
a plan does not fit (planner's does-not-fit advice, ``planner search --offload-modules auto``): the norms' inputs,
then attention's output and its projection input (attn_proj needs core_attn), then the QKV input."""
MOE_OFFLOAD_STEPS = (("expert_fc1", "moe_act"),) + tuple(("expert_fc1", "moe_act") + mods for mods in OFFLOAD_STEPS)
"""The same for a mixture-of-experts model: the routed experts' fc1 input and activation first, the set the
Megatron-MoE-ModelZoo Qwen3-235B GB200 MXFP8 recipe offloads (yanring/Megatron-MoE-ModelZoo
best_practice/qwen3/readme.md @e8650517: ``--offload-modules expert_fc1 moe_act``), then the dense sets added to it."""


def offload_steps(moe: bool) -> tuple[tuple[str, ...], ...]:
    """The activation-offloading sets tried in turn for a plan of a mixture-of-experts model (``moe``) or a dense
    one."""
    return MOE_OFFLOAD_STEPS if moe else OFFLOAD_STEPS


BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "none": 0.0}
"""Bytes per element of each precision ("none": no copy kept)."""

_FSDP_STACKS = ("fsdp", "torchtitan", "torchtitan-eager")
"""Stacks whose ZeRO-3 is PyTorch FSDP2 (reshard_after_forward is its fully_shard argument)."""


def _dtype_problems(plan) -> list[str]:
    p = []
    for name, allowed in (("main_grads_dtype", ("",) + GRAD_DTYPES), ("main_params_dtype", MAIN_PARAM_DTYPES),
                          ("exp_avg_dtype", MOMENT_DTYPES), ("exp_avg_sq_dtype", MOMENT_DTYPES)):
        value = getattr(plan, name)
        if value not in allowed:
            p.append(f"{name}={value!r} must be one of {', '.join(a for a in allowed if a)}")
    if plan.main_grads_dtype == "fp16" and plan.dtype != "fp16":
        p.append(f"main_grads_dtype=fp16 is fp16 training's gradient; with dtype={plan.dtype} use fp32 or bf16")
    if plan.dtype == "fp32" and (plan.main_grads_dtype not in ("", "fp32") or plan.main_params_dtype != "fp32"
                                 or (plan.exp_avg_dtype, plan.exp_avg_sq_dtype) != ("fp32", "fp32")):
        p.append("dtype=fp32 trains fp32 parameters with fp32 gradients and moments: lower-precision optimizer "
                 "states need dtype bf16, fp16, fp8 or fp8-block")
    if plan.main_params_dtype == "none" and plan.framework not in _FSDP_STACKS:
        p.append(f"main_params_dtype=none (the optimizer steps the bf16 parameters, no fp32 copy) is a PyTorch "
                 f"FSDP2 setup; framework={plan.framework} keeps a main copy: use fp32 or fp16 (Megatron "
                 "--main-params-dtype), or framework fsdp")
    return p


def _offload_problems(plan) -> list[str]:
    p = []
    f = plan.optimizer_offload_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
        p.append(f"optimizer_offload_fraction={f!r} must be a fraction in [0, 1] (Megatron "
                 "--optimizer-offload-fraction; 0 = no --optimizer-cpu-offload)")
    elif f > 0 and (plan.framework != "megatron" or plan.zero < 1):
        p.append("optimizer_offload_fraction > 0 is Megatron's --optimizer-cpu-offload (a hybrid CPU/GPU optimizer "
                 "on the distributed optimizer's shards): needs framework megatron and zero >= 1")
    mods = plan.offload_modules
    bad = [m for m in mods if m not in OFFLOAD_MODULES]
    if bad:
        p.append(f"offload_modules={','.join(mods)}: unknown {', '.join(bad)}; choose from "
                 f"{', '.join(OFFLOAD_MODULES)}")
    elif mods and plan.framework != "megatron":
        p.append("offload_modules is Megatron-Core's --fine-grained-activation-offloading: needs framework megatron")
    elif "attn_proj" in mods and "core_attn" not in mods:
        p.append("offload_modules: attn_proj needs core_attn as well (Megatron-Core: the input of attn_proj is the "
                 "output of core_attn, which core_attn's backward needs)")
    elif mods and plan.recompute == "full":
        p.append("offload_modules with recompute=full: a fully recomputed layer keeps only its input; drop one")
    elif mods and "moe" in plan.recompute_modules and {"expert_fc1", "moe_act"} & set(mods):
        p.append("offload_modules expert_fc1/moe_act inside a recomputed MoE layer (--recompute-modules moe): "
                 "Megatron-Core refuses it")
    return p


def memory_feature_problems(plan) -> list[str]:
    """Every reason the plan's memory features are invalid (empty when valid)."""
    p = _dtype_problems(plan) + _offload_problems(plan)
    if plan.fp8_param_gather and plan.dtype not in ("fp8", "fp8-block"):
        p.append(f"fp8_param_gather keeps fp8 primary weights: needs dtype fp8 or fp8-block (dtype={plan.dtype})")
    elif plan.fp8_param_gather and plan.zero < 1:
        p.append("fp8_param_gather needs the distributed optimizer or FSDP (zero >= 1; Megatron-LM arguments.py: "
                 "'--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp')")
    if plan.reshard_after_forward is not None and not isinstance(plan.reshard_after_forward, bool):
        p.append(f"reshard_after_forward={plan.reshard_after_forward!r} must be true, false or unset")
    return p


def uses_precision_aware_optimizer(plan) -> bool:
    """The plan's optimizer states need Megatron's --use-precision-aware-optimizer (lower-precision main
    parameters, moments, or bf16 main gradients through --main-grads-dtype), or CPU offload (which Megatron-LM
    asserts runs on it)."""
    return (plan.main_params_dtype == "fp16" or (plan.exp_avg_dtype, plan.exp_avg_sq_dtype) != ("fp32", "fp32")
            or plan.optimizer_offload_fraction > 0)


FEATURE_DEFAULTS: dict = {"main_grads_dtype": "", "main_params_dtype": "fp32", "exp_avg_dtype": "fp32",
                          "exp_avg_sq_dtype": "fp32", "fp8_param_gather": False, "optimizer_offload_fraction": 0.0,
                          "reshard_after_forward": None, "offload_modules": ()}
"""Every memory feature (a ParallelPlan field) and the value that leaves it off (ParallelPlan's default)."""


def feature_values(plan) -> dict:
    """The plan's memory features that differ from :data:`FEATURE_DEFAULTS`, by field name."""
    return {name: getattr(plan, name) for name, default in FEATURE_DEFAULTS.items() if getattr(plan, name) != default}


def value_problems(settings: dict) -> list[str]:
    """What is wrong with memory-feature values on their own (unknown name, a value no plan takes), before any plan
    is built: e.g. the settings a search applies to every plan. The rules that depend on the plan (framework,
    recompute, ZeRO stage, dtype) are :func:`memory_feature_problems`'."""
    allowed = {"main_grads_dtype": ("",) + GRAD_DTYPES, "main_params_dtype": MAIN_PARAM_DTYPES,
               "exp_avg_dtype": MOMENT_DTYPES, "exp_avg_sq_dtype": MOMENT_DTYPES}
    out = []
    for name, value in settings.items():
        if name not in FEATURE_DEFAULTS:
            out.append(f"{name} is not a memory feature; use {', '.join(FEATURE_DEFAULTS)}")
        elif name in allowed and value not in allowed[name]:
            out.append(f"{name}={value!r} must be one of {', '.join(a for a in allowed[name] if a)}")
        elif name == "offload_modules" and [m for m in value if m not in OFFLOAD_MODULES]:
            out.append(f"offload_modules={','.join(value)}: unknown "
                       f"{', '.join(m for m in value if m not in OFFLOAD_MODULES)}; choose from "
                       f"{', '.join(OFFLOAD_MODULES)}")
        elif name == "optimizer_offload_fraction" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                       or not 0.0 <= value <= 1.0):
            out.append(f"optimizer_offload_fraction={value!r} must be a fraction in [0, 1]")
        elif name in ("fp8_param_gather", "reshard_after_forward") and not isinstance(value, bool) \
                and value is not None:
            out.append(f"{name}={value!r} must be true or false")
    return out


def memory_features_text(plan) -> str:
    """The plan's memory features that differ from the defaults, for ``ParallelPlan.factors`` ("" when none)."""
    return "".join(f" {name}={','.join(v) if name == 'offload_modules' else v}"
                   for name, v in feature_values(plan).items())
