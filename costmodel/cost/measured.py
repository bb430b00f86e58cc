"""Measured operator costs: the fitted per-operator tree regressors behind the cost seam.

Artifacts (:mod:`costmodel.cost.regressors.artifacts`) are looked up in, in order: the ``models_dir``
argument, ``$PLANNER_MODELS_DIR``, then the defaults shipped in ``costmodel/data/models``. They are
loaded lazily, one (GPU, kind, direction) at a time, from xgboost JSON (no pickle, no torch).

Per operator the model is, in order of preference:

1. the regressor fitted for (GPU, kind, direction): method ``xgboost:<gpu>/<kind>``; for all-gather and
   reduce-scatter the twin's model where this one is absent or poor (``RING_TWINS``);
2. a recorded derivation (index.json ``derived``): backward GEMMs (dgrad/wgrad) through the forward
   GEMM model; ``attention_bwd`` = ratio x the ``attention_fwd`` model;
3. the analytical fallback (:class:`~costmodel.cost.roofline.RooflineCostModel`), with a warning.

A GPU without any models of its own uses those of its same-silicon sibling scaled by the roofline ratio
(:mod:`costmodel.cost.basis`). The trees' shapes are constrained (:mod:`costmodel.cost.shape`): attention
outside its sampled box is anchored to the roofline, collectives are monotone in bytes, and the attention
backward is never below its forward.

Operators outside a regressor's sampled feature ranges are flagged (one warning per feature).
Prediction intervals (``low_s``/``high_s``) come from the ensembles; fallback rows repeat the point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COLLECTIVE_KINDS, FEATURES, Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.core.specs.hardware import Hardware
from costmodel.cost.base import CostResult, CostSource, OperatorCostModel
from costmodel.cost.basis import donor_for, roofline_ratio
from costmodel.cost.regressors.artifacts import SHIPPED_MODELS_DIR, read_index
from costmodel.cost.regressors.features import DeviceConstants, build_features, feature_names
from costmodel.cost.regressors.runtime import RuntimeRegressor
from costmodel.cost.roofline import CPU_DEVICE, RooflineCostModel
from costmodel.cost.same_die import SameDieSiblings
from costmodel.cost.shape import ANCHORED_KINDS, byte_grid, clip_to_box, envelope_at, isotonic, knots
from costmodel.graph.kernel_basis import FUSED_ELEMENTWISE
from costmodel.graph.ops import Op

ENV_MODELS_DIR = "PLANNER_MODELS_DIR"
MAX_CV_MAPE = 0.25
"""Regressors whose grouped-CV MAPE is above this are not used unless the analytical roofline that would
replace them is known to be worse on the same samples (the index's ``fallback_mape``, written by
``planner fit``); otherwise the roofline applies, with a warning. Policy, not a fit: 25 % is the upper end
of the roofline's own error on the measured GPU samples (median |error| 8-21 % on GEMMs, 19-32 % on
collectives over all message sizes; tests/test_roofline.py), so a learned model worse than that is not
trusted over it. On a device whose roofline has no efficiencies of its own (a profiled CPU borrows the
GPUs' median) the fallback can be far worse, which ``fallback_mape`` shows."""


MAX_CV_MAPE_ANY = 0.5
"""Above this grouped-CV MAPE a regressor is never used, whatever the fallback's error. Policy: a held-out
error above 50 % means the trees do not describe the samples (the a100-80gb optimizer model, 59 %, is not
even monotone in the parameter count: 131 ms at 70 M parameters, 44 ms at 100 M; tests/test_properties.py),
while the roofline at least scales with the work."""


def untrusted_reason(entry_meta: dict, fallback_mape: float | None) -> str | None:
    """Why a regressor is not used (its CV error is too high and not better than the fallback's), or None."""
    mape = (entry_meta.get("cv") or {}).get("mape")
    if not isinstance(mape, (int, float)) or mape <= MAX_CV_MAPE:
        return None
    if isinstance(fallback_mape, (int, float)) and mape < fallback_mape and mape <= MAX_CV_MAPE_ANY:
        return None
    fb = "" if not isinstance(fallback_mape, (int, float)) else f" and the roofline's {100 * fallback_mape:.0f} %"
    return (f"measured model {entry_meta.get('gpu')}/{entry_meta.get('kind')}.{entry_meta.get('direction')} has "
            f"grouped-CV MAPE {100 * mape:.0f} % > {100 * MAX_CV_MAPE:.0f} %{fb}, not trusted")


def _shipped_dir() -> Path:
    return SHIPPED_MODELS_DIR


class _Entry:
    """One loaded regressor and what the predict path needs from its sidecar."""

    def __init__(self, path: Path, fallback_mape: float | None = None):
        self.reg = RuntimeRegressor(path)
        meta = self.reg.meta_
        try:
            self.dev = DeviceConstants.from_dict(meta["device_constants"])
            self.ranges = {k: (float(v[0]), float(v[1])) for k, v in meta["raw_feature_ranges"].items()}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PlannerError(f"model sidecar for {path} lacks device constants or ranges ({exc}); "
                               "re-run `planner fit`") from None
        why = untrusted_reason(meta, fallback_mape)
        if why:
            raise PlannerError(why)
        # an artifact fitted by an older version with other features (e.g. norm before its rms feature)
        kind, got = meta.get("kind"), meta.get("feature_names")
        if kind in FEATURES and got is not None and list(got) != list(feature_names(kind)):
            raise PlannerError(f"model {path} was fitted on other features than this version builds "
                               f"({len(got)} vs {len(feature_names(kind))}); re-run `planner fit`")


class _GpuModels:
    """The index of one GPU's artifacts plus the regressors loaded so far."""

    def __init__(self, gpu: str, root: Path | None, index: dict):
        self.gpu = gpu
        self.root = root
        self.entries = dict(index.get("models", {}).get(gpu, {})) if root else {}
        self.names = set(self.entries)
        self.derived = index.get("derived", {}).get(gpu, {}) if root else {}
        self.loaded: dict[str, _Entry | str] = {}

    def entry(self, name: str) -> "_Entry | str | None":
        """The regressor for ``kind.direction``, an error string when unusable, None when absent."""
        if name not in self.names or self.root is None:
            return None
        got = self.loaded.get(name)
        if got is None:
            kind, direction = name.split(".")
            try:
                entry = self.entries.get(name)
                fb = entry.get("fallback_mape") if isinstance(entry, dict) else None
                got = _Entry(self.root / self.gpu / f"{kind}.{direction}.json", fb)
            except PlannerError as exc:
                got = str(exc)
            self.loaded[name] = got
        return got


RANK_ANCHORED_KINDS = frozenset({"all_to_all", "all_gather", "reduce_scatter", "all_reduce"})
"""Collectives whose group sizes outside the sampled ones are anchored to the alpha-beta model (the trees are
constant beyond their largest sampled group: GB200's all-to-all, sampled on 2 and 4 GPUs, came out 0.5-1.0x the
TRT-LLM all-to-all measured on 8-64 GPUs of one NVL72 rack, aiconfigurator multinode/; anchored 0.9-1.4x,
tests/test_measured.py). All-gather, reduce-scatter and all-reduce (issue 15) were as flat in the group size on
8-72 GPUs of an NVL72 rack (all-reduce of 64 MiB: 0.23-0.25 ms on 8-72 GPUs for 0.21 ms on 4); the rule moves
only groups larger than a GPU's sampled ones inside one NVLink domain (in the catalogue: GB200 NVL72, 8-72 GPUs),
so plans on 8-GPU nodes predict as before. Send/recv is not here: it is always 2 ranks (costmodel/graph/build.py)."""

RING_TWINS = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
"""All-gather and reduce-scatter of the same buffer move the same bytes: in NCCL's ring each rank sends (n-1)/n
of it (nccl-tests doc/PERFORMANCE.md: busBw = algBw x (n-1)/n for both; reduce-scatter adds only the
element-wise sum). Where one of the two has no model or a poor one, it is costed by the other's."""


def _cv_mape(gm: "_GpuModels", name: str) -> float | None:
    entry = gm.entries.get(name)
    mape = (entry.get("cv") or {}).get("mape") if isinstance(entry, dict) else None
    return float(mape) if isinstance(mape, (int, float)) else None


def _ring_twin(gm: "_GpuModels", kind: str) -> str | None:
    """The twin collective's model name when it stands in for ``kind``'s (absent, or CV MAPE above
    MAX_CV_MAPE while the twin's is within it), else None."""
    other = RING_TWINS.get(kind)
    if other is None:
        return None
    own, twin = f"{kind}.fwd", f"{other}.fwd"
    if twin not in gm.names:
        return None
    twin_mape = _cv_mape(gm, twin)
    if own not in gm.names:
        return twin if twin_mape is None or twin_mape <= MAX_CV_MAPE else None
    own_mape = _cv_mape(gm, own)
    poor = own_mape is not None and own_mape > MAX_CV_MAPE
    return twin if poor and twin_mape is not None and twin_mape <= MAX_CV_MAPE else None


FUSED_METHOD = "HBM roofline at the fused kernel's efficiency measured on H100 (costmodel/data/fused_kernels.json)"
"""How element-wise operators are costed on the fused kernel basis (costmodel.graph.kernel_basis.FUSED_ELEMENTWISE)."""

@dataclass
class _Out:
    """The arrays one prediction fills, and the cache it writes to."""

    t: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    method: list
    source: list
    warns: dict
    cache: dict

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list, list, dict, dict]:
        return self.t, self.lo, self.hi, self.method, self.source, self.warns, self.cache


