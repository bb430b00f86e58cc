"""Feature vectors per operator kind (vectorised numpy; cheap enough for the predict path).

Columns, in order (:func:`feature_names`):

* the paper's raw features ``FEATURES[kind]`` (Zhang et al. arXiv 2509.22832 §III-B: GEMM [m, n, k],
  attention [b, s, heads, head dim], collectives [bytes, ranks, nodes, GPUs per node]) and ``log2`` of
  each (``log2(max(x, 1))``);
* compute kinds: ``dtype_bytes`` (GEMM and attention), ``log2_flops``, ``log2_bytes``, ``log2_ai``
  (arithmetic intensity, FLOPs per byte) where FLOPs are defined;
* GEMM: tile/wave quantisation features (:func:`gemm_tile_features`): ``log2`` of the number of
  128x128 output tiles and, for each SM count in :data:`WAVE_SM_COUNTS`, the fractional part and
  ``log2`` of the ceiling of tiles / SMs (a last partial wave costs a whole wave);
* collectives: ``log2_bytes`` and the nccl-tests bus-bandwidth factor of the op at that rank count;
* last: ``roofline_s``, the *unit-efficiency* roofline time (:func:`unit_roofline`), so that
  ``time / roofline_s`` is a pure learned inverse efficiency.

The device constants (peak FLOP/s per dtype, HBM and link bandwidths) are stored in each artifact's
metadata and re-used at prediction time, so an artifact is self-consistent even if the catalogue
changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from costmodel.core.kinds import COLLECTIVE_KINDS, FEATURES
from costmodel.graph.conventions import (
    attention_bytes,
    attention_fwd_flops,
    busbw_factor,
    dtype_bytes,
    gemm_flops,
    mem_bytes,
)

ATTENTION_BWD_FLOP_FACTOR = 2.5
"""Backward FLOPs of fused attention / forward FLOPs (FlashAttention-2, Dao 2023, §4.1: the backward
pass does 2.5x the matmul FLOPs of the forward: five matmuls vs two, one of them a recomputation)."""

GEMM_TILE = 128
"""Edge of the output tile the GEMM quantisation features count in (a definition of those features:
128x128 is a common CUTLASS/cuBLAS tensor-core tile; the trees learn what the real tiling does)."""
WAVE_SM_COUNTS = (108, 132, 148)
"""SM counts the wave features divide by: A100 (108), H100 SXM / H200 (132), B200 (148), from
shared/data/hardware/gpus.yaml ``sm_count`` (the catalogue carries no SM count, so every GEMM model
gets all three; kept because they lowered grouped-CV MAPE on h100-sxm and a100-80gb, see
reports/costmodel.md)."""

REF_COL = -1
"""Index of ``roofline_s`` in the feature matrix."""


@dataclass(frozen=True)
class DeviceConstants:
    """Figures that normalise features on one device (datasheet values from the catalogue, or the
    nominal normalisers of :data:`CPU_NOMINAL` for the CPU)."""

    peak_flops: dict = field(default_factory=dict)
    """Dense peak FLOP/s by dtype (bf16, fp16, fp8, fp32...)."""
    hbm_bw: float = 0.0
    """Memory bandwidth, bytes/s."""
    intra_bw: float = 0.0
    """Per-GPU per-direction bandwidth inside a node, bytes/s."""
    inter_bw: float = 0.0
    """Per-GPU per-direction network bandwidth across nodes, bytes/s."""

    def peak(self, dtype: str) -> float:
        p = self.peak_flops
        return float(p.get(dtype) or p.get("bf16") or p.get("fp16") or next(iter(p.values())))

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "DeviceConstants":
        return DeviceConstants({k: float(v) for k, v in d["peak_flops"].items()}, float(d["hbm_bw"]),
                               float(d["intra_bw"]), float(d["inter_bw"]))

    @staticmethod
    def from_hardware(hw) -> "DeviceConstants":
        g, c = hw.gpu, hw.cluster
        return DeviceConstants({k: v * 1e12 for k, v in sorted(g.peak_tflops.items())}, g.hbm_bw_gbs * 1e9,
                               c.intra_node_bw_gbs * 1e9, c.inter_node_bw_gbs * 1e9)


CPU_NOMINAL = DeviceConstants({"bf16": 1e12, "fp16": 1e12, "fp32": 1e12}, 1e11, 1e10, 1e10)
"""Nominal normalisers for the CPU (NOT hardware figures: round numbers; the regressor learns the
ratio to them, so their values only scale the target)."""


def feature_names(kind: str) -> tuple[str, ...]:
    raw = FEATURES[kind]
    logs = tuple(f"log2_{f}" for f in raw)
    extra: tuple[str, ...]
    if kind in COLLECTIVE_KINDS:
        extra = ("log2_bytes_total", "busbw_factor")
    elif kind in ("gemm", "attention_fwd", "attention_bwd"):
        extra = ("dtype_bytes", "log2_flops", "log2_bytes_total", "log2_ai")
        if kind == "gemm":
            extra += (f"log2_tiles{GEMM_TILE}",) + tuple(
                f"{f}_{s}sm" for s in WAVE_SM_COUNTS for f in ("waves_frac", "log2_waves_ceil"))
    else:
        extra = ("log2_bytes_total",)
    return raw + logs + extra + ("roofline_s",)


def _log2(x) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=float), 1.0))


def gemm_tile_features(raw: np.ndarray) -> np.ndarray:
    """[n, 1 + 2·len(WAVE_SM_COUNTS)]: log2 of the GEMM_TILE² output tiles of (m, n) and, per SM count S,
    frac(tiles / S) and log2(ceil(tiles / S)) (in the order of :func:`feature_names`)."""
    m, n = raw[:, 0], raw[:, 1]
    tiles = np.maximum(np.ceil(m / GEMM_TILE) * np.ceil(n / GEMM_TILE), 1.0)
    cols = [np.log2(tiles)]
    for s in WAVE_SM_COUNTS:
        w = tiles / s
        cols += [w - np.floor(w), np.log2(np.ceil(w))]
    return np.stack(cols, 1)


def flops_bytes(kind: str, raw: np.ndarray, dtype_b: np.ndarray, backward: bool) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) per row with the conventions of :mod:`costmodel.cost.roofline`."""
    cols = {f: raw[:, i] for i, f in enumerate(FEATURES[kind])}
    n = raw.shape[0]
    if kind == "gemm":
        m, nn, k = cols["m"], cols["n"], cols["k"]
        return gemm_flops(m, nn, k), dtype_b * (m * k + k * nn) + 2.0 * m * nn
    if kind in ("attention_fwd", "attention_bwd"):
        f = attention_fwd_flops(cols["batch"], cols["seq_q"], cols["seq_kv"], cols["heads"], cols["head_dim"],
                                cols["causal"])
        b = attention_bytes(cols["batch"], cols["seq_q"], cols["seq_kv"], cols["heads"], cols["kv_heads"],
                            cols["head_dim"])
        if kind == "attention_bwd":
            f = f * ATTENTION_BWD_FLOP_FACTOR
        return np.asarray(f, dtype=float), np.asarray(b, dtype=float)
    if kind in COLLECTIVE_KINDS:
        return np.zeros(n), cols["bytes"].astype(float)
    return np.zeros(n), np.asarray(mem_bytes(kind, cols, backward), dtype=float) * np.ones(n)


