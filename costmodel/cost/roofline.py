"""Analytical operator costs: roofline for compute operators, alpha-beta for collectives.

Compute operators (Williams, Waterman & Patterson, "Roofline", CACM 2009, eq. 1)::

    t = max(flops / (peak(dtype) * eff_compute(kind, flops)),  bytes / (hbm_bw * eff_mem(kind))) + launch

Collectives (Hockney's alpha-beta model; nccl-tests "busbw" factors, nccl-tests doc/PERFORMANCE.md)::

    t = alpha + factor(op, n) * bytes / (link_bw * eff(op, n))
    factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; send_recv 1

Across nodes the collective is hierarchical (NCCL's intra-node reduce-scatter + inter-node ring +
intra-node all-gather, the "2D"/hierarchical all-reduce of Calculon, Isaev et al. SC'23 §3.3, and
Horovod's hierarchical all-reduce): the inter-node stage moves ``bytes / ranks_per_node`` per GPU over
that GPU's NIC (rail-optimised nodes: one NIC per GPU, or shared where a node has fewer, and divided by the
fabric's oversubscription where the group leaves a non-blocking leaf: ``ClusterSpec.scale_out_bw_gbs``). "Node"
here is the NVLink (scale-up) domain (the features ``nodes`` / ``ranks_per_node`` count domains,
costmodel/graph/build.py): the intra figures of the cluster are its NVLink figures, the inter figures its scale-out
network, so a TP group of 8 inside a 72-GPU NVL72 rack of 4-GPU trays is costed on NVLink, one spanning two
racks on the network.

Every efficiency, the launch latency and the collective alphas come from
``costmodel/data/efficiency.json``, fitted by ``python -m costmodel.fitting.efficiency`` from the public
measurements in ``shared/data`` (see ``costmodel/data/PROVENANCE.md``). Peak FLOP/s, HBM and link
bandwidths come from the :class:`Hardware` object.

Byte and FLOP conventions: :mod:`costmodel.graph.conventions` (shared with the regressors' features and the
efficiency fit).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from costmodel.core.kinds import COLLECTIVE_KINDS, FEATURES
from costmodel.core.specs.hardware import Hardware
from costmodel.cost.base import CostResult, CostSource, OperatorCostModel
from costmodel.graph.conventions import (
    attention_bytes,
    attention_fwd_flops,
    busbw_factor,
    gemm_bytes,
    gemm_flops,
    inter_latency_steps,
    mem_bytes,
)
from costmodel.graph.kernel_basis import FUSED_ELEMENTWISE, fused_efficiency
from costmodel.graph.ops import Op

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "efficiency.json"
CPU_DEVICE = "cpu"
"""The profiled CPU's catalogue key (costmodel.fitting.cpu_hardware): its element-wise efficiencies are its own
table's."""

# ----------------------------------------------------------------------------------------------
# Table access
# ----------------------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def load_table(path: str | None = None) -> dict:
    """The fitted efficiency table (``costmodel/data/efficiency.json``)."""
    return json.loads(Path(path or TABLE_PATH).read_text())


def _interp_eff(entry: dict, flops: np.ndarray) -> np.ndarray:
    """Efficiency at ``flops``: log-linear interpolation between log2(FLOPs) bucket centres."""
    x = np.log2(np.maximum(flops, 1.0))
    e = np.interp(x, entry["log2_flops"], np.log(entry["eff"]))
    return np.exp(e)


class _Resolved:
    """Efficiencies of one GPU, with the fallback to the ``default`` entry and its warnings."""

    def __init__(self, table: dict, gpu_name: str):
        gpus = table["gpus"]
        self.gpu = gpu_name
        self.own = gpus.get(gpu_name)
        self.default = gpus["default"]
        self.warnings: list[str] = []
        if self.own is None:
            self.warnings.append(f"no measured data for {gpu_name}: efficiencies are the median of measured GPUs")

    def get(self, *path, what: str):
        """Value at ``path`` in the GPU's entry, else in ``default`` (noting the fallback)."""
        node = self.own
        for p in path:
            if not isinstance(node, dict) or p not in node:
                node = None
                break
            node = node[p]
        if node is not None:
            return node
        if self.own is not None:
            msg = (f"no measured {what} data for {self.gpu}: using the median of measured GPUs")
            if msg not in self.warnings:
                self.warnings.append(msg)
        node = self.default
        for p in path:
            node = node[p]
        return node


