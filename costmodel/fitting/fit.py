"""Fit pipeline: datasets -> one regressor per (GPU, operator kind, direction) -> artifacts.

Run through ``planner fit`` (:mod:`planner.cli_fit`). Steps per (kind, gpu, direction):

1. Drop rows not used for training: GEMM ``bwd`` rows (the paper's A100/GH200 "linear" backward
   times are dgrad + wgrad of a forward shape, not one GEMM; they are kept for the
   "backward GEMMs = two GEMMs" check instead), and GEMMs with ``m < GEMM_MIN_M`` (the aiconfigurator
   sweep reaches m = 1: inference decode shapes; training GEMMs have m = tokens per micro-batch or a
   weight dimension).
2. Skip subsets with fewer than ``MIN_SAMPLES`` rows (listed in the index with the reason).
3. Subsample deterministically (seeded) to at most ``max_rows`` rows (the run must fit on 2 cores).
4. Grouped CV model selection (:mod:`costmodel.cost.regressors.selection`), refit of the winner on all
   kept rows with prediction intervals, atomic write of the artifacts (:mod:`costmodel.cost.regressors.artifacts`).

Derivations recorded in the index: backward GEMMs use the forward GEMM model (dgrad (m,k,n) and
wgrad (n,k,m) are GEMMs); ``attention_bwd`` on a GPU without backward data = ratio x its
``attention_fwd`` model, the ratio being the median backward/forward time over paired shapes of the
GPUs that have both (:func:`attention_bwd_ratio`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import FEATURES, Phase
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.regressors import REGISTRY
from costmodel.cost.regressors.artifacts import artifact_path, library_versions, read_index, write_index
from costmodel.cost.regressors.base import sidecar_path
from costmodel.cost.regressors.features import (
    CPU_NOMINAL,
    REF_COL,
    DeviceConstants,
    build_features,
    feature_names,
    flops_bytes,
)
from costmodel.cost.regressors.io import atomic_write_bytes
from costmodel.cost.regressors.loading import load_regressor
from costmodel.cost.regressors.selection import select, shape_groups
from costmodel.cost.roofline import RooflineCostModel
from costmodel.fitting.cpu_hardware import derive, to_toml
from costmodel.fitting.datasets.importers import role_mask
from costmodel.fitting.datasets.schema import Dataset, load_dataset
from costmodel.graph.conventions import dtype_bytes
from costmodel.graph.ops import Op

MIN_SAMPLES = 20
"""Fewest rows to fit a regressor (below, grouped 5-fold CV has < 4 shapes per fold)."""
GEMM_MIN_M = 64
"""GEMM rows with m below this are inference-decode shapes, not used (see module doc)."""
MAX_ROWS = 1500
"""Default cap on training rows per regressor (seeded subsample), so `planner fit` of all shipped
defaults runs in minutes on 2 cores."""
MAX_ROWS_BY_KIND = {"gemm": 100_000, "attention_fwd": 20_000, "attention_bwd": 20_000}
"""Larger caps for the kinds with MAPE targets (issue 3: <= 5 %), where more rows measurably help (above every
current dataset: all rows; grouped-CV GEMM MAPE on h100-sxm fell from 6.2 % at 5000 rows to 4.6 % at all rows)."""
SEED = 0
INDEX_FORMAT = 1


def device_constants(gpu: str) -> tuple[DeviceConstants, str]:
    """(constants, where they came from) for a catalogue GPU or the CPU."""
    if gpu == "cpu":
        return CPU_NOMINAL, "nominal CPU normalisers (costmodel.cost.regressors.features.CPU_NOMINAL)"

    return DeviceConstants.from_hardware(load_catalogue().resolve(gpu)), f"catalogue entry {gpu} (default cluster)"


def _sources(ds: Dataset) -> list:
    out = []
    for s in ds.meta.get("sources", []) or []:
        if isinstance(s, dict):
            out.append({k: s[k] for k in sorted(s) if k in ("path", "sha256", "rows_in", "rows_kept", "filters")})
    return out


def attention_bwd_ratio(datasets: dict) -> dict | None:
    """Median backward/forward time over shapes measured in both directions (any GPU with both)."""
    ratios, used = [], []
    for (kind, gpu), bwd in sorted(datasets.items()):
        fwd = datasets.get(("attention_fwd", gpu))
        if kind != "attention_bwd" or fwd is None:
            continue
        tf: dict = {}
        for f, t in zip(map(tuple, fwd.features), fwd.time_s):
            tf.setdefault(f, []).append(t)
        tb: dict = {}
        for f, t in zip(map(tuple, bwd.features), bwd.time_s):
            tb.setdefault(f, []).append(t)
        r = [float(np.median(tb[f]) / np.median(tf[f])) for f in sorted(tb) if f in tf]
        if r:
            ratios += r
            used.append({"gpu": gpu, "pairs": len(r), "median": float(np.median(r))})
    if not ratios:
        return None
    return {"ratio": float(np.median(ratios)), "evidence": used,
            "method": "median over shapes measured in both directions of time_bwd / time_fwd"}


def _role(ds: Dataset, role: str) -> np.ndarray:
    """Rows of ``role`` (importer roles: train / spot_check / composite_bwd); datasets without roles
    (e.g. ``planner profile`` output) are all training rows."""
    srcs = ds.meta.get("sources", []) or []
    if not srcs or not all(isinstance(s, dict) and "role" in s and "dataset_rows" in s for s in srcs):
        return np.full(len(ds), role == "train")

    return role_mask(ds, role)


def _training_subset(ds: Dataset, direction: str) -> tuple[Dataset, str]:
    mask = (ds.direction == direction) & _role(ds, "train")
    note = ""
    if ds.kind == "gemm":
        small = mask & (ds.features[:, 0] < GEMM_MIN_M)
        if small.any():
            note = f"dropped {int(small.sum())} rows with m < {GEMM_MIN_M} (decode shapes)"
        mask = mask & (ds.features[:, 0] >= GEMM_MIN_M)
    return ds.select(mask), note


def fit_one(ds: Dataset, direction: str, out: Path, *, quick: bool, max_rows: int, seed: int,
            n_jobs: int) -> tuple[dict, float]:
    """Fit, select and save one regressor; returns its index entry and the fit's wall time in seconds."""
    kind, gpu = ds.kind, ds.gpu
    dev, dev_src = device_constants(gpu)
    n_avail = len(ds)
    if max_rows == MAX_ROWS:
        max_rows = MAX_ROWS_BY_KIND.get(kind, max_rows)
    if n_avail > max_rows:
        idx = np.sort(np.random.default_rng(seed).choice(n_avail, max_rows, replace=False))
        ds = ds.select(idx)
    raw, y = ds.features, ds.time_s
    backward = direction == "bwd"
    X = build_features(kind, raw, ds.dtype, backward, dev)
    t0 = time.perf_counter()
    sel = select(X, y, shape_groups(raw), quick=quick, random_state=seed, n_jobs=n_jobs)
    est = REGISTRY[sel.estimator](random_state=seed, n_jobs=n_jobs, ref_col=REF_COL, **sel.params)
    est.fit(X, y)
    fit_s = time.perf_counter() - t0
    raw_ranges = {f: [float(raw[:, i].min()), float(raw[:, i].max())] for i, f in enumerate(FEATURES[kind])}
    meta = {
        "kind": kind, "gpu": gpu, "direction": direction,
        "feature_names": list(feature_names(kind)),
        "raw_feature_ranges": raw_ranges,
        "dtypes": sorted(set(ds.dtype.tolist())),
        "device_constants": dev.to_dict(), "device_constants_source": dev_src,
        "cv": sel.cv, "candidates": sel.candidates,
        "n_samples": int(len(y)), "n_available": int(n_avail),
        "subsample": (f"seeded subsample (seed {seed}) of {len(y)} of {n_avail} rows" if n_avail > len(y) else ""),
        "sources": _sources(ds), "libraries": library_versions(), "seed": seed,
        "target": sel.params.get("target", "ratio"),
    }
    path = est.save(artifact_path(out, gpu, kind, direction), meta)
    return {"file": f"{gpu}/{path.name}", "estimator": sel.estimator, "params": sel.params, "cv": sel.cv,
            "n_samples": int(len(y)), "n_available": int(n_avail), "raw_feature_ranges": raw_ranges}, fit_s


