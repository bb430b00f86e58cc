"""LLMCompass A100 (llmcompass-a100/PROVENANCE.md): real-hardware GEMMs, an independent spot check."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.importers.builder import Builder
from costmodel.fitting.datasets.importers.registry import register, source_root
from costmodel.fitting.datasets.importers.table import read_table
from costmodel.fitting.datasets.schema import Dataset

LLMCOMPASS_GPU = "a100-80gb"
"""The catalogue GPU of LLMCompass's 'real hardware' A100 files (80 GB assumed from the simulator config)."""


@register("llmcompass-a100")
def import_llmcompass(data: Path) -> list[Dataset]:
    """LLMCompass 'real hardware' A100 GEMMs as spot-check rows (role spot_check) of gemm on a100-80gb."""
    b = Builder("llmcompass-a100")
    root = source_root(data, "llmcompass-a100")
    t = read_table(data, root / "matmul_A100.csv", ("M", "N", "K", "latency", "throughput"), strip=True)
    lat = []
    for i, v in enumerate(t.text("latency")):
        m = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*ms", v)
        if m is None:
            raise PlannerError(f"source file {t.rel} line {i + 2}, column 'latency': {v!r} is not '<number>ms'")
        lat.append(float(m[1]) * 1e-3)
    fp = {"device": "Real NVIDIA A100 (plot legend); SKU, software and timing method not stated (simulator "
                    "config A100_80GB_fp16)", "source": "github.com/PrincetonUniversity/LLMCompass @ 2e015fd2"}
    b.add(t, "gemm", LLMCOMPASS_GPU, "fwd", "fp16", {"m": t.num("M"), "n": t.num("N"), "k": t.num("K")},
          np.array(lat), column="latency", fingerprint=fp, role="spot_check")
    b.note([("gemm", LLMCOMPASS_GPU)], "llmcompass-a100 matmul rows (role spot_check): an independent A100 check, "
                                    "fp16 and 80 GB assumed from the simulator config; hold them out of fits. "
                                    "softmax/layernorm/gelu files not imported (throughput only, no time per call)")
    return b.datasets()


