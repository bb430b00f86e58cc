"""Block-scaled FP8 training GEMMs (``dtype='fp8-block'``, Blackwell alias ``mxfp8``), from aiconfigurator's
measured ``fp8_block`` GEMMs.

What is measured (shared/data/aiconfigurator/PROVENANCE.md, gemm/ section): TRT-LLM ``Linear`` with
``QuantAlgo.FP8_BLOCK_SCALES``: E4M3 weights with one scale per 128x128 weight block, activations quantised per
1x128 group **inside the timed call**. Hopper (h100_sxm, h200_sxm): ``fp8_quantize_1x128`` +
``fp8_block_scaling_gemm``, FP32 scales (kernel_source torch_flow). Blackwell (b200_sxm, gb200, b300_sxm, gb300):
DeepGEMM with UE8M0 (power-of-two) scales (kernel_source deepgemm). Only n, k >= 128 were measured.

How it is costed, without touching the fitted GEMM regressors: an fp8-block GEMM is costed as the per-tensor
``fp8`` GEMM of the same shape (the existing models, trained on aiconfigurator's per-tensor fp8 rows, whose
latency includes the dynamic amax + cast of x), times the measured ratio
``latency(fp8_block) / latency(fp8)`` of the same GPU, summarised as the median over the shapes of one
(log2 m, log2 n, log2 k) cell (:data:`LOG2_EDGES`). Both tables come from the same collector, grid and
TRT-LLM version (1.3.0rc20), so the ratio carries the block kernel's speed *and* the difference between the
two activation quantisations (per-tensor amax pass vs per-1x128-group scales); no separate quantisation pass
is added, because both timings include theirs. Every other operator is costed as under ``fp8``.

Approximations (stated in each prediction's note):

* ``mxfp8`` is treated as the same dtype. True MXFP8 (OCP Microscaling; Transformer Engine's MXFP8BlockScaling,
  torchao's MXFP8 for torchtitan) scales every 1x32 element block with an E8M0 (power-of-two) scale. The
  Blackwell data are DeepGEMM with UE8M0 power-of-two scales, i.e. MXFP8-*style* scale values, but on
  1x128 (activation) / 128x128 (weight) blocks: 4x (activations) to 512x (weights) fewer scales than MXFP8, so
  the scale loads and the quantisation pass of true MXFP8 are somewhat heavier than measured. On Hopper
  (no MXFP8 tensor cores) ``fp8-block`` is DeepSeek-V3-style blockwise FP8 with FP32 scales, as measured.
* The ratio is measured on forward ``x W^T`` GEMMs; the dgrad and wgrad GEMMs (costed by the forward model
  with swapped shapes, as for every dtype) get the ratio of their own (m, n, k).
* Shapes outside the measured grid take the nearest cell (n or k below 128, which block scaling cannot tile,
  take the n, k >= 128 cells).

Dies: the ratio is a property of the kernel on one die, used for the GPUs of that die (:data:`DIES`, as
costmodel/cost/moe_kernels.py does); other GPUs are refused in one line.

Fitted by ``python -m costmodel.cost.fp8_block`` into ``costmodel/data/fp8_block.json`` (with provenance).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import fitted_table_main
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.plan import ParallelPlan
from costmodel.graph.build import OperatorGraph
from costmodel.graph.ops import Op

if TYPE_CHECKING:  # annotations only: costmodel.schedule (the composition) sits above costmodel.cost
    from costmodel.schedule.compose import OperatorTimes

TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "fp8_block.json"
DTYPE = "fp8-block"
"""Plan dtype: block-scaled FP8 GEMMs, bf16 elsewhere (as ``fp8``)."""
ALIASES = {"mxfp8": DTYPE}
"""Accepted names that mean the same dtype here (see the module docstring for the MXFP8 approximation)."""
COSTED_AS = "fp8"
"""The dtype whose fitted models cost the operators before the ratio is applied."""
MIN_NK = 128
"""PROVENANCE.md: the fp8_block GEMMs exist only for n, k >= 128 (block size 128); rows below are dropped."""
LOG2_EDGES = (0, 3, 6, 9, 11, 13, 15)
"""Cell edges in log2 of each of m, n, k (last cell open): an octave pair or three per cell, finer where the
ratio changes fastest (m, n, k 512-8192, where launch/quantisation overheads give way to tensor-core time)."""

DIES = {
    "h100_sxm": {"die": "GH100", "kernel": "torch_flow (fp8_quantize_1x128 + fp8_block_scaling_gemm, FP32 scales)",
                 "gpus": ["h100-sxm", "gh200", "gh200-144gb", "h100-sxm-500w"]},
    "h200_sxm": {"die": "GH100", "kernel": "torch_flow (FP32 scales)", "gpus": ["h200"]},
    "b200_sxm": {"die": "GB100", "kernel": "deepgemm (UE8M0 scales)", "gpus": ["b200"]},
    "gb200": {"die": "GB100", "kernel": "deepgemm (UE8M0 scales)", "gpus": ["gb200"]},
    "b300_sxm": {"die": "GB110", "kernel": "deepgemm (UE8M0 scales)", "gpus": ["b300"]},
    "gb300": {"die": "GB110", "kernel": "deepgemm (UE8M0 scales)", "gpus": ["gb300"]},
}
"""aiconfigurator system -> die, kernel and the catalogue GPUs that use its ratio (same-die siblings as in
costmodel/cost/moe_kernels.py DIES; NVIDIA H100/H200/GH200 and B200/GB200 datasheets)."""
VERSION = "trtllm-1.3.0rc20"


def canonical(dtype: str) -> str:
    """``mxfp8`` -> ``fp8-block``; any other name unchanged."""
    return ALIASES.get(dtype, dtype)


BLACKWELL_DIES = ("GB100", "GB110")
RECIPE_NOTES = {
    "blockwise": "Transformer Engine Float8BlockScaling (1x128 activation / 128x128 weight tiles, FP32 scales), "
                 "the recipe of the Hopper data this plan was costed with",
    "mxfp8": "Transformer Engine MXFP8BlockScaling (1x32 blocks, E8M0 scales; Blackwell only); costed with DeepGEMM's "
             "UE8M0 1x128 / 128x128 block data, finer MXFP8 scales not measured",
}
"""What each Megatron ``--fp8-recipe`` (megatron/training/arguments.py @307dcf37: tensorwise, delayed, mxfp8,
blockwise) means for this dtype."""


def megatron_recipe(gpu: str | None) -> str:
    """``mxfp8`` on Blackwell GPUs (whose measured kernel uses MXFP8-style power-of-two scales and which have
    MXFP8 tensor cores), ``blockwise`` otherwise (Hopper: DeepSeek-style 128-tile FP32 scales, as measured)."""
    system = system_for(gpu) if gpu else None
    return "mxfp8" if system is not None and DIES[system]["die"] in BLACKWELL_DIES else "blockwise"


# ------------------------------------------------------------------------------------------------ fit
def _load(path: Path) -> dict[tuple[int, int, int], float]:
    with open(path, newline="") as f:
        return {(int(r["m"]), int(r["n"]), int(r["k"])): float(r["latency_ms"]) for r in csv.DictReader(f)}


def usable(m: int, n: int, k: int) -> bool:
    """Shapes block scaling can tile (n, k >= 128, PROVENANCE.md)."""
    return m >= 1 and n >= MIN_NK and k >= MIN_NK


def cell(m: float, n: float, k: float) -> tuple[int, int, int]:
    """Cell index of a shape in :data:`LOG2_EDGES` (n, k below 128 clamp to 128)."""
    def idx(x: float) -> int:
        lx = math.log2(max(x, 1.0))
        return max(0, sum(1 for e in LOG2_EDGES[1:] if lx >= e))
    return idx(m), idx(max(n, MIN_NK)), idx(max(k, MIN_NK))


def fit_system(per_tensor: dict, block: dict) -> dict:
    """Median block / per-tensor latency ratio per cell over the shapes measured in both, with the in-sample
    error of ``per-tensor latency x cell ratio`` against the measured block latency."""
    cells: dict[tuple[int, int, int], list[float]] = {}
    pairs = [(key, v, per_tensor[key]) for key, v in block.items() if usable(*key) and key in per_tensor]
    for key, v, t in pairs:
        cells.setdefault(cell(*key), []).append(v / t)
    med = {c: statistics.median(v) for c, v in cells.items()}
    ape = sorted(abs(t * med[cell(*key)] - v) / v for key, v, t in pairs)
    return {"cells": {",".join(map(str, c)): [round(med[c], 6), len(cells[c])] for c in sorted(med)},
            "pairs": len(pairs), "block_rows": len(block),
            "check": {"mape": sum(ape) / len(ape), "median_ape": ape[len(ape) // 2],
                      "p90_ape": ape[int(0.9 * (len(ape) - 1))],
                      "method": "measured fp8 (per-tensor) latency x cell median ratio vs measured fp8_block latency, "
                                "in sample"}}


def fit(data_dir: Path) -> dict:
    gemm = data_dir / "aiconfigurator" / "gemm"
    systems = {}
    for system, info in DIES.items():
        pt = _load(gemm / f"{system}_fp8_gemm__{VERSION}.csv")
        bl = _load(gemm / f"{system}_fp8_block_gemm__{VERSION}.csv")
        systems[system] = {**info, **fit_system(pt, bl),
                           "files": [f"aiconfigurator/gemm/{system}_fp8_gemm__{VERSION}.csv",
                                     f"aiconfigurator/gemm/{system}_fp8_block_gemm__{VERSION}.csv"]}
    return {"log2_edges": list(LOG2_EDGES), "min_nk": MIN_NK, "systems": systems,
            "provenance": "shared/data/aiconfigurator (ai-dynamo/aiconfigurator @095f58a5, TRT-LLM 1.3.0rc20 "
                          "gemm_perf.parquet, gemm_dtype fp8 and fp8_block; PROVENANCE.md)"}


# ------------------------------------------------------------------------------------------------ use
@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(TABLE_PATH.read_text())


def system_for(gpu: str) -> str | None:
    for system, info in DIES.items():
        if gpu in info["gpus"]:
            return system
    return None


def supported(gpu) -> bool:
    """fp8 tensor cores and block-scaled FP8 GEMM measurements for this GPU spec's die."""
    return gpu.has_fp8 and system_for(gpu.measured_as) is not None


