"""Sampling plans: TOML data files (``costmodel/profiling/sampling/plans/*.toml``) expanded into samples.

A plan has top-level ``name``, ``description``, ``dtype`` (compute dtype), a ``[timing]`` table, one
``[ops.<kind>]`` table per compute operator kind and an optional ``[collectives]`` table.

``[ops.<kind>]`` keys:

* ``design``: ``"grid"`` (cartesian product of the feature lists) or ``"lhs"`` (Latin hypercube of
  ``samples`` points, seeded by ``seed``; McKay, Beckman & Conover 1979)
* one key per feature of the kind (``costmodel.core.kinds.FEATURES``): a number (fixed), a list (grid axis /
  stratified choice), ``{min, max, log, multiple_of}`` (a continuous LHS axis, log-uniform when
  ``log``) or ``"=other"`` (same value as feature ``other``, e.g. ``seq_kv = "=seq_q"``)
* ``directions``: subset of the kind's directions (default: all it has)
* ``max_gflop``: drop points above this many GFLOP (gemm, attention) so a plan stays in its time budget
* ``variant``: ``activation`` (gated = 0) = ``"gelu"`` | ``"squared_relu"`` (norm: the ``rms`` feature chooses
  RMSNorm (1) or LayerNorm (0), so both can be sampled in one plan, e.g. ``rms = [0, 1]``)
* ``bwd_layouts`` (gemm): backward GEMM layouts assigned in turn to the shapes (``"dgrad"``, ``"wgrad"``)

Feature values are then made valid for the operator (:func:`normalize_features`) and de-duplicated.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.kinds import COLLECTIVE_KINDS, COMPUTE_KINDS, FEATURES

PLANS_DIR = Path(__file__).parent / "plans"
DIRECTIONS = {  # directions each kind has in the operator graph (costmodel/graph/build.py)
    "gemm": ("fwd", "bwd"), "attention_fwd": ("fwd",), "attention_bwd": ("bwd",), "norm": ("fwd", "bwd"),
    "activation": ("fwd", "bwd"), "rope": ("fwd", "bwd"), "residual_add": ("fwd",),
    "embedding": ("fwd", "bwd"), "cross_entropy": ("fwd", "bwd"), "optimizer": ("fwd",),
}
VARIANTS = {"activation": ("gelu", "squared_relu")}
NORM_VARIANTS = {1: "rms", 0: "layer"}
"""Variant recorded for a norm sample from its ``rms`` feature (costmodel/graph/ops.py)."""
FP32_KINDS = {"cross_entropy": "fp32 logits (graph/build.py _head_ops)", "optimizer": "fp32 master weights, m, v"}
OP_KEYS = {"design", "samples", "seed", "directions", "max_gflop", "variant", "bwd_layouts", "flush_mb"}
COMPUTE_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Timing:
    """How each compute sample is timed."""

    warmup: int = 3
    """Untimed calls before measuring (allocator, caches, lazy kernel selection)."""
    min_run_time_s: float = 0.05
    """Keep measuring blocks until this much time is spent (and min_repeats reached)."""
    min_repeats: int = 5
    """At least this many timed blocks per sample (the median and p10/p90 are over blocks)."""
    max_repeats: int = 200
    """Stop after this many blocks."""
    checkpoint_every: int = 25
    """Rewrite the datasets after this many newly measured samples."""
    flush_mb: float = 0.0
    """(Overridable per operator kind by ``flush_mb`` in its [ops.<kind>] table.) > 0: time single calls,
    each after writing a buffer of this many MiB (untimed) so the operator
    starts with cold caches, as inside a training step whose working set exceeds the caches
    (costmodel/profiling/sampling/operators.py ``time_fn``); 0 keeps the back-to-back blocks."""


@dataclass(frozen=True)
class Sample:
    """One compute measurement to make."""

    kind: str
    direction: str
    dtype: str
    features: tuple
    """Integer feature values in the order of FEATURES[kind]."""
    variant: str = ""
    """Implementation label: gemm bwd layout, norm type (from the rms feature), plain activation."""
    index: int = 0
    """Position among the plan's samples of this kind (the dataset's source_row)."""

    def key(self) -> str:
        """Identity in the journal (independent of the index, so a re-ordered plan still resumes)."""
        return "|".join([self.kind, self.direction, self.dtype, self.variant, *map(str, self.features)])


@dataclass
class Plan:
    name: str
    path: Path
    sha256: str
    description: str
    dtype: str
    timing: Timing
    ops: dict = field(default_factory=dict)
    """kind -> raw [ops.<kind>] table."""
    collectives: dict = field(default_factory=dict)
    """Raw [collectives] table ({} when absent)."""


def op_timing(plan: "Plan", kind: str) -> Timing:
    """The plan's timing for operator ``kind`` (its [ops.<kind>] ``flush_mb`` overrides [timing]'s)."""
    flush = plan.ops.get(kind, {}).get("flush_mb")
    if flush is None:
        return plan.timing
    return replace(plan.timing, flush_mb=float(flush))


def available_plans() -> list[str]:
    return sorted(p.stem for p in PLANS_DIR.glob("*.toml"))


def resolve_plan(name_or_path: str | Path) -> Path:
    """A built-in plan name (``cpu-small``) or a path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise PlannerError(f"plan file {p} does not exist; pass a TOML file or one of: "
                               f"{', '.join(available_plans())}")
        return p
    builtin = PLANS_DIR / f"{name_or_path}.toml"
    if not builtin.is_file():
        raise PlannerError(f"unknown plan {str(name_or_path)!r}; choose one of: {', '.join(available_plans())} "
                           "or pass a path to a .toml plan")
    return builtin


