"""One basis for GPUs without measurements of their own: borrow the measured models of the same silicon.

A GPU the public data never measured used to be costed by the analytical roofline with the median
efficiencies of the measured GPUs, while its sibling with the same chip used measured regressors: A100-40GB
came out 1.7x slower than A100-80GB on a 125M-parameter FSDP plan (issue 15) although it differs only in
HBM. Here such a GPU borrows the sibling's measured models and each operator's time is scaled by the
roofline's ratio between the two GPUs' datasheet figures (same efficiencies, the sibling's, on both sides):
compute-bound operators by the peak ratio, memory-bound ones by the HBM-bandwidth ratio, the launch floor
unchanged, collectives by the ratio of the alpha-beta model on the plan's node type (1 on the same node).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from costmodel.core.specs.hardware import GPUSpec, Hardware
from costmodel.cost.roofline import RooflineCostModel
from costmodel.ops import Op

SAME_SILICON: dict[str, tuple[str, str]] = {
    "a100-40gb": ("a100-80gb", "the same GA100 configuration (108 SMs, 1,410 MHz boost, the same tensor-core "
                  "peaks; NVIDIA A100 datasheet, catalogue source nv_a100_datasheet) with HBM2 instead of HBM2e"),
}
"""GPU without measurements -> (measured GPU with the same SM count, clocks and peaks, why). Used only when the
catalogue also gives both the same peak for every dtype (checked by :func:`donor_for`)."""

POWER_CAPPED: dict[str, tuple[str, str]] = {
    "h100-sxm-500w": ("h100-sxm", "the same GH100 (132 SMs) at a 500 W power cap with HBM2e at 2.4 TB/s; its "
                      "catalogue peaks are the H100 SXM's scaled to the cap"),
}
"""GPU without measurements -> (measured GPU of the same chip run at another power limit, why): the peaks
differ by the catalogue's power-cap scaling, so the equal-peak check of SAME_SILICON does not apply."""


def donor_for(gpu: GPUSpec, catalogue_gpu) -> tuple[GPUSpec, str] | None:
    """(the measured sibling's spec, note) for ``gpu``, or None. ``catalogue_gpu(name)`` looks a spec up. A sibling
    declared in a hardware file (``GPUSpec.sibling``) comes first, with the same scaling."""
    declared = (gpu.sibling, "declared the same silicon in its hardware file") if gpu.sibling else None
    entry = declared or SAME_SILICON.get(gpu.name) or POWER_CAPPED.get(gpu.name)
    if entry is None:
        return None
    name, why = entry
    try:
        donor = catalogue_gpu(name)
    except Exception:  # noqa: BLE001 - a custom catalogue without the sibling: no borrowing
        return None
    if declared is None and gpu.name in SAME_SILICON and donor.peak_tflops != gpu.peak_tflops:
        return None
    bf16 = gpu.peak_tflops.get("bf16", 0.0)
    note = (f"no measurements of {gpu.name}: operator times derived from {name} measurements ({why}), scaled per "
            f"operator by the roofline ratio (HBM {gpu.hbm_bw_gbs:,.0f} vs {donor.hbm_bw_gbs:,.0f} GB/s, bf16 peak "
            f"{bf16:g} vs {donor.peak_tflops.get('bf16', 0.0):g} TFLOP/s; catalogue)")
    return donor, note


def roofline_ratio(roof: RooflineCostModel, ops: Sequence[Op], target: Hardware, donor: Hardware) -> np.ndarray:
    """Per operator: roofline time on ``target`` / on ``donor``, both with the donor's fitted efficiencies."""
    as_donor = Hardware(gpu=replace(target.gpu, name=donor.gpu.name), cluster=target.cluster)
    num = roof.predict(ops, as_donor).time_s
    den = roof.predict(ops, donor).time_s
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