def unit_roofline(kind: str, raw: np.ndarray, dtype_b: np.ndarray, backward: bool, dev: DeviceConstants,
                  dtypes=None) -> np.ndarray:
    """Roofline time at efficiency 1 (Williams et al., CACM 2009, eq. 1): ``max(F / peak, B / bw)``.

    Collectives: ``busbw_factor(op, ranks) * bytes / link_bw`` (nccl-tests doc/PERFORMANCE.md), link =
    NVLink inside a node, the NIC across nodes. Floored at 1e-12 s (a numeric guard for zero-byte rows,
    so the log is finite).
    """
    flops, byts = flops_bytes(kind, raw, dtype_b, backward)
    if kind in COLLECTIVE_KINDS:
        nodes = raw[:, 2]
        bw = np.where(nodes > 1, dev.inter_bw, dev.intra_bw)
        t = busbw_factor(kind, np.maximum(raw[:, 1], 2.0)) * byts / bw
    else:
        peak: float | np.ndarray
        if dtypes is None:
            peak = dev.peak("bf16")
        else:
            peak = np.array([dev.peak(d) for d in dtypes], dtype=float)
        t = np.maximum(flops / peak, byts / dev.hbm_bw)
    return np.maximum(t, 1e-12)


def build_features(kind: str, raw, dtypes, backward: bool, dev: DeviceConstants) -> np.ndarray:
    """Feature matrix [n, len(feature_names(kind))] for raw feature rows ``raw`` [n, len(FEATURES[kind])].

    ``dtypes``: one dtype string per row, or a single string for all rows.
    """
    raw = np.asarray(raw, dtype=float).reshape(-1, len(FEATURES[kind]))
    n = raw.shape[0]
    if isinstance(dtypes, str):
        dtypes = [dtypes] * n
    dtypes = list(dtypes)
    uniq = {d: dtype_bytes(d) for d in set(dtypes)}
    dtype_b = np.array([uniq[d] for d in dtypes], dtype=float) if n else np.zeros(0)
    flops, byts = flops_bytes(kind, raw, dtype_b, backward)
    ref = unit_roofline(kind, raw, dtype_b, backward, dev, dtypes)
    cols = [raw, _log2(raw)]
    if kind in COLLECTIVE_KINDS:
        cols += [_log2(byts)[:, None], busbw_factor(kind, np.maximum(raw[:, 1], 2.0))[:, None]]
    elif kind in ("gemm", "attention_fwd", "attention_bwd"):
        ai = flops / np.maximum(byts, 1.0)
        cols += [dtype_b[:, None], _log2(flops)[:, None], _log2(byts)[:, None],
                 np.log2(np.maximum(ai, 2.0**-20))[:, None]]
        if kind == "gemm":
            cols.append(gemm_tile_features(raw))
    else:
        cols += [_log2(byts)[:, None]]
    cols.append(ref[:, None])
    return np.hstack(cols)
