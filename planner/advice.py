"""One-line advice under a prediction: where a defaulted sequence length came from, and for a plan that does not
fit, which memory term dominates and which flags change it.

Built on a prediction record's ``memory`` dict (``weights``, ``gradients``, ``optimizer``, ``activations``,
``workspace`` in GiB per GPU, the peak stage's) and its ``plan`` dict; what each flag changes is the memory
model's own accounting (costmodel/memory/per_gpu.py): activations scale with the tokens a GPU holds (sequence / CP,
micro-batch, / TP with sequence parallelism) and the layers it holds (/ PP), and shrink with full recomputation;
weights and their gradients divide over TP x PP (experts over EP), and ZeRO stage 1 / 2 / 3 shards the optimizer
states / gradients / weights over the data-parallel ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from costmodel.core.errors import PlannerError
from costmodel.core.specs.memory_features import offload_steps
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.presets import default_seq_len
from costmodel.memory.zero_choice import AUTO_ZERO

MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "workspace")


def seq_len_note(model: ModelSpec, requested: int | None) -> str | None:
    """The note shown when no --seq-len was given: the length used and where it comes from."""
    if requested is not None:
        return None
    seq, source = default_seq_len(model)
    return f"seq_len {seq} is the default for {model.name}: {source}; pass --seq-len to train at another length"


def _levers(term: str, plan: dict, moe: bool) -> list[str]:
    """The flags that shrink ``term`` for ``plan`` (a prediction record's plan dict), most direct first."""
    zero, tp, pp, cp = plan.get("zero", 0), plan.get("tp", 1), plan.get("pp", 1), plan.get("cp", 1)
    experts = ["--ep (experts over more GPUs)"] if moe else []
    if term == "activations":
        out = [f"--seq-len (now {plan.get('seq_len')})", f"--mbs (now {plan.get('mbs')})" if plan.get("mbs", 1) > 1
               else None, "--recompute full" if plan.get("recompute") != "full" else None,
               f"--cp (now {cp})", f"--tp (now {tp}, with sequence parallelism)",
               f"--pp (now {pp}: fewer layers per GPU)"]
    elif term == "optimizer":  # ZeRO-1 and up already shard the optimizer states over the DP ranks
        out = [f"--zero 1 (now {zero})" if zero < 1 else None, f"--tp (now {tp})", f"--pp (now {pp})", *experts]
    elif term == "gradients":
        out = [f"--zero 2 (now {zero})" if zero < 2 else None, f"--tp (now {tp})",
               f"--pp (now {pp})", *experts]
    elif term == "weights":
        out = [f"--tp (now {tp})", f"--pp (now {pp})", f"--zero 3 (now {zero})" if zero < 3 else None, *experts]
    else:  # workspace: per-micro-batch buffers (logits, communication buckets)
        out = [f"--mbs (now {plan.get('mbs')})" if plan.get("mbs", 1) > 1 else None, f"--tp (now {tp})"]
    return [x for x in out if x]


def memory_advice(rec: dict, moe: bool = False) -> str | None:
    """For a record that does not fit: the dominant memory term, its share, and the flags that change it."""
    if rec.get("fits_in_memory", True):
        return None
    mem = rec["memory"]
    parts = {k: float(mem[k]) for k in MEMORY_TERMS if k in mem}
    total = sum(parts.values())
    term = max(parts, key=parts.get)
    ranked = ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
    return (f"{term} dominate: {parts[term]:.1f} of {total:.1f} GiB per GPU on stage {mem.get('stage', 0)} "
            f"({ranked} GiB); shrink them with " + ", ".join(_levers(term, rec["plan"], moe)))


def _single_changes(plan: dict, req=None) -> list[list[tuple[str, dict]]]:
    """Families of (flag, request fields) of the one-flag changes that shrink memory without changing the layout:
    the next ZeRO stages (gradients, then weights sharded over DP), full recomputation, bf16 main gradients
    (Megatron --main-grads-dtype / --grad-reduce-in-bf16) where they are fp32, and Megatron-Core's fine-grained
    activation offloading where nothing is offloaded yet (costmodel.core.specs.memory_features.offload_steps, one
    family: its first fitting set is offered)."""
    zero = plan.get("zero", 0)
    out = [[(f"--zero {z}", {"zero": z})] for z in range(zero + 1, 4)]
    if plan.get("recompute") != "full":
        out.append([("--recompute full", {"recompute": "full"})])
    if req is not None and getattr(req, "main_grads_dtype", None) in ("", "fp32") and plan.get("dtype") != "fp16":
        out.append([("--main-grads-dtype bf16", {"main_grads_dtype": "bf16"})])
    if req is not None and not getattr(req, "offload_modules", ()) and plan.get("framework") == "megatron" \
            and plan.get("recompute") != "full":
        moe = "moe_dispatcher" in plan  # a prediction record's plan names its dispatcher only for MoE models
        out.append([(f"--offload-modules {','.join(mods)}", {"offload_modules": mods}) for mods in offload_steps(moe)])
    return out


def fitting_changes(req, rec: dict, predict: Callable[[object], dict]) -> str | None:
    """For a record that does not fit: the one-flag changes of :func:`_single_changes` under which the same layout
    fits (of a family, the first that fits), each costed by ``predict`` (a request -> prediction record, the
    command's own), with its memory and time; None when the plan fits or no such change makes it fit."""
    if rec.get("fits_in_memory", True):
        return None
    if getattr(req, "zero", None) == AUTO_ZERO:  # each change is costed at the stage the record was costed at
        req = dataclasses.replace(req, zero=rec["plan"]["zero"])
    found = []
    for family in _single_changes(rec["plan"], req):
        for flag, change in family:
            try:
                alt = predict(dataclasses.replace(req, **change))
            except PlannerError:  # not a valid plan for this framework or model: not offered
                continue
            if alt.get("fits_in_memory"):
                once = any(str(w).startswith("ZeRO-2:") for w in alt.get("warnings", ()))
                found.append(f"{flag} ({alt['memory_gib_per_gpu']:.1f} GiB, {alt['iteration_time_s']:.4g} s per "
                             "iteration" + (" with one gradient reduce-scatter per iteration; its warning bounds a "
                                            "per-micro-batch one" if once else "") + ")")
                break
    return "the same layout fits with " + "; or ".join(found) if found else None


def plan_keys(plan) -> dict:
    """The keys of a prediction record's ``plan`` dict that :func:`memory_advice` reads, from a ParallelPlan."""
    return {"zero": plan.zero, "tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "seq_len": plan.seq_len,
            "mbs": plan.mbs, "recompute": plan.recompute}