def _ape_summary(pred, meas) -> dict:
    ape = np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)
    return {"rows": int(len(ape)), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9))}


def gemm_checks(ds: Dataset, model_path: Path) -> dict:
    """Checks of the forward GEMM model on rows it never saw: 'backward GEMM = dgrad (m,k,n) + wgrad
    (n,k,m)' on the composite backward rows, and the independent spot-check rows (role spot_check)."""
    out: dict = {}
    if not model_path.exists():
        return out
    reg = load_regressor(model_path)
    dev = DeviceConstants.from_dict(reg.meta_["device_constants"])
    spot = ds.select(_role(ds, "spot_check") & (ds.direction == "fwd"))
    if len(spot):
        p = reg.predict(build_features("gemm", spot.features, spot.dtype, False, dev))
        out["gemm_spot_check"] = {**_ape_summary(p, spot.time_s),
                                  "method": "forward GEMM model vs independent spot-check rows (not trained on)"}
    sub = ds.select((ds.direction == "bwd") & ~_role(ds, "train"))
    if len(sub) == 0:
        return out
    m, n, k = sub.features.T
    dg = reg.predict(build_features("gemm", np.stack([m, k, n], 1), sub.dtype, False, dev))
    wg = reg.predict(build_features("gemm", np.stack([n, k, m], 1), sub.dtype, False, dev))
    out["gemm_bwd_as_two_gemms"] = {**_ape_summary(dg + wg, sub.time_s),
                                    "method": "forward-model time of dgrad (m,k,n) + wgrad (n,k,m) vs measured "
                                              "backward of the forward shape"}
    return out


