"""Measured operator costs: the fitted per-operator tree regressors behind the cost seam.

Artifacts (:mod:`costmodel.regressors.artifacts`) are looked up in, in order: the ``models_dir``
argument, ``$PLANNER_MODELS_DIR``, then the defaults shipped in ``costmodel/data/models``. They are
loaded lazily, one (GPU, kind, direction) at a time, from xgboost JSON (no pickle, no torch).

Per operator the model is, in order of preference:

1. the regressor fitted for (GPU, kind, direction): method ``xgboost:<gpu>/<kind>``;
2. a recorded derivation (index.json ``derived``): backward GEMMs (dgrad/wgrad) through the forward
   GEMM model; ``attention_bwd`` = ratio x the ``attention_fwd`` model;
3. the analytical fallback (:class:`~costmodel.cost.roofline.RooflineCostModel`), with a warning.

Operators outside a regressor's sampled feature ranges are flagged (one warning per feature).
Prediction intervals (``low_s``/``high_s``) come from the ensembles; fallback rows repeat the point.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COLLECTIVE_KINDS, FEATURES
from costmodel.core.specs.hardware import Hardware
from costmodel.cost.base import CostResult, CostSource, OperatorCostModel
from costmodel.cost.roofline import RooflineCostModel
from costmodel.ops import Op
from costmodel.regressors.artifacts import SHIPPED_MODELS_DIR, read_index
from costmodel.regressors.features import DeviceConstants, build_features, feature_names
from costmodel.regressors.runtime import RuntimeRegressor

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


class MeasuredCostModel(OperatorCostModel):
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

    # -- predict -----------------------------------------------------------------------------
    def predict(self, ops: Sequence[Op], hardware: Hardware) -> CostResult:
        gpu = hardware.gpu.name
        gm = self._models(gpu)
        cache = self._cache.setdefault((gpu, hardware.cluster.name, hardware.gpus_per_node, hardware.nvlink_domain), {})
        n = len(ops)
        t, lo, hi = np.empty(n), np.empty(n), np.empty(n)
        method = [""] * n
        source = [CostSource.ROOFLINE] * n
        warns: dict[str, None] = {}
        groups: dict[tuple, list[int]] = {}
        fb: list[int] = []
        cross: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            hit = cache.get(op.key())
            if hit is not None:
                t[i], lo[i], hi[i], method[i], source[i], w = hit
                warns.update(dict.fromkeys(w))
                continue
            plan = self._route(gm, op)
            if plan is None:
                fb.append(i)
            elif self._crosses_nodes(gm, plan[0], op):
                cross.setdefault(plan[0], []).append(i)
            else:
                groups.setdefault(plan, []).append(i)
        for name, idx in cross.items():
            self._fallback(ops, idx, hardware, t, lo, hi, method, source, warns, cache,
                           (f"{name.split('.')[0]} across nodes: costed with the cluster's network figures "
                            "(alpha-beta model); measured samples describe another network or none",))
        for (name, factor, label, src), idx in groups.items():
            ent = gm.entry(name)
            if not isinstance(ent, _Entry):  # unusable artifact: flagged fallback, never a traceback
                self._fallback(ops, idx, hardware, t, lo, hi, method, source, warns, cache,
                               (f"{ent}: using the analytical roofline for {name} on {gpu}",))
                continue
            try:
                self._predict_group(ent, name, factor, label, src, ops, idx, t, lo, hi, method, source, warns,
                                    cache, gpu)
            except ValueError as exc:  # e.g. an artifact fitted with another feature layout: flagged fallback
                self._fallback(ops, idx, hardware, t, lo, hi, method, source, warns, cache,
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
            self._fallback(ops, fb, hardware, t, lo, hi, method, source, warns, cache, extra, per_kind=bool(gm.names))
        return CostResult(time_s=t, low_s=lo, high_s=hi, method=method, source=source, warnings=sorted(warns))

    @staticmethod
    def _crosses_nodes(gm: _GpuModels, name: str, op: Op) -> bool:
        """A collective spanning several NVLink domains ("nodes" in the features, costmodel/graph.py) is costed
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
        # collectives are the same kernel in either pass: their data (nccl-tests) are stored as fwd
        direction = "bwd" if op.backward and op.kind not in COLLECTIVE_KINDS else "fwd"
        name = f"{op.kind}.{direction}"
        if name in gm.names:
            return (name, 1.0, f"xgboost:{gm.gpu}/{op.kind}", CostSource.MEASURED)
        d = gm.derived.get(name)
        if d and d.get("from") in gm.names:
            src = d["from"]
            factor = float(d.get("ratio", 1.0))
            label = f"xgboost:{gm.gpu}/{src.split('.')[0]}" + (f" x {factor:.3g}" if "ratio" in d else " (as GEMM)")
            return (src, factor, label, CostSource.DERIVED)
        return None

    def _predict_group(self, ent: _Entry, name, factor, label, src, ops, idx, t, lo, hi, method, source, warns, cache,
                       gpu):
        kind, direction = name.split(".")
        raw = np.array([ops[i].features for i in idx], dtype=float)
        X = build_features(kind, raw, [ops[i].dtype for i in idx], direction == "bwd", ent.dev)
        p, low, h = ent.reg.predict_with_interval(X, self.q)
        p, low, h = p * factor, low * factor, h * factor
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
                    msg = (f"{kind} {f}={v:g} outside sampled range [{rng[0]:g}, {rng[1]:g}] for {gpu}: extrapolating")
                    for row in np.flatnonzero(bad):
                        row_w[row].append(msg)
        for r, i in enumerate(idx):
            t[i], lo[i], hi[i], method[i], source[i] = p[r], low[r], h[r], label, src
            w = tuple(row_w[r])
            warns.update(dict.fromkeys(w))
            cache[ops[i].key()] = (float(p[r]), float(low[r]), float(h[r]), label, src, w)

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
            if per_kind and not silent and not extra:
                w = w + (f"no measured model for {op.kind} {'bwd' if op.backward else 'fwd'} on {hw.gpu.name}: "
                         f"using the analytical roofline",)
            t[i] = lo[i] = hi[i] = float(res.time_s[r])
            method[i] = "none (single rank)" if silent else "roofline (no measured model)"
            source[i] = CostSource.NONE if silent else CostSource.ROOFLINE
            warns.update(dict.fromkeys(w))
            cache[op.key()] = (t[i], lo[i], hi[i], method[i], source[i], w)
