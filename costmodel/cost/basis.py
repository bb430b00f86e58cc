"""One basis across GPUs of one die: borrow the measured models of the same silicon, and never cost a part
slower than a sibling it matches or beats on every datasheet figure.

Three rules, applied by :class:`~costmodel.cost.measured.MeasuredCostModel`:

* **Whole-GPU donors** (:func:`donor_for`): a GPU the public data never measured (A100-40GB, the 500 W H100, the
  H800, the HBM3e GH200, B300 / GB300) is costed by its measured sibling's models, each operator's time scaled by
  the roofline's ratio between the two GPUs' datasheet figures (same efficiencies, the sibling's, on both sides):
  compute-bound operators by the peak ratio, memory-bound ones by the HBM-bandwidth ratio, the launch floor
  unchanged. Without this A100-40GB came out 1.7x slower than A100-80GB on a 125M-parameter FSDP plan although it
  differs only in HBM.
* **Per-kind siblings** (:func:`siblings`): a measured GPU without a model of some operator on the fused kernel
  basis (costmodel/graph/kernel_basis.py; GH200's RoPE, cross entropy and attention were measured only as eager chains
  or FlashAttention-2), or whose model does not cover the operator (a dtype it never ran, an intra-node collective
  sampled only across nodes), takes its same-die sibling's model, scaled the same way. A collective is borrowed
  only where the sibling's NVLink figure equals the node type's (its measurements describe that link).
* **Same-die envelope** (:func:`dominates`): where a GPU matches or beats a measured sibling of its die on every
  datasheet figure (peaks within 1 %, HBM bandwidth, NVLink), a compute operator never takes longer than on that
  sibling scaled by the roofline ratio: the same kernel on the same SMs with no less memory bandwidth cannot be
  slower, and where two measured tables disagree (different collectors and input data) the faster one stands.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from costmodel.core.specs.hardware import GPUSpec, Hardware
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.ops import Op

SAME_SILICON: dict[str, tuple[str, str]] = {
    "a100-40gb": ("a100-80gb", "the same GA100 configuration (108 SMs, 1,410 MHz boost, the same tensor-core "
                  "peaks; NVIDIA A100 datasheet, catalogue source nv_a100_datasheet) with HBM2 instead of HBM2e"),
}
"""GPU without measurements -> (measured GPU with the same SM count, clocks and peaks, why). Used only when the
catalogue also gives both the same peak for every dtype (checked by :func:`donor_for`)."""

SAME_SILICON.update({
    "h800": ("h100-sxm", "the H100 SXM's GH100 with the same tensor cores and HBM, NVLink cut from 900 to 400 GB/s "
             "(DeepSeek-AI, 'Insights into DeepSeek-V3', ISCA 2025, arXiv:2505.09343, sec. 4.1; catalogue source "
             "deepseek_isca_h800)"),
    "gh200-144gb": ("h200", "the GH100 of the H200 (132 SMs, the same peaks) with HBM3e, in a Grace Hopper module "
                    "(catalogue, stas00_accel)"),
})

POWER_CAPPED: dict[str, tuple[str, str]] = {
    "h100-sxm-500w": ("h100-sxm", "the same GH100 (132 SMs) at a 500 W power cap with HBM2e at 2.4 TB/s; its "
                      "catalogue peaks are the H100 SXM's scaled to the cap"),
}
"""GPU without measurements -> (measured GPU of the same chip run at another power limit, why): the peaks
differ by the catalogue's power-cap scaling, so the equal-peak check of SAME_SILICON does not apply."""

SAME_ARCHITECTURE: dict[str, tuple[str, str]] = {
    "b300": ("b200", "the Blackwell SM generation of the B200 (Blackwell Ultra; dense BF16 / FP8 peaks equal to the "
             "B200's in the catalogue, aic_system_b300_sxm), whose aiconfigurator sweeps planner fit does not import"),
    "gb300": ("gb200", "the Blackwell SM generation of the GB200 (Blackwell Ultra; dense BF16 / FP8 peaks equal to "
              "the GB200's in the catalogue, aic_system_gb300), whose aiconfigurator sweeps planner fit does not "
              "import"),
}
"""GPU without measurements -> (measured GPU of the same SM architecture on another die, why)."""