def fit_all(datasets: dict, out: Path, *, gpus=None, kinds=None, quick: bool = False, max_rows: int = MAX_ROWS,
            seed: int = SEED, n_jobs: int = 2, log: Callable[[str], None] = print,
            sync_skew: dict | None = None, corun: dict | None = None) -> dict:
    """Fit every (kind, gpu, direction) with enough data; write artifacts and ``index.json``.

    ``sync_skew`` / ``corun``: the profile's rank-skew and co-run measurements (costmodel/profiling/sampling/skew.load,
    corun.load), for the CPU's hardware.toml."""
    out = Path(out)
    index = read_index(out) or {}
    index = {"format": INDEX_FORMAT, "models": index.get("models", {}), "skipped": index.get("skipped", {}),
             "derived": index.get("derived", {}), "checks": index.get("checks", {}),
             "libraries": library_versions(), "seed": seed,
             "settings": {"min_samples": MIN_SAMPLES, "gemm_min_m": GEMM_MIN_M, "max_rows": max_rows,
                          "quick": quick}}
    keys = sorted(k for k in datasets if (gpus is None or k[1] in gpus) and (kinds is None or k[0] in kinds))
    t_all = time.perf_counter()
    # first: fallback_mape below costs the CPU's roofline with these measured figures
    _write_cpu_hardware(datasets, out, log, sync_skew, corun)
    for gpu in sorted({g for _, g in keys}):
        index["models"].setdefault(gpu, {})
        index["skipped"][gpu] = {k: v for k, v in index["skipped"].get(gpu, {}).items()
                                 if kinds is not None and k.split(".")[0] not in kinds}
        if kinds is None:  # a full refit of this GPU: remove stale artifacts first
            index["models"][gpu] = {}
            for p in sorted((out / gpu).glob("*.json")) if (out / gpu).is_dir() else []:
                p.unlink()
    for kind, gpu in keys:
        ds = datasets[(kind, gpu)]
        for direction in sorted(set(ds.direction.tolist())):
            name = f"{kind}.{direction}"
            index["models"][gpu].pop(name, None)
            if kind == "gemm" and direction == "bwd":
                if not _role(ds, "train")[ds.direction == "bwd"].any():
                    index["skipped"][gpu][name] = ("not trained: measured backward 'linear' rows are dgrad + wgrad "
                                                   "of a forward shape; backward GEMMs use the forward GEMM model")
                    continue
            sub, note = _training_subset(ds, direction)
            if len(sub) < MIN_SAMPLES:
                index["skipped"][gpu][name] = f"{len(sub)} samples < {MIN_SAMPLES} {note}".strip()
                log(f"skip {gpu} {name}: {index['skipped'][gpu][name]}")
                continue
            entry, fit_s = fit_one(sub, direction, out, quick=quick, max_rows=max_rows, seed=seed, n_jobs=n_jobs)
            if note:
                entry["note"] = note
            # the analytical fallback's error on the same samples, so the predict path can tell whether a
            # regressor with a high CV error is still better than what would replace it (cost/measured.py)
            fb = fallback_mape(sub, direction, out)
            if fb is not None:
                entry["fallback_mape"] = fb
            index["models"][gpu][name] = entry
            cv = entry["cv"]
            log(f"fit {gpu} {name}: {entry['estimator']} n={entry['n_samples']} CV MAPE {cv['mape']:.1%} "
                f"median {cv['median_ape']:.1%} p90 {cv['p90_ape']:.1%} ({fit_s:.1f} s)")
    # ---- derivations and checks
    ratio = attention_bwd_ratio(datasets)
    for gpu in sorted({g for _, g in keys}):
        models = index["models"].get(gpu, {})
        der = {"gemm.bwd": {"from": "gemm.fwd", "method": "dgrad (m,k,n) and wgrad (n,k,m) are GEMMs: costed "
                            "by the forward GEMM model"}} if "gemm.fwd" in models else {}
        if "attention_fwd.fwd" in models and "attention_bwd.bwd" not in models:
            if ratio is not None:
                der["attention_bwd.bwd"] = {**ratio, "from": "attention_fwd.fwd"}
        index["derived"][gpu] = der
        if ("gemm", gpu) in datasets:
            chk = gemm_checks(datasets[("gemm", gpu)], artifact_path(out, gpu, "gemm", "fwd"))
            if chk:
                index["checks"][gpu] = chk
                for name, c in chk.items():
                    log(f"check {gpu} {name}: MAPE {c['mape']:.1%} over {c['rows']} rows")
    index["models"] = {g: v for g, v in sorted(index["models"].items()) if v}
    write_index(out, index)
    log(f"wrote {out} in {time.perf_counter() - t_all:.0f} s")
    return index