def check_gpu(gpu: str) -> str:
    """The aiconfigurator system whose ratio ``gpu`` uses; refuses ``fp8-block`` on a GPU without block-scaled FP8
    GEMM measurements (one line)."""
    system = system_for(gpu)
    if system is None:
        have = ", ".join(g for info in DIES.values() for g in info["gpus"])
        raise PlannerError(f"--dtype fp8-block: no block-scaled FP8 GEMM measurements for {gpu} (aiconfigurator "
                           f"measured them for {have}); use --dtype fp8 or bf16.")
    return system


TRAINING_FLOOR = 1.0
"""Lower bound of the block / per-tensor ratio on the training basis (costmodel/graph/kernel_basis.py). The measured
latencies are inference kernels with the activation quantisation inside the call: TensorRT-LLM's per-tensor path
runs a separate dynamic amax + cast (a ~12 us floor, aiconfigurator PROVENANCE), DeepGEMM (Blackwell) fuses its
1x128 scaling, so the inference ratio drops to 0.4-0.7 (median 0.68 on B200 / GB200, 0.91 on H100). Per-tensor
fp8 GEMM kernels alone run at aiconfigurator's large-shape latency (torch._scaled_mm with static scales on H100:
0.98-1.09 of it at 8192^3 and 4096 x 12288 x 4096, reports/gpu-runs/h100-2026-11-27/ANALYSIS.md sec. 3), and a
block-scaled GEMM does the same tensor-core work plus its scale loads: it is never faster than the per-tensor GEMM
it is costed from (fp8-block >= fp8 on every GPU)."""