DIES: dict[str, tuple[str, ...]] = {
    "GH100": ("h100-sxm", "h200", "gh200", "gh200-144gb", "h800", "h100-sxm-500w"),
    "GA100": ("a100-80gb", "a100-40gb"),
    "GB100": ("b200", "gb200"),
}
"""GPUs built on one die with the same SM count (Hopper whitepaper v1.04 and the JSC JUPITER page: 132 SMs for
H100 SXM5, H200 and GH200; A100 datasheet: 108 SMs for both A100s; the GB200 NVL72 and DGX B200 pages: the same
Blackwell GPU). H100 PCIe (114 SMs) is a different configuration and is not listed."""

SAME_PEAK_TOLERANCE = 0.01
"""Peaks within 1 % are the same chip at the same clocks (datasheet rounding: GH200 989.0 vs H100 SXM 989.4)."""


def donor_for(gpu: GPUSpec, catalogue_gpu) -> tuple[GPUSpec, str] | None:
    """(the measured sibling's spec, note) for ``gpu``, or None. ``catalogue_gpu(name)`` looks a spec up. A sibling
    declared in a hardware file (``GPUSpec.sibling``) comes first, with the same scaling."""
    declared = (gpu.sibling, "declared the same silicon in its hardware file") if gpu.sibling else None
    entry = declared or SAME_SILICON.get(gpu.name) or POWER_CAPPED.get(gpu.name) or SAME_ARCHITECTURE.get(gpu.name)
    if entry is None:
        return None
    name, why = entry
    try:
        donor = catalogue_gpu(name)
    except Exception:  # noqa: BLE001 - a custom catalogue without the sibling: no borrowing
        return None
    if declared is None and gpu.name in SAME_SILICON and not same_peaks(gpu, donor):
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


def die_of(gpu: str) -> str | None:
    """The die (:data:`DIES` key) of catalogue GPU ``gpu``, or None."""
    return next((die for die, members in DIES.items() if gpu in members), None)


def siblings(gpu: GPUSpec, catalogue_gpu) -> list[GPUSpec]:
    """The other GPUs of ``gpu``'s die, nearest in HBM bandwidth first (then by name); [] off the table."""
    die = die_of(gpu.name)
    found = []
    for name in DIES.get(die, ()) if die else ():
        if name == gpu.name:
            continue
        try:
            found.append(catalogue_gpu(name))
        except Exception:  # noqa: BLE001 - a custom catalogue without the sibling
            continue
    return sorted(found, key=lambda g: (abs(g.hbm_bw_gbs - gpu.hbm_bw_gbs), g.name))


def same_peaks(a: GPUSpec, b: GPUSpec, tol: float = SAME_PEAK_TOLERANCE) -> bool:
    """Every dtype peak of ``b`` is within ``tol`` of ``a``'s (the same chip at the same clocks)."""
    return all(abs(a.peak_tflops.get(d, 0.0) - v) <= tol * v for d, v in b.peak_tflops.items())


def dominates(a: GPUSpec, b: GPUSpec) -> bool:
    """``a`` and ``b`` share a die and every datasheet figure of ``a`` (dense peaks, within 1 %; HBM bandwidth;
    NVLink bandwidth) is at least ``b``'s: ``a`` can run every kernel of ``b`` at least as fast."""
    if a.name == b.name or die_of(a.name) is None or die_of(a.name) != die_of(b.name):
        return False
    peaks = all(a.peak_tflops.get(d, 0.0) >= v * (1 - SAME_PEAK_TOLERANCE) for d, v in b.peak_tflops.items())
    return peaks and a.hbm_bw_gbs >= b.hbm_bw_gbs and a.nvlink_bw_gbs >= b.nvlink_bw_gbs