def fallback_mape(ds: Dataset, direction: str, out: Path) -> float | None:
    """MAPE of the analytical roofline (the measured cost model's fallback) on the rows ``ds``.

    In-sample for the roofline's few fitted efficiencies (costmodel/fitting/efficiency.py fits them from the
    public data; for a CPU they are the GPUs' median); None when the device is not in the catalogue
    (nor in ``out``/hardware.toml) or has no rows.
    """
    if len(ds) == 0:
        return None
    extra = [Path(out) / "hardware.toml"] if (Path(out) / "hardware.toml").is_file() else []
    try:
        hw = load_catalogue(extra).resolve(ds.gpu)
    except PlannerError:
        return None
    backward = direction == "bwd"
    db = np.array([dtype_bytes(d) for d in ds.dtype], dtype=float)
    flops, byts = flops_bytes(ds.kind, ds.features, db, backward)
    ops = [Op(ds.kind, ds.kind, Phase(direction), tuple(float(x) for x in f), flops=float(fl), bytes=float(b),
              dtype=str(d)) for f, fl, b, d in zip(ds.features, flops, byts, ds.dtype)]
    pred = RooflineCostModel().predict(ops, hw).time_s
    return float(np.mean(np.abs(pred / ds.time_s - 1.0)))


def _write_cpu_hardware(datasets: dict, out: Path, log, sync_skew: dict | None = None,
                        corun: dict | None = None) -> None:
    """Beside CPU models, write the CPU's measured hardware figures (costmodel/fitting/cpu_hardware.py)."""
    if not any(k[1] == "cpu" for k in datasets):
        return

    try:
        entry = derive(datasets, sync_skew, corun)
    except PlannerError as exc:
        log(f"no hardware.toml for the CPU: {exc}")
        return
    if entry is not None:
        atomic_write_bytes(Path(out) / "hardware.toml", to_toml(entry).encode())
        log(f"wrote {Path(out) / 'hardware.toml'} (measured CPU figures; set PLANNER_MODELS_DIR={out})")