def ratio(gpu: str, m: float, n: float, k: float) -> float:
    """fp8_block / fp8 latency ratio of the cell of (m, n, k) on ``gpu``'s die (nearest cell if the cell was not
    measured), at least :data:`TRAINING_FLOOR`."""
    cells = table()["systems"][check_gpu(gpu)]["cells"]
    c = cell(m, n, k)
    key = ",".join(map(str, c))
    if key in cells:
        return max(TRAINING_FLOOR, float(cells[key][0]))
    near = min(cells, key=lambda s: sum((a - b) ** 2 for a, b in zip(map(int, s.split(",")), c)))
    return max(TRAINING_FLOOR, float(cells[near][0]))


class CostedAs:
    """A cost model that costs ``fp8-block`` operators as ``fp8`` (the ratio comes after, in :func:`apply`)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def predict(self, ops: Sequence[Op], hardware: Hardware):
        return self.inner.predict([replace(o, dtype=COSTED_AS) if o.dtype == DTYPE else o for o in ops], hardware)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def cost_model_for(plan: ParallelPlan, cost_model):
    """``cost_model`` itself unless the plan is fp8-block."""
    return CostedAs(cost_model) if plan.dtype == DTYPE else cost_model


def apply(plan: ParallelPlan, hardware: Hardware, graph: OperatorGraph, times: OperatorTimes) -> OperatorTimes:
    """fp8-block plans: every ``fp8-block`` GEMM's time (interval ends too) times :func:`ratio`, with a note;
    ``times`` itself otherwise."""
    if plan.dtype != DTYPE:
        return times
    gpu = hardware.gpu.measured_as
    system = check_gpu(gpu)
    factors = {k: ratio(gpu, *o.features[:3]) for k, o in graph.distinct_operators().items()
               if o.kind == "gemm" and o.dtype == DTYPE}
    info = DIES[system]
    note = (f"fp8-block GEMMs: the fp8 (per-tensor) GEMM times x the measured fp8_block / fp8 latency ratio of "
            f"aiconfigurator {system} ({info['kernel']}; 1x128 activation / 128x128 weight scales, quantisation "
            f"included in both timings; MXFP8's 1x32 scales not measured), at least 1 (a block-scaled GEMM is "
            f"never faster than the per-tensor one, fp8_block.TRAINING_FLOOR)")
    if DIES[system]["gpus"][0] != gpu:
        note += f"; {gpu} uses the {info['die']} ratio measured on {DIES[system]['gpus'][0]}"
    scaled = times.scaled(lambda t: {k: v * factors.get(k, 1.0) for k, v in t.items()})
    return replace(scaled, warnings=times.warnings + (note,))


def main(argv: list[str] | None = None) -> int:
    return fitted_table_main(argv, "Fit the fp8_block / fp8 GEMM latency ratio table from shared/data.",
                             TABLE_PATH, fit)


if __name__ == "__main__":
    raise SystemExit(main())