def _merge_results(n: int, *parts: tuple[list[int], CostResult]) -> CostResult:
    """One CostResult of ``n`` rows from results of disjoint row lists."""
    t, lo, hi = np.empty(n), np.empty(n), np.empty(n)
    method, source = [""] * n, [CostSource.ROOFLINE] * n
    warns: set[str] = set()
    for idx, r in parts:
        for j, i in enumerate(idx):
            t[i] = r.time_s[j]
            lo[i] = r.low_s[j] if r.low_s is not None else r.time_s[j]
            hi[i] = r.high_s[j] if r.high_s is not None else r.time_s[j]
            method[i], source[i] = r.method[j], r.source[j]
        warns.update(r.warnings)
    return CostResult(time_s=t, low_s=lo, high_s=hi, method=method, source=source, warnings=sorted(warns))


class MeasuredCostModel(SameDieSiblings, OperatorCostModel):
    """Operator times from fitted xgboost regressors, falling back to the roofline where none exists."""

    name = "measured"

    def __init__(self, models_dir: str | Path | None = None, fallback: OperatorCostModel | None = None,
                 q: tuple = (0.1, 0.9)):
        dirs = []
        if models_dir is not None:
            dirs.append(Path(models_dir))
        env = os.environ.get(ENV_MODELS_DIR)
        if env:
            dirs.append(Path(env).expanduser())
        dirs.append(_shipped_dir())
        self.dirs = dirs
        self.q = tuple(q)
        if fallback is None:
            fallback = RooflineCostModel()
        self.fallback = fallback
        self._gpus: dict[str, _GpuModels] = {}
        self._cache: dict = {}
        self._donors: dict = {}
        self._envelopes: dict = {}
        self._roof = RooflineCostModel(fallback.table if isinstance(fallback, RooflineCostModel) else None)
        """The analytical model that anchors extrapolation and scales borrowed models: a private instance, so its
        look-ups never add to the warnings the fallback reports (only its times are used)."""

    # -- loading -----------------------------------------------------------------------------
    def _models(self, gpu: str) -> _GpuModels:
        gm = self._gpus.get(gpu)
        if gm is None:
            gm = _GpuModels(gpu, None, {})
            for d in self.dirs:
                if (d / gpu).is_dir() and (d / "index.json").exists():
                    gm = _GpuModels(gpu, d, read_index(d))
                    break
            self._gpus[gpu] = gm
        return gm

    def supports(self, kind: str, hardware: Hardware) -> bool:
        return kind in FEATURES

    def has_models(self, gpu: str) -> bool:
        return bool(self._models(gpu).names)

    def has_model(self, gpu: str, name: str) -> bool:
        """``gpu`` has a fitted model ``name`` of its own (e.g. ``gemm.fwd``), not borrowed from a sibling."""
        return name in self._models(gpu).names

    def measured_on(self, hardware: Hardware, name: str) -> Hardware:
        """The hardware whose fitted model ``name`` costs ``hardware``'s operators: its own, else the nearest
        same-die sibling that has it (GH200 from H100 SXM, :meth:`_siblings`), else its whole-GPU donor
        (:meth:`_donor`), else ``hardware`` itself."""
        if self.has_model(hardware.gpu.name, name):
            return hardware
        sibling = next((g for g in self._siblings(hardware) if self.has_model(g.name, name)), None)
        if sibling is not None:
            return replace(hardware, gpu=sibling)
        donor = self._donor(hardware)
        return hardware if donor is None else replace(hardware, gpu=donor[0].gpu)

    # -- predict -----------------------------------------------------------------------------
    def predict(self, ops: Sequence[Op], hardware: Hardware) -> CostResult:
        res = self._predict_basis(ops, hardware)
        self._same_die_envelope(ops, hardware, res)
        self._attention_floor(ops, hardware, res)
        return res

    def _predict_basis(self, ops: Sequence[Op], hardware: Hardware) -> CostResult:
        """This GPU's own models (with its same-die siblings' for the operators it has no fused-basis model of), or,
        for a GPU without any, its measured sibling's (costmodel/cost/basis.py)."""
        if not self._models(hardware.gpu.name).names:
            donor = self._donor(hardware)
            if donor is not None:
                return self._borrowed(ops, hardware, *donor)
        return self._predict_own(ops, hardware, borrow=True)

    def _donor(self, hardware: Hardware) -> tuple[Hardware, str] | None:
        g = hardware.gpu
        key = (g.name, g.sibling, g.hbm_bw_gbs, tuple(sorted(g.peak_tflops.items())))
        if key not in self._donors:
            found = donor_for(g, load_catalogue().gpu)
            self._donors[key] = found if found is not None and self._models(found[0].name).names else None
        found = self._donors[key]
        return None if found is None else (Hardware(gpu=found[0], cluster=hardware.cluster), found[1])

    def _borrowed(self, ops: Sequence[Op], hardware: Hardware, donor: Hardware, note: str) -> CostResult:
        """``ops`` costed by the donor's models scaled to ``hardware`` (basis.roofline_ratio); collectives only where
        the node type's NVLink figure is the donor's (its samples describe that link), else the roofline."""
        own_link = [i for i, o in enumerate(ops)
                    if o.kind in COLLECTIVE_KINDS and not self._same_link(donor, hardware, o)]
        lent = [i for i in range(len(ops)) if i not in set(own_link)]
        sub = [ops[i] for i in lent]
        r = self._predict_own(sub, donor, borrow=True)
        ratio = roofline_ratio(self._roof, sub, hardware, donor)
        gpu = hardware.gpu.name
        method = [m if s is CostSource.NONE else f"{m} scaled to {gpu}" for m, s in zip(r.method, r.source)]
        source: list[CostSource] = [CostSource.DERIVED if s is CostSource.MEASURED else s for s in r.source]
        lo = r.low_s if r.low_s is not None else r.time_s
        hi = r.high_s if r.high_s is not None else r.time_s
        out = CostResult(time_s=r.time_s * ratio, low_s=lo * ratio, high_s=hi * ratio, method=method, source=source,
                         warnings=sorted(set(r.warnings) | {note}))
        if not own_link:
            return out
        fb = self._predict_own([ops[i] for i in own_link], hardware, borrow=False)
        return _merge_results(len(ops), (lent, out), (own_link, fb))

    def _attention_floor(self, ops: Sequence[Op], hardware: Hardware, res: CostResult) -> None:
        """Attention backward >= its forward (FlashAttention-2, arXiv 2307.08691, §3.1.2: the backward recomputes
        the forward's scores and runs 5 matmuls to its 2); the models of the two directions come from different
        sources and sampled boxes, so where they disagree the backward is raised to the forward, with a warning."""
        bwd = [i for i, o in enumerate(ops) if o.kind == "attention_bwd"]
        if not bwd:
            return
        fwd = self._predict_basis([Op("attention_fwd", "attention", Phase.FWD, ops[i].features, dtype=ops[i].dtype)
                                   for i in bwd], hardware)
        if not any(res.time_s[i] < fwd.time_s[j] for j, i in enumerate(bwd)):
            return
        for j, i in enumerate(bwd):
            f = float(fwd.time_s[j])
            if res.time_s[i] < f:
                res.time_s[i] = f
                if res.low_s is not None and res.high_s is not None:
                    res.low_s[i] = max(res.low_s[i], float(fwd.low_s[j]) if fwd.low_s is not None else f)
                    res.high_s[i] = max(res.high_s[i], f)
                res.method[i] = f"{res.method[i]}, raised to the forward"
        msg = (f"attention backward predicted below its forward on {hardware.gpu.name} "
               "(the two directions' models come from different measurements): raised to the forward's time, "
               "a lower bound (the FlashAttention backward recomputes the forward, FlashAttention-2 §3.1.2)")
        res.warnings = sorted(set(res.warnings) | {msg})

    def _predict_own(self, ops: Sequence[Op], hardware: Hardware, borrow: bool = False) -> CostResult:
        """This GPU's models; with ``borrow``, a same-die sibling's for operators this GPU has no covering model of
        (:meth:`_sibling_for`)."""
        gpu = hardware.gpu.name
        gm = self._models(gpu)
        cache = self._cache.setdefault((RooflineCostModel._hw_key(hardware), borrow), {})
        n = len(ops)
        out = _Out(np.empty(n), np.empty(n), np.empty(n), [""] * n, [CostSource.ROOFLINE] * n, {}, cache)
        groups, fb, cross, lent = self._classify(gm, ops, hardware, out, borrow)
        for name, idx in cross.items():
            self._fallback(ops, idx, hardware, *out.parts(),
                           (f"{name.split('.')[0]} across nodes: costed with the cluster's network figures "
                            "(alpha-beta model); measured samples describe another network or none",))
        for sib, idx in lent.items():
            self._lent(ops, idx, hardware, sib, out)
        for (name, factor, label, src), idx in groups.items():
            ent = gm.entry(name)
            if not isinstance(ent, _Entry):  # unusable artifact: flagged fallback, never a traceback
                self._fallback(ops, idx, hardware, *out.parts(),
                               (f"{ent}: using the analytical roofline for {name} on {gpu}",))
                continue
            try:
                self._predict_group(ent, name, factor, label, src, ops, idx, hardware, *out.parts())
            except ValueError as exc:  # e.g. an artifact fitted with another feature layout: flagged fallback
                self._fallback(ops, idx, hardware, *out.parts(),
                               (f"model {gpu}/{name} cannot be used ({exc}); re-run `planner fit`: "
                                f"using the analytical roofline",))
        if fb:
            extra: tuple[str, ...]
            if gm.names:
                extra = ()
            elif gpu == "cpu":
                extra = (f"no measured CPU models found (run `planner profile --device cpu` then `planner fit "
                         f"--profile DIR --out DIR` and set {ENV_MODELS_DIR}=DIR): using the analytical roofline",)
            else:
                extra = (f"no measured models for {gpu}: every operator uses the analytical roofline",)
            self._fallback(ops, fb, hardware, *out.parts(), extra, per_kind=bool(gm.names))
        return CostResult(time_s=out.t, low_s=out.lo, high_s=out.hi, method=out.method, source=out.source,
                          warnings=sorted(out.warns))

    def _classify(self, gm: _GpuModels, ops: Sequence[Op], hardware: Hardware, out: "_Out", borrow: bool):
        """(own model groups, fallback rows, rows crossing nodes per model, rows lent to a sibling per sibling);
        cached rows are filled into ``out`` directly."""
        groups: dict[tuple, list[int]] = {}
        fb: list[int] = []
        cross: dict[str, list[int]] = {}
        lent: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            hit = out.cache.get(op.key())
            if hit is not None:
                out.t[i], out.lo[i], out.hi[i], out.method[i], out.source[i], w = hit
                out.warns.update(dict.fromkeys(w))
                continue
            plan = self._route(gm, op)
            sib = self._sibling_for(gm, plan, op, hardware) if borrow else None
            if sib is not None:
                lent.setdefault(sib, []).append(i)
            elif plan is None:
                fb.append(i)
            elif self._crosses_nodes(gm, plan[0], op):
                cross.setdefault(plan[0], []).append(i)
            else:
                groups.setdefault(plan, []).append(i)
        return groups, fb, cross, lent

    # -- same-die siblings (costmodel/cost/basis.py) ------------------------------------------------
    @staticmethod
    def _crosses_nodes(gm: _GpuModels, name: str, op: Op) -> bool:
        """A collective spanning several NVLink domains ("nodes" in the features, costmodel/graph/build.py) is costed
        by the analytical alpha-beta model with the target cluster's own network figures (the catalogue's
        cited NIC bandwidth and latency): the regressors' features do not include the network, and the
        measured samples across nodes describe the network they ran on, not the target's (vidur's DGX
        samples: NIC setup unknown, ~6 GB/s busbw for a 2-node all-reduce per its PROVENANCE; Perlmutter's
        socket-transport rows are filtered out), or there are none."""
        return op.kind in COLLECTIVE_KINDS and op.features[2] > 1

    def _route(self, gm: _GpuModels, op: Op):
        """(model name, factor, method label, cost source) for ``op``, or None for the fallback."""
        if op.kind in COLLECTIVE_KINDS and (op.features[1] <= 1 or op.features[0] <= 0):
            return None  # no communication: the fallback returns 0 for it
        if op.kind in FUSED_ELEMENTWISE and gm.gpu != CPU_DEVICE:
            return None  # the fused kernels measured on H100 (costmodel.graph.kernel_basis), never a public sample
        # collectives are the same kernel in either pass: their data (nccl-tests) are stored as fwd
        direction = "bwd" if op.backward and op.kind not in COLLECTIVE_KINDS else "fwd"
        name = f"{op.kind}.{direction}"
        twin = _ring_twin(gm, op.kind)
        if twin is not None:
            return (twin, 1.0, f"xgboost:{gm.gpu}/{twin.split('.')[0]} (as {op.kind}: same ring traffic)",
                    CostSource.DERIVED)
        if name in gm.names:
            return (name, 1.0, f"xgboost:{gm.gpu}/{op.kind}", CostSource.MEASURED)
        d = gm.derived.get(name)
        if d and d.get("from") in gm.names:
            src = d["from"]
            factor = float(d.get("ratio", 1.0))
            label = f"xgboost:{gm.gpu}/{src.split('.')[0]}" + (f" x {factor:.3g}" if "ratio" in d else " (as GEMM)")
            return (src, factor, label, CostSource.DERIVED)
        return None

    def _predict_group(self, ent: _Entry, name, factor, label, src, ops, idx, hw, t, lo, hi, method, source, warns,
                       cache):
        gpu = hw.gpu.name
        kind, direction = name.split(".")
        raw = np.array([ops[i].features for i in idx], dtype=float)
        dtypes = [ops[i].dtype for i in idx]
        anchored = kind in COLLECTIVE_KINDS or ops[idx[0]].kind in ANCHORED_KINDS
        if kind in COLLECTIVE_KINDS:
            p, low, h = self._collective(ent, name, [ops[i] for i in idx], raw, dtypes, hw)
        else:
            p, low, h = self._trees(ent, kind, direction, raw, dtypes)
            if anchored:
                self._anchor(ent, kind, direction, [ops[i] for i in idx], raw, dtypes, hw, p, low, h)
        p, low, h = p * factor, low * factor, h * factor
        how = "anchored to the roofline at the nearest sampled point" if anchored else "extrapolating"
        # out-of-range flags: one warning per (model, feature, side)
        row_w: list[list[str]] = [[] for _ in idx]
        for j, f in enumerate(FEATURES[kind]):
            rng = ent.ranges.get(f)
            if rng is None:
                continue
            col = raw[:, j]
            for side, bad in (("above", col > rng[1]), ("below", col < rng[0])):
                if bad.any():
                    v = col[bad].max() if side == "above" else col[bad].min()
                    msg = f"{kind} {f}={v:g} outside sampled range [{rng[0]:g}, {rng[1]:g}] for {gpu}: {how}"
                    for row in np.flatnonzero(bad):
                        row_w[row].append(msg)
        for r, i in enumerate(idx):
            t[i], lo[i], hi[i], method[i], source[i] = p[r], low[r], h[r], label, src
            w = tuple(row_w[r])
            warns.update(dict.fromkeys(w))
            cache[ops[i].key()] = (float(p[r]), float(low[r]), float(h[r]), label, src, w)

    def _trees(self, ent: _Entry, kind: str, direction: str, raw: np.ndarray, dtypes: list):
        X = build_features(kind, raw, dtypes, direction == "bwd", ent.dev)
        return ent.reg.predict_with_interval(X, self.q)

    def _anchor(self, ent: _Entry, kind, direction, ops: list[Op], raw, dtypes, hw, p, low, h) -> None:
        """Rows outside the sampled box: the trees at the clipped point x the roofline's ratio (shape.py)."""
        clipped, out = clip_to_box(raw, FEATURES[kind], ent.ranges)
        if not out.any():
            return
        rows = np.flatnonzero(out)
        pc, lc, hc = self._trees(ent, kind, direction, clipped[rows], [dtypes[r] for r in rows])
        asked = [ops[r] for r in rows]
        anchors = [replace(ops[r], features=tuple(float(x) for x in clipped[r])) for r in rows]
        ratio = self._roof.predict(asked, hw).time_s / self._roof.predict(anchors, hw).time_s
        p[rows], low[rows], h[rows] = pc * ratio, lc * ratio, hc * ratio

    def _collective(self, ent: _Entry, name: str, ops: list[Op], raw: np.ndarray, dtypes: list, hw):
        """Monotone-in-bytes collective times: isotonic envelope of the trees over the sampled bytes, anchored to
        the alpha-beta model outside them (shape.py)."""
        kind = name.split(".")[0]
        b_lo, b_hi = ent.ranges.get("bytes", (float(raw[:, 0].min()), float(raw[:, 0].max())))
        n = len(ops)
        p, low, h = np.empty(n), np.empty(n), np.empty(n)
        groups: dict[tuple, list[int]] = {}
        for r in range(n):
            groups.setdefault((*raw[r, 1:].tolist(), dtypes[r]), []).append(r)
        for key, rows in groups.items():
            env = self._envelopes.get((id(ent), key))
            if env is None:
                grid = byte_grid(b_lo, b_hi)
                g_raw = np.column_stack([grid] + [np.full(len(grid), v) for v in key[:-1]])
                curves = self._trees(ent, kind, "fwd", g_raw, [key[-1]] * len(grid))
                env = self._envelopes[(id(ent), key)] = (grid, [knots(grid, isotonic(c)) for c in curves])
            grid, curves = env
            nbytes = raw[rows, 0]
            vals = [envelope_at(c, nbytes) for c in curves]
            outside = (nbytes < grid[0]) | (nbytes > grid[-1])
            if outside.any():
                sub = [ops[rows[k]] for k in np.flatnonzero(outside)]
                ends = [grid[0] if op.features[0] < grid[0] else grid[-1] for op in sub]
                anchors = [replace(op, features=(e, *op.features[1:]), bytes=e) for op, e in zip(sub, ends)]
                ratio = self._roof.predict(sub, hw).time_s / self._roof.predict(anchors, hw).time_s
                for v in vals:
                    v[outside] *= ratio
            mid = vals[0]
            p[rows], low[rows], h[rows] = mid, np.minimum(vals[1], mid), np.maximum(vals[2], mid)
        if kind in RANK_ANCHORED_KINDS:
            self._anchor_ranks(ent, name, ops, raw, hw, p, low, h)
        return p, low, h

    def _anchor_ranks(self, ent: _Entry, name: str, ops: list[Op], raw: np.ndarray, hw, p, low, h) -> None:
        """Group sizes above the sampled ones (a collective over 8-72 GPUs of a GB200 NVL72 rack, sampled on one
        4-GPU tray): the trees at the largest sampled group x the alpha-beta model's ratio (shape.py). ``name`` is
        the model's (a ring twin's for all-gather / reduce-scatter), the ratio the asked operator's own."""
        kind = name.split(".")[0]
        clipped, out = clip_to_box(raw, FEATURES[kind], {k: v for k, v in ent.ranges.items() if k != "bytes"})
        if not out.any():
            return
        rows = np.flatnonzero(out)
        asked = [ops[r] for r in rows]
        anchors = [replace(ops[r], features=tuple(float(x) for x in clipped[r])) for r in rows]
        at = self._collective(ent, name, anchors, clipped[rows], [o.dtype for o in anchors], hw)
        ratio = self._roof.predict(asked, hw).time_s / self._roof.predict(anchors, hw).time_s
        for arr, anchored in zip((p, low, h), at):
            arr[rows] = anchored * ratio

    def _fallback(self, ops, idx, hw, t, lo, hi, method, source, warns, cache, extra=(), per_kind=False):
        if not idx:
            return
        sub = [ops[i] for i in idx]
        res = self.fallback.predict(sub, hw)
        base_w = tuple(extra) + tuple(res.warnings)
        for r, i in enumerate(idx):
            op = ops[i]
            w = base_w
            silent = op.kind in COLLECTIVE_KINDS and (op.features[1] <= 1 or op.features[0] <= 0)
            fused = op.kind in FUSED_ELEMENTWISE and hw.gpu.name != CPU_DEVICE
            if per_kind and not silent and not extra and not fused:
                w = w + (f"no measured model for {op.kind} {'bwd' if op.backward else 'fwd'} on {hw.gpu.name}: "
                         f"using the analytical roofline",)
            t[i] = lo[i] = hi[i] = float(res.time_s[r])
            method[i] = "none (single rank)" if silent else FUSED_METHOD if fused else "roofline (no measured model)"
            source[i] = CostSource.NONE if silent else CostSource.DERIVED if fused else CostSource.ROOFLINE
            warns.update(dict.fromkeys(w))
            cache[op.key()] = (t[i], lo[i], hi[i], method[i], source[i], w)


@lru_cache(maxsize=1)
def default_cost_model() -> MeasuredCostModel:
    """The cost model used when none is given: the measured regressors, roofline where none exists (one instance per
    process; ``default_cost_model.cache_clear()`` after the models folder changes, planner.models_dir)."""
    return MeasuredCostModel(fallback=RooflineCostModel())