def dataset_dirs_to_datasets(dirs) -> dict:
    """Every dataset (``*.csv`` + sidecar) under the given folders (``planner profile`` output)."""
    out: dict = {}
    for d in dirs:
        for p in sorted(Path(d).rglob("*.csv")):
            if not p.with_suffix(".json").exists():
                continue
            ds = load_dataset(p)
            key = (ds.kind, ds.gpu)
            out[key] = ds if key not in out else _concat(out[key], ds)
    return out


def _concat(a: Dataset, b: Dataset) -> Dataset:
    meta = dict(a.meta)
    meta["sources"] = list(a.meta.get("sources", []) or []) + list(b.meta.get("sources", []) or [])
    return Dataset(a.kind, a.gpu, np.vstack([a.features, b.features]), np.concatenate([a.direction, b.direction]),
                   np.concatenate([a.dtype, b.dtype]), np.concatenate([a.time_s, b.time_s]),
                   np.concatenate([a.spread_s, b.spread_s]), np.concatenate([a.repeats, b.repeats]),
                   np.concatenate([a.source_row, b.source_row]), meta)


def model_file_of(models_dir: Path, gpu: str, name: str) -> Path:
    kind, direction = name.split(".")
    return sidecar_path(artifact_path(models_dir, gpu, kind, direction))


# ----------------------------------------------------------------------------------------------
# Report (`planner costmodel report`)
# ----------------------------------------------------------------------------------------------

