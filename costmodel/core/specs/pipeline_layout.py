"""Explicit virtual-stage layouts (``ParallelPlan.pipeline_layout``): layers per virtual pipeline stage.

Sources
-------
* Megatron-Core ``--pipeline-model-parallel-layout`` (NVIDIA/Megatron-LM
  megatron/core/transformer/pipeline_parallel_layer_layout.py @00caa53af309, ``PipelineParallelLayerLayout``;
  docs "Custom Pipeline Model Parallel Layout", Megatron-Core 0.15 API guide; the feature, "Flexible Asymmetric
  Virtual Pipeline Parallelism with Custom Pipeline Layout", reached Megatron-LM by July 2025: NVIDIA-NeMo/
  Megatron-Bridge PR #255 of 2025-07-16 syncs its checkpointing from Megatron-LM commits 2795ebde972a and
  77732c3628ea; the commit that first added the parser was not located): a string of virtual stages split by
  ``|`` in virtual-stage order (virtual stage ``vpp_rank * PP + pp_rank``), ``E`` embedding, ``t`` decoder layer,
  ``m`` MTP layer, ``L`` loss; ``x*n`` and ``(...)*n`` repeat, commas are cosmetic; VPP = stages / PP;
  ``validate_layer_layout``: the first item is ``E``, the last ``L``, each once, the ``t`` count equals
  num_layers; "it is legal to have empty stages, e.g. E||t|L" (a virtual stage may hold 0 decoder layers).
* PyTorch pipelining splits module FQNs over PP x VPP virtual stages freely: torchtitan
  (pytorch/torchtitan torchtitan/distributed/pipeline_parallel.py @02ef790c ``generate_llm_fqn_per_model_part``,
  stage ``s`` of the looped schedule on rank ``s % PP``) and NeMo AutoModel (NVIDIA-NeMo/Automodel
  nemo_automodel/components/distributed/pipelining/functional.py @00f40419 ``generate_hf_model_fqn_per_model_part``:
  ``layers_per_stage = num_layers // num_stages``, the first ``num_layers % num_stages`` stages one more, the
  embedding added to stage 0 and norm + lm_head to the last without counting as layers; ``stage_ids_this_rank``
  style "loop": rank r runs stages r, r + PP, ...).

Rules planner applies (:func:`pipeline_layout_problem`): PP*VPP non-negative integers summing to the layers
(Megatron's; a virtual stage may be empty) and every physical stage (its VPP chunks together) holding at least
one layer (planner's cost model builds each stage from its layers; Megatron itself would accept an empty rank).

What the cost model does with a layout: each pipeline stage is costed from the layers its chunks hold
(``ParallelPlan.stage_layer_indices``), memory counts the peak of in-flight layers over the stage's interleaved op
order (costmodel.memory.per_gpu.layout_inflight), and the timeline (costmodel.schedule.timeline) still gives every chunk
1/VPP of its stage's time. That last part is an approximation: for the layouts of moe_runs.csv MOE-AUTOMODEL-001..003
(61 layers, chunks of 2 and 1 layers) a per-chunk variant of the simulator gives a makespan 0.5-2.1 % shorter than equal
chunks (PP4 VPP8 with 32 / 8 micro-batches, PP8 VPP4 with 16; chunk time proportional to its layers, backward 2x
forward).
"""

from __future__ import annotations

import re

from costmodel.core.errors import PlanError


def pipeline_layout_problem(layout: tuple[int, ...] | list[int], num_layers: int | None, pp: int,
                            vpp: int) -> str | None:
    """Why ``layout`` is not a valid layout of ``num_layers`` (None = unknown, not checked) over PP x VPP."""
    text = ",".join(map(str, layout))
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in layout):
        return f"pipeline_layout=[{text}] must hold non-negative integers (layers per virtual stage)"
    if len(layout) != pp * vpp:
        return (f"pipeline_layout=[{text}] has {len(layout)} virtual stages; PP*VPP = {pp}*{vpp} = {pp * vpp} "
                "needed (one entry per virtual stage, virtual stage a*PP + b = chunk a of stage b)")
    if num_layers is not None and sum(layout) != num_layers:
        return f"pipeline_layout=[{text}] holds {sum(layout)} layers; the model has {num_layers}"
    empty = [b for b in range(pp) if sum(layout[b::pp]) == 0]
    if empty:
        return (f"pipeline_layout=[{text}] leaves pipeline stage(s) {', '.join(map(str, empty))} without layers; "
                "give every stage at least one layer")
    return None


def balanced_pipeline_layout(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """PyTorch pipelining's default split (NeMo AutoModel ``generate_hf_model_fqn_per_model_part``): the layers
    spread over the PP*VPP virtual stages as evenly as possible, the first ``num_layers % (PP*VPP)`` one more."""
    n = pp * vpp
    base, extra = divmod(num_layers, n)
    return tuple(base + (1 if s < extra else 0) for s in range(n))


def parse_pipeline_layout(text: str, pp: int) -> tuple[tuple[int, ...], int]:
    """(layers per virtual stage, VPP) from ``'2,2,1,...'`` (one count per virtual stage) or Megatron's layout
    string (``'Et|(tt|)*30L'``: only E, t, L; E first, L last). Raises PlanError with a one-line reason."""
    s = text.strip()
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", s):
        counts = tuple(int(x) for x in s.split(","))
    else:
        counts = _parse_megatron(s)
    if pp < 1 or len(counts) % pp:
        raise PlanError(f"pipeline layout '{text}' has {len(counts)} virtual stages, not a multiple of PP={pp}")
    return counts, len(counts) // pp


def _parse_megatron(s: str) -> tuple[int, ...]:
    """Megatron-Core ``PipelineParallelLayerLayout.parse_str_to_list``, counting decoder layers per stage."""
    flat = s.replace(",", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), flat)
    bad = sorted(set(flat) - set("EtL|"))
    if bad:
        raise PlanError(f"pipeline layout '{s}': unknown item(s) {''.join(bad)}; give counts per virtual stage "
                        "('2,2,1') or Megatron's syntax with E (embedding), t (layer), L (loss) (MTP 'm' not modelled)")
    items = flat.replace("|", "")
    if not items or items[0] != "E" or items[-1] != "L" or items.count("E") != 1 or items.count("L") != 1:
        raise PlanError(f"pipeline layout '{s}': Megatron's layout starts with E (embedding) and ends with L (loss), "
                        "each once, e.g. 'Et|(tt|)*30L'")
    return tuple(stage.count("t") for stage in flat.split("|"))


def describe_split(split: tuple[int, ...] | list[int] | None) -> str:
    """Compact text of layers per stage (a layer split, or a layout's layers per virtual stage), runs collapsed:
    (7, 8, ..., 8, 7) -> '7,8x14,7'; '' for None."""
    if not split:
        return ""
    parts: list[str] = []
    i = 0
    while i < len(split):
        j = i
        while j < len(split) and split[j] == split[i]:
            j += 1
        parts.append(f"{split[i]}x{j - i}" if j - i > 1 else str(split[i]))
        i = j
    return ",".join(parts)
