"""A run row's memory features: the source rules that state them (search_spaces/validation/published_sources.toml)
and the activation offloading its recompute text names, as PlanRequest keyword arguments (planner.requests)."""

from __future__ import annotations

import re

from costmodel.core.specs.memory_features import OFFLOAD_MODULES

FP8_DTYPES = ("fp8", "fp8-block")


def offload_modules(text: str) -> tuple[str, ...]:
    """Megatron-Core --offload-modules named in a row's recompute text after 'activation offloading', e.g.
    'selective: moe_act, layernorm + fine-grained activation offloading (expert_fc1, moe_act)'; () when none."""
    t = text.lower()
    if "offloading" not in t:
        return ()
    tail = t.split("offloading", 1)[1]
    return tuple(w for w in re.findall(r"[a-z0-9_]+", tail) if w in OFFLOAD_MODULES)


def memory_fields(row, dtype: str, zero: int, notes: list[str]) -> dict:
    """PlanRequest memory-feature keys of ``row`` (its source's rules and its recompute text), each stated in
    ``notes``."""
    out: dict = {}
    fp8 = dtype in FP8_DTYPES
    applied = []
    if (rule := row.rule("bf16_model_states")) is not None:
        out.update(main_params_dtype="none", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", main_grads_dtype="bf16")
        applied.append(rule)
    if (rule := row.rule("optimizer_states_bf16")) is not None:
        out.update(main_params_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
        applied.append(rule)
    if (rule := row.rule("grads_bf16")) is not None:
        out["main_grads_dtype"] = "bf16"
        applied.append(rule)
    if fp8 and (rule := row.rule("fp8_moments_bf16")) is not None:
        out.update(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
        applied.append(rule)
    if fp8 and zero < 3 and (rule := row.rule("fp8_param_gather")) is not None:
        out["fp8_param_gather"] = True
        applied.append(rule)
    notes.extend(rule.assumption for rule in applied)
    mods = offload_modules(row.text["recompute"])
    if mods:
        out["offload_modules"] = mods
        notes.append(f"fine-grained activation offloading of {', '.join(mods)} (--offload-modules)")
    return out