TARGETS = {"gemm": 0.05, "attention_fwd": 0.05, "attention_bwd": 0.05, **{k: 0.10 for k in
           ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")}}
"""Grouped-CV MAPE targets of issue 3 ("Done means")."""


def _why(kind: str, entry: dict) -> str:
    """Why a target was missed and what measurement would fix it (from the data's known properties)."""
    n = entry.get("n_samples", 0)
    if kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"):
        return (f"only {n} samples over few message sizes/rank counts; grouped CV holds out whole sizes, so "
                "interpolation between power-of-two sizes and across the latency/bandwidth knee is sparse. Fix: "
                "an nccl-tests sweep with 4+ sizes per octave and every rank count used, repeated 3x")
    if kind == "gemm":
        return ("GEMM times jump between kernel tiles/wave quantisation at shapes a grouped CV never sees. "
                "Fix: denser m/n/k sweep around LLM shapes (multiples of 64/128)")
    if kind.startswith("attention"):
        return ("mixed sources (sglang/flash-attn, causal/non-causal) and few shapes per (heads, head_dim); "
                "Fix: a training-style flash-attention fwd+bwd sweep over seq, heads, kv_heads, head_dim")
    return "no target set for this kind"


def report_rows(models_dir: Path) -> list[dict]:
    idx = read_index(Path(models_dir))
    if not idx:
        raise PlannerError(f"no model index in {models_dir}; run `planner fit --out {models_dir}` first")
    rows = []
    for gpu, models in sorted(idx.get("models", {}).items()):
        for name, e in sorted(models.items()):
            kind, direction = name.split(".")
            target = TARGETS.get(kind)
            cv = e["cv"]
            met = None if target is None else cv["mape"] <= target
            rows.append({"gpu": gpu, "kind": kind, "direction": direction, "samples": e["n_samples"],
                         "available": e.get("n_available", e["n_samples"]), "model": e["estimator"],
                         "target": e["params"].get("target", ""),
                         "cv_mape": cv["mape"], "median_ape": cv["median_ape"], "p90_ape": cv["p90_ape"],
                         "ranges": e["raw_feature_ranges"], "mape_target": target, "met": met,
                         "why": "" if met in (None, True) else _why(kind, e)})
    return rows


def _fmt_ranges(r: dict) -> str:
    return ", ".join(f"{k} {v[0]:g}..{v[1]:g}" for k, v in r.items())


def render_report(models_dir: Path, fmt: str = "table") -> str:
    rows = report_rows(models_dir)
    idx = read_index(Path(models_dir))
    if fmt == "json":
        return json.dumps({"models": rows, "skipped": idx.get("skipped", {}), "derived": idx.get("derived", {}),
                           "checks": idx.get("checks", {}), "libraries": idx.get("libraries", {})},
                          indent=1, sort_keys=True) + "\n"
    head = ["gpu", "kind", "dir", "samples", "model", "target", "CV MAPE", "median", "p90", "goal"]
    body = []
    for r in rows:
        goal = "-" if r["mape_target"] is None else (f"<= {r['mape_target']:.0%} " + ("met" if r["met"] else "NOT MET"))
        body.append([r["gpu"], r["kind"], r["direction"], f"{r['samples']}/{r['available']}", r["model"],
                     r["target"], f"{r['cv_mape']:.1%}", f"{r['median_ape']:.1%}", f"{r['p90_ape']:.1%}", goal])
    if fmt == "table":
        w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(str(x).ljust(n) for x, n in zip(line, w)) for line in [head, *body]]
        for r in rows:
            if r["met"] is False:
                lines.append(f"not met: {r['gpu']} {r['kind']} {r['direction']}: {r['why']}")
        return "\n".join(lines) + "\n"
    if fmt != "md":
        raise PlannerError(f"unknown report format {fmt!r}; use table, json or md")
    out = ["# Measured operator cost models: cross-validation report", "",
           "Generated by `planner costmodel report --format md` from `costmodel/data/models/index.json` "
           "(fitted by `planner fit` from `../shared/data`). Errors are grouped-CV (whole shapes held out, "
           "GroupKFold) absolute percentage errors of the predicted time, mean over folds. `samples` = "
           "rows used / rows available after filtering. `target` = what the trees learn: `ratio` = "
           "log(time / unit roofline), `time` = log(time), chosen by CV.", "",
           "| " + " | ".join(head) + " | training ranges |", "|" + "---|" * (len(head) + 1)]
    for r, b in zip(rows, body):
        out.append("| " + " | ".join(b) + f" | {_fmt_ranges(r['ranges'])} |")
    missed = [r for r in rows if r["met"] is False]
    out += ["", "## Targets not met", ""]
    out += [f"- **{r['gpu']} {r['kind']} {r['direction']}** (CV MAPE {r['cv_mape']:.1%}): {r['why']}" for r in missed] \
        or ["All GEMM/attention (<= 5 %) and collective (<= 10 %) targets are met where data exists."]
    out += ["", "## Skipped (no regressor fitted)", ""]
    for gpu, sk in sorted(idx.get("skipped", {}).items()):
        for name, why in sorted(sk.items()):
            out.append(f"- {gpu} {name}: {why}")
    out += ["", "## Derived operators", ""]
    for gpu, der in sorted(idx.get("derived", {}).items()):
        for name, d in sorted(der.items()):
            ratio = f" x {d['ratio']:.3f} ({d.get('method', '')}; evidence {d.get('evidence')})" if "ratio" in d else ""
            out.append(f"- {gpu} {name}: {d.get('method', '') if not ratio else 'attention_fwd model'}{ratio}")
    out += ["", "## Checks", ""]
    for gpu, chk in sorted(idx.get("checks", {}).items()):
        for name, c in sorted(chk.items()):
            out.append(f"- {gpu} {name}: MAPE {c['mape']:.1%}, median {c['median_ape']:.1%}, p90 {c['p90_ape']:.1%} "
                       f"over {c['rows']} measured rows ({c['method']})")
    out += ["", f"Libraries: {idx.get('libraries', {})}; seed {idx.get('seed')}; settings {idx.get('settings', {})}.",
            ""]
    return "\n".join(out)