def load_plan(name_or_path: str | Path) -> Plan:
    path = resolve_plan(name_or_path)
    raw_bytes = path.read_bytes()
    try:
        raw = tomllib.loads(raw_bytes.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PlannerError(f"plan {path} is not valid TOML ({exc}); fix the file") from None
    dtype = raw.get("dtype", "fp32")
    if dtype not in COMPUTE_DTYPES:
        raise PlannerError(f"plan {path}: dtype {dtype!r} must be one of {', '.join(COMPUTE_DTYPES)}")
    timing_raw = raw.get("timing", {})
    unknown = set(timing_raw) - set(Timing.__dataclass_fields__)
    if unknown:
        raise PlannerError(f"plan {path}: unknown [timing] keys {sorted(unknown)}; allowed: "
                           f"{', '.join(Timing.__dataclass_fields__)}")
    ops = raw.get("ops", {})
    for kind, spec in ops.items():
        if kind not in COMPUTE_KINDS:
            raise PlannerError(f"plan {path}: [ops.{kind}] is not a compute operator kind; allowed: "
                               f"{', '.join(k for k in FEATURES if k in COMPUTE_KINDS)}")
        bad = set(spec) - OP_KEYS - set(FEATURES[kind])
        if bad:
            raise PlannerError(f"plan {path}: [ops.{kind}] has unknown keys {sorted(bad)}; allowed: "
                               f"{', '.join(sorted(OP_KEYS | set(FEATURES[kind])))}")
    coll = raw.get("collectives", {})
    for kind in coll.get("ops", []):
        if kind not in COLLECTIVE_KINDS:
            raise PlannerError(f"plan {path}: collective {kind!r} is not one of {', '.join(sorted(COLLECTIVE_KINDS))}")
    if "group_sizes" in coll:
        try:
            resolve_group_sizes(coll["group_sizes"], world=1 << 30)  # syntax only; the launch knows its world
        except PlannerError as exc:
            raise PlannerError(f"plan {path}: {exc}") from None
    return Plan(raw.get("name", path.stem), path, hashlib.sha256(raw_bytes).hexdigest(),
                raw.get("description", ""), dtype, Timing(**timing_raw), ops, coll)


# ---------------------------------------------------------------------------- the [collectives] table
def message_sizes(spec) -> list[int]:
    """The ``bytes`` entry of a plan: a list, or ``{min, max, factor}`` (min, min*factor, ... <= max)."""
    if isinstance(spec, list):
        sizes = [int(x) for x in spec]
    elif isinstance(spec, dict) and {"min", "max"} <= set(spec):
        factor = float(spec.get("factor", 2))
        if factor <= 1:
            raise PlannerError("[collectives] bytes.factor must be > 1")
        sizes, b = [], float(spec["min"])
        while b <= float(spec["max"]) * (1 + 1e-9):
            sizes.append(int(round(b)))
            b *= factor
    else:
        raise PlannerError("[collectives] bytes must be a list or {min, max, factor}")
    if not sizes or min(sizes) <= 0:
        raise PlannerError("[collectives] bytes must hold positive sizes")
    return sizes


def resolve_group_sizes(spec, world: int) -> tuple[list[int], list[int]]:
    """The ``group_sizes`` entry of a plan for a launch of ``world`` ranks: (the distinct sizes to sample, in
    the plan's order, ``"world"`` read as ``world``; the sizes larger than ``world``, which this launch cannot
    sample). A plan may name 2 and ``"world"``: on 2 ranks they are the same group, sampled once."""
    if not isinstance(spec, list) or not spec:
        raise PlannerError('[collectives] group_sizes must be a non-empty list of integers >= 2 and/or "world"')
    sizes, too_big = [], []
    for g in spec:
        if g == "world":
            g = world
        elif isinstance(g, bool) or not isinstance(g, int) or g < 2:
            raise PlannerError(f'[collectives] group_sizes entry {g!r} is not an integer >= 2 or "world"')
        if g > world:
            too_big.append(g)
        elif g not in sizes:
            sizes.append(g)
    return sizes, too_big


# ------------------------------------------------------------------------------------------ designs
def _round(v: float, spec: dict) -> int:
    mult = int(spec.get("multiple_of", 1))
    lo = math.ceil(spec["min"] / mult) * mult
    return max(lo, int(round(v / mult)) * mult)


def _lhs(kind: str, spec: dict, n: int, rng: np.random.Generator) -> list[dict]:
    """Latin hypercube: each feature's range cut in n strata, one point per stratum, strata shuffled."""
    cols: dict[str, list] = {}
    for f in FEATURES[kind]:
        s = spec.get(f)
        perm = rng.permutation(n)
        if isinstance(s, dict):
            u = (perm + rng.random(n)) / n
            lo, hi = float(s["min"]), float(s["max"])
            if s.get("log", False):
                vals = np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))
            else:
                vals = lo + u * (hi - lo)
            cols[f] = [_round(v, s) for v in vals]
        elif isinstance(s, list):
            cols[f] = [s[(p * len(s)) // n] for p in perm]
        else:
            cols[f] = [s] * n
    return [{f: cols[f][i] for f in cols} for i in range(n)]


def _grid(kind: str, spec: dict) -> list[dict]:
    axes = []
    for f in FEATURES[kind]:
        s = spec.get(f)
        if isinstance(s, dict):
            raise PlannerError(f"[ops.{kind}] feature {f}: a {{min, max}} range needs design = \"lhs\"")
        axes.append(s if isinstance(s, list) else [s])
    return [dict(zip(FEATURES[kind], combo)) for combo in itertools.product(*axes)]


def _resolve_refs(kind: str, point: dict) -> dict:
    out = dict(point)
    for f, v in point.items():
        if isinstance(v, str):
            if not v.startswith("=") or v[1:] not in point or isinstance(point[v[1:]], str):
                raise PlannerError(f"[ops.{kind}] feature {f} = {v!r}: use '=<other feature>'")
            out[f] = point[v[1:]]
    return out


def normalize_features(kind: str, feats: dict) -> tuple:
    """Make a design point a valid operator instance (as costmodel/graph/build.py would emit it)."""
    f = {k: int(v) for k, v in feats.items()}
    if kind in ("attention_fwd", "attention_bwd"):
        # GQA needs kv_heads | heads: take the largest divisor of heads not above the drawn value
        f["kv_heads"] = max(d for d in range(1, f["heads"] + 1) if f["heads"] % d == 0 and d <= max(1, f["kv_heads"]))
        f["seq_kv"] = max(f["seq_kv"], f["seq_q"])  # every query must see at least one key
        f["causal"] = 1 if f["causal"] else 0
    elif kind == "norm":
        f["rms"] = 1 if f["rms"] else 0
    elif kind == "activation":
        f["gated"] = 1 if f["gated"] else 0
        if f["gated"] and f["width"] % 2:
            f["width"] += 1  # gated input is [gate | up], two equal halves
    elif kind == "rope" and f["head_dim"] % 2:
        f["head_dim"] += 1  # rotate-half needs an even head dim
    for k, v in f.items():
        if v < (0 if k in ("causal", "gated", "rms") else 1):
            raise PlannerError(f"[ops.{kind}] feature {k} = {v} is out of range")
    return tuple(f[k] for k in FEATURES[kind])


def gflop(kind: str, feats: tuple) -> float:
    """Arithmetic of one call in GFLOP, as costmodel/graph/build.py counts it (gemm and attention only)."""
    if kind == "gemm":
        m, n, k = feats
        return 2.0 * m * n * k / 1e9
    if kind in ("attention_fwd", "attention_bwd"):
        b, sq, skv, h, _, d, causal = feats
        fwd = 4.0 * b * sq * skv * h * d * (0.5 if causal else 1.0)
        return fwd * (2.5 if kind == "attention_bwd" else 1.0) / 1e9
    return 0.0


def design_points(kind: str, spec: dict) -> list[tuple]:
    """The plan's feature tuples for one kind (normalized, de-duplicated, within max_gflop)."""
    missing = [f for f in FEATURES[kind] if f not in spec]
    if missing:
        raise PlannerError(f"[ops.{kind}] is missing features {missing}")
    design = spec.get("design", "grid")
    limit = spec.get("max_gflop")

    def keep(points: list[dict]) -> list[tuple]:
        out, seen = [], set()
        for p in points:
            t = normalize_features(kind, _resolve_refs(kind, p))
            if t not in seen and (limit is None or gflop(kind, t) <= limit):
                seen.add(t)
                out.append(t)
        return out

    if design == "grid":
        return keep(_grid(kind, spec))
    if design != "lhs":
        raise PlannerError(f"[ops.{kind}] design {design!r} must be 'grid' or 'lhs'")
    n = int(spec.get("samples", 0))
    if n <= 0:
        raise PlannerError(f"[ops.{kind}] design 'lhs' needs samples > 0")
    seed = int(spec.get("seed", 0))
    points: list[tuple] = []
    for attempt in range(8):  # oversample when max_gflop or de-duplication removed points
        rng = np.random.default_rng([seed, attempt])
        points = keep(_lhs(kind, spec, n * 2 ** attempt, rng))
        if len(points) >= n:
            pick = np.sort(rng.choice(len(points), size=n, replace=False))
            return [points[i] for i in pick]
    return points


def expand(plan: Plan, ops: list[str] | None = None, dtype: str | None = None) -> list[Sample]:
    """All compute samples of ``plan`` (optionally only ``ops``), in plan order."""
    compute_dtype = dtype or plan.dtype
    if compute_dtype not in COMPUTE_DTYPES:
        raise PlannerError(f"dtype {compute_dtype!r} must be one of {', '.join(COMPUTE_DTYPES)}")
    samples: list[Sample] = []
    for kind, spec in plan.ops.items():
        if ops is not None and kind not in ops:
            continue
        dirs = spec.get("directions", list(DIRECTIONS[kind]))
        bad = [d for d in dirs if d not in DIRECTIONS[kind]]
        if bad:
            raise PlannerError(f"[ops.{kind}] directions {bad} not measurable; {kind} has {list(DIRECTIONS[kind])}")
        if kind == "norm" and "variant" in spec:
            raise PlannerError("[ops.norm] variant is replaced by the rms feature: write rms = 1 (RMSNorm), "
                               "rms = 0 (LayerNorm) or rms = [0, 1]")
        variant = spec.get("variant", VARIANTS.get(kind, ("",))[0])
        if kind in VARIANTS and variant not in VARIANTS[kind]:
            raise PlannerError(f"[ops.{kind}] variant {variant!r} must be one of {', '.join(VARIANTS[kind])}")
        layouts = spec.get("bwd_layouts", ["dgrad", "wgrad"])
        if kind == "gemm" and (not layouts or set(layouts) - {"dgrad", "wgrad"}):
            raise PlannerError("[ops.gemm] bwd_layouts must be a non-empty list of 'dgrad' / 'wgrad'")
        dt = "fp32" if kind in FP32_KINDS else compute_dtype
        start = len(samples)
        for i, feats in enumerate(design_points(kind, spec)):
            for d in dirs:
                v = variant
                if kind == "gemm":
                    v = layouts[i % len(layouts)] if d == "bwd" else "fwd"
                elif kind == "activation":
                    v = "swiglu" if feats[2] else variant
                elif kind == "norm":
                    v = NORM_VARIANTS[feats[2]]
                samples.append(Sample(kind, d, dt, feats, v, len(samples) - start))
    return samples