def _nearest(entries: dict, n: int) -> dict:
    """Entry measured at the group size closest to ``n`` in log2 (keys are str(n))."""
    best = min(entries, key=lambda k: (abs(math.log2(int(k)) - math.log2(max(n, 1))), int(k)))
    return entries[best]


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------

class RooflineCostModel(OperatorCostModel):
    """Roofline compute times and hierarchical alpha-beta collective times from fitted efficiencies."""

    name = "roofline"

    def __init__(self, table: dict | None = None):
        self.table = table if table is not None else load_table()
        self._cache: dict = {}
        self._resolved: dict = {}

    def supports(self, kind: str, hardware: Hardware) -> bool:
        return kind in FEATURES

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _hw_key(hw: Hardware) -> tuple:
        g, c = hw.gpu, hw.cluster
        return (g.name, g.sibling, c.name, g.hbm_bw_gbs, tuple(sorted(g.peak_tflops.items())), c.gpus_per_node,
                hw.nvlink_domain, c.intra_node_bw_gbs, c.inter_node_bw_gbs, c.intra_node_latency_us,
                c.inter_node_latency_us, c.rails, c.oversubscription, c.leaf_nodes)

    def _res(self, hw: Hardware) -> _Resolved:
        """The GPU's fitted efficiencies; a GPU without any of its own takes its declared sibling's."""
        name = hw.gpu.name if hw.gpu.name in self.table["gpus"] else hw.gpu.measured_as
        r = self._resolved.get(name)
        if r is None:
            r = self._resolved[name] = _Resolved(self.table, name)
        return r

    # -- public ----------------------------------------------------------------------------
    def predict(self, ops: Sequence[Op], hardware: Hardware) -> CostResult:
        hk = self._hw_key(hardware)
        cache = self._cache.setdefault(hk, {})
        res = self._res(hardware)
        times = np.empty(len(ops))
        todo: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            t = cache.get(op.key())
            if t is None:
                todo.setdefault(op.kind, []).append(i)
            else:
                times[i] = t
        for kind, idx in todo.items():
            group = [ops[i] for i in idx]
            if kind in COLLECTIVE_KINDS:
                vals = self._collectives(kind, group, hardware, res)
            else:
                vals = self._compute(kind, group, hardware, res)
            for i, op, v in zip(idx, group, vals):
                times[i] = cache[op.key()] = float(v)
        return CostResult(time_s=times, method=["roofline"] * len(ops), source=[CostSource.ROOFLINE] * len(ops),
                          warnings=list(res.warnings))

    # -- compute operators -------------------------------------------------------------------
    def _compute(self, kind: str, ops: list[Op], hw: Hardware, res: _Resolved) -> np.ndarray:
        g = hw.gpu
        hbm = g.hbm_bw_gbs * 1e9
        launch = res.get("launch_latency_us", "value", what="launch latency") * 1e-6
        if kind == "gemm":
            out = np.empty(len(ops))
            for dtype in sorted({o.dtype for o in ops}):
                sel = [i for i, o in enumerate(ops) if o.dtype == dtype]
                f = np.array([ops[i].features for i in sel], dtype=float)
                m, n, k = f[:, 0], f[:, 1], f[:, 2]
                key = "fp8" if dtype == "fp8" and "fp8" in g.peak_tflops else "bf16"
                entry = res.get("gemm", key, what=f"{key} GEMM")
                flops = gemm_flops(m, n, k)
                byts = np.array([ops[i].bytes for i in sel], dtype=float)
                byts = np.where(byts > 0, byts, gemm_bytes(m, n, k, key))
                peak = g.peak_flops("fp32" if dtype == "fp32" else key)  # fp32 GEMMs run at the fp32 peak
                t = np.maximum(flops / (peak * _interp_eff(entry, flops)),
                               byts / (hbm * entry["mem_eff"]))
                out[sel] = t + entry["launch_latency_us"] * 1e-6
            return out
        if kind in ("attention_fwd", "attention_bwd"):
            f = np.array([o.features for o in ops], dtype=float)
            b, sq, skv, h, hkv, d, causal = f.T
            flops = attention_fwd_flops(b, sq, skv, h, d, causal)
            byts = attention_bytes(b, sq, skv, h, hkv, d)
            entry = res.get("attention_fwd", what="attention")
            gemm_mem = res.get("gemm", "bf16", "mem_eff", what="bf16 GEMM")
            peaks = np.array([g.peak_flops("fp32" if o.dtype == "fp32" else "bf16") for o in ops])
            t = np.maximum(flops / (peaks * _interp_eff(entry, flops)), byts / (hbm * gemm_mem))
            if kind == "attention_bwd":
                t = t * res.get("attention_bwd_fwd_ratio", "value", what="attention backward")
            return t + launch
        byts = np.array([o.bytes if o.bytes > 0 else mem_bytes(kind, o.feature_dict(), o.backward)
                         for o in ops], dtype=float)
        own = (res.own or {}).get("memory", {}).get(kind) if g.name == CPU_DEVICE else None
        if kind in FUSED_ELEMENTWISE and own is None:  # fused kernels measured on H100 (kernel_basis)
            eff = np.array([fused_efficiency(kind, o.backward) or 1.0 for o in ops])
        else:
            eff = res.get("memory", kind, "eff", what=f"{kind}")
        return byts / (hbm * eff) + launch

    # -- collectives -------------------------------------------------------------------------
    def _collectives(self, kind: str, ops: list[Op], hw: Hardware, res: _Resolved) -> np.ndarray:
        c = hw.cluster
        out = np.empty(len(ops))
        for j, op in enumerate(ops):
            nbytes, ranks, nodes, rpn = (float(x) for x in op.features)
            ranks, nodes, rpn = int(ranks), int(nodes), int(rpn)
            out[j] = 0.0 if ranks <= 1 or nbytes <= 0 else self._one_collective(kind, nbytes, ranks, nodes, rpn, c, res)
        return out

    def _tier(self, res: _Resolved, tier: str, op: str, n: int, min_alpha_us: float) -> tuple[float, float]:
        """(alpha seconds, busbw efficiency) for ``op`` over ``n`` ranks on ``tier``."""
        entries = res.get("collectives", tier, op, what=f"{tier}-node {op}")
        e = _nearest(entries, n)
        return max(e["alpha_us"], min_alpha_us) * 1e-6, e["eff"]

    def _intra(self, res, c, op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        a, eff = self._tier(res, "intra", op, n, c.intra_node_latency_us)
        return a + float(busbw_factor(op, n)) * nbytes / (c.intra_bw_gbs(n) * 1e9 * eff)

    def _inter(self, res, c, op: str, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        a, eff = self._tier(res, "inter", op, n, c.inter_node_latency_us)
        bw = c.scale_out_bw_gbs(n) * 1e9 * eff
        return a * inter_latency_steps(op, n) + float(busbw_factor(op, n)) * nbytes / bw

    def _one_collective(self, op, nbytes, ranks, nodes, rpn, c, res) -> float:
        if nodes <= 1:
            return self._intra(res, c, op, nbytes, ranks)
        if op == "send_recv":
            return self._inter(res, c, op, nbytes, 2)
        if op == "all_reduce":  # intra reduce-scatter, inter all-reduce of bytes/rpn, intra all-gather
            return (self._intra(res, c, "reduce_scatter", nbytes, rpn)
                    + self._inter(res, c, "all_reduce", nbytes / rpn, nodes)
                    + self._intra(res, c, "all_gather", nbytes, rpn))
        if op == "all_gather":  # inter all-gather of bytes/rpn per GPU, then intra all-gather
            return self._inter(res, c, op, nbytes / rpn, nodes) + self._intra(res, c, op, nbytes, rpn)
        if op == "reduce_scatter":  # intra reduce-scatter, then inter reduce-scatter of bytes/rpn
            return self._intra(res, c, op, nbytes, rpn) + self._inter(res, c, op, nbytes / rpn, nodes)
        # all_to_all: the off-node share leaves through the NIC, the on-node share over NVLink
        a_x, e_x = self._tier(res, "inter", op, nodes, c.inter_node_latency_us)
        t = a_x + nbytes * (ranks - rpn) / ranks / (c.scale_out_bw_gbs(nodes) * 1e9 * e_x)
        if rpn > 1:
            a_i, e_i = self._tier(res, "intra", op, rpn, c.intra_node_latency_us)
            t += a_i + nbytes * (rpn - 1) / ranks / (c.intra_bw_gbs(rpn) * 1e9 * e_i)
        return t
