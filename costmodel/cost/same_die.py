"""Same-die siblings for the measured cost model: a GPU without a model covering an operator borrows the model of
a measured GPU of the same die (costmodel.cost.basis), scaled by the roofline ratio, and a GPU that matches or beats
a measured sibling on every datasheet figure is never predicted slower than it (the same-die envelope).

A mixin of :class:`costmodel.cost.measured.MeasuredCostModel`: it uses that class's ``_models``, ``_route``,
``_predict_own``, ``_predict_basis``, ``_roof`` and ``_donors``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from costmodel.core.kinds import COLLECTIVE_KINDS
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hardware import Hardware
from costmodel.cost.base import CostResult, CostSource
from costmodel.cost.basis import die_of, dominates, roofline_ratio, siblings
from costmodel.graph.ops import Op

if TYPE_CHECKING:  # the mixin's host module imports this one
    from costmodel.cost.measured import _GpuModels, _Out
    from costmodel.cost.roofline import RooflineCostModel

DTYPE_FAMILY = {"fp16": "16-bit", "bf16": "16-bit"}
"""Dtypes one model covers alike (the regressors take bytes per element as a feature; fp16 and bf16 GEMMs run the
same tensor-core rate, NVIDIA Hopper whitepaper v1.04 Table 3)."""

ENVELOPE_TOLERANCE = 1e-9
"""Relative margin below which the same-die envelope leaves a time alone (floating-point noise, not a fit)."""


class SameDieSiblings:
    """Borrowing from and bounding by measured GPUs of the same die (see the module docstring)."""

    if TYPE_CHECKING:  # provided by the host class (costmodel.cost.measured.MeasuredCostModel)
        _donors: dict
        _roof: RooflineCostModel

        def _models(self, gpu: str) -> _GpuModels: ...
        def _route(self, gm: _GpuModels, op: Op) -> tuple | None: ...
        def _predict_own(self, ops: Sequence[Op], hardware: Hardware, borrow: bool = False) -> CostResult: ...
        def _predict_basis(self, ops: Sequence[Op], hardware: Hardware) -> CostResult: ...

    @staticmethod
    def _same_link(donor: Hardware, hardware: Hardware, op: Op) -> bool:
        """The donor's NVLink figure is the bandwidth ``op``'s group has on the node type: its collective samples
        describe that link (a group smaller than a direct-wired mesh has only its members' links, ClusterSpec.
        intra_bw_gbs)."""
        return abs(donor.gpu.nvlink_bw_gbs - hardware.cluster.intra_bw_gbs(int(op.features[1]))) < 1e-9

    def _siblings(self, hardware: Hardware) -> list:
        """The measured GPUs of ``hardware``'s die (specs), nearest in HBM bandwidth first."""
        g = hardware.gpu
        key = ("siblings", g.name, g.hbm_bw_gbs, tuple(sorted(g.peak_tflops.items())))
        if key not in self._donors:
            self._donors[key] = [x for x in siblings(g, load_catalogue().gpu) if self._models(x.name).names]
        return self._donors[key]

    def _covers(self, gm: _GpuModels, name: str, op: Op) -> bool:
        """The model ``name`` of ``gm`` was fitted on operators like ``op``: its dtype (bf16 and fp16 alike) and, for a
        collective, its node count lies in the sampled range (beyond the sampled ranks per node the own model
        extrapolates, anchored by costmodel.cost.shape)."""
        ent = gm.entry(name)
        if ent is None or isinstance(ent, str):
            return False
        dtypes = {DTYPE_FAMILY.get(d, d) for d in ent.reg.meta_.get("dtypes") or ()}
        if dtypes and DTYPE_FAMILY.get(op.dtype, op.dtype) not in dtypes:
            return False
        if op.kind in COLLECTIVE_KINDS:
            rng = ent.ranges.get("nodes")
            if rng is not None and not rng[0] <= op.features[2] <= rng[1]:
                return False
        return True

    def _sibling_for(self, gm: _GpuModels, plan, op: Op, hardware: Hardware) -> str | None:
        """The same-die sibling whose model costs ``op`` when this GPU has none that covers it (another kernel basis,
        another dtype, collectives sampled only across nodes), or None. A collective is lent only by a sibling whose
        NVLink figure is the node type's."""
        if op.kind in COLLECTIVE_KINDS and (op.features[1] <= 1 or op.features[0] <= 0 or op.features[2] > 1):
            return None  # no communication, or across NVLink domains (the alpha-beta model on the cluster's figures)
        if plan is not None and self._covers(gm, plan[0], op):
            return None
        for sib in self._siblings(hardware):
            if op.kind in COLLECTIVE_KINDS and not self._same_link(Hardware(sib, hardware.cluster), hardware, op):
                continue
            sgm = self._models(sib.name)
            splan = self._route(sgm, op)
            if splan is not None and self._covers(sgm, splan[0], op):
                return sib.name
        return None

    def _lent(self, ops: Sequence[Op], idx: list[int], hardware: Hardware, sib: str, out: "_Out") -> None:
        """Rows ``idx`` costed by sibling ``sib``'s models, scaled to ``hardware`` by the roofline ratio."""
        donor = Hardware(gpu=load_catalogue().gpu(sib), cluster=hardware.cluster)
        sub = [ops[i] for i in idx]
        r = self._predict_own(sub, donor, borrow=False)
        ratio = roofline_ratio(self._roof, sub, hardware, donor)
        gpu = hardware.gpu.name
        for j, i in enumerate(idx):
            note = (f"no model of {ops[i].kind} {'bwd' if ops[i].backward else 'fwd'} on the fused kernel basis for "
                    f"{gpu} covering this operator: costed from {sib}'s (same {die_of(gpu)} die), scaled by the "
                    "roofline ratio (costmodel/cost/basis.py)")
            w = tuple(r.warnings) + (note,)
            vals = [float(x[j] * ratio[j]) for x in (r.time_s, r.time_s if r.low_s is None else r.low_s,
                                                      r.time_s if r.high_s is None else r.high_s)]
            m = r.method[j] if r.source[j] is CostSource.NONE else f"{r.method[j]} scaled to {gpu}"
            src = CostSource.DERIVED if r.source[j] is CostSource.MEASURED else r.source[j]
            out.t[i], out.lo[i], out.hi[i], out.method[i], out.source[i] = *vals, m, src
            out.warns.update(dict.fromkeys(w))
            out.cache[ops[i].key()] = (*vals, m, src, w)

    def _same_die_envelope(self, ops: Sequence[Op], hardware: Hardware, res: CostResult) -> None:
        """Compute operators no slower than on a measured sibling this GPU matches or beats on every datasheet
        figure (basis.dominates), that sibling's time scaled by the roofline ratio. Collectives are left to the GPU's
        own node measurements (GB200's tray is not B200's HGX board) or lent whole (_sibling_for)."""
        rows = [i for i, o in enumerate(ops) if o.kind not in COLLECTIVE_KINDS]
        beaten = [x for x in self._siblings(hardware) if dominates(hardware.gpu, x)] if rows else []
        for sib in beaten:
            donor = Hardware(gpu=sib, cluster=hardware.cluster)
            sub = [ops[i] for i in rows]
            other = self._predict_basis(sub, donor)
            bound = other.time_s * roofline_ratio(self._roof, sub, hardware, donor)
            for j, i in enumerate(rows):
                if bound[j] < res.time_s[i] * (1 - ENVELOPE_TOLERANCE):
                    scale = bound[j] / res.time_s[i]
                    res.time_s[i] = bound[j]
                    for arr in (res.low_s, res.high_s):
                        if arr is not None:
                            arr[i] *= scale
                    res.method[i] = f"{res.method[i]}, at most {sib.name}'s (same die, basis.dominates)"
