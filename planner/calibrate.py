"""Calibration: fit a few composition-level constants of one cluster to its measured runs.

A trace-free counterpart of trace-driven tools: the user measures whole iterations of their own
cluster (run files in the published-run schema, :mod:`planner.validation.runs`), and planner fits at most
four constants that act on the *composition* (never on single runs):

* ``compute_scale``  multiplies every compute-operator time (systematic kernel-efficiency bias),
* ``comm_scale``     multiplies every collective time (a slower or faster fabric than the model's),
* ``overlap_efficiency`` in [0, 1]: the fraction of the DP gradient reduction that can hide under
  backward (1 = planner's uncalibrated composition),
* ``iteration_overhead_s``: fixed seconds per iteration (data loading, logging, launch gaps).

The fit minimises the squared log error of predicted vs measured values (each row's own metric; a
throughput or FLOP rate is a constant over iteration time, so its log error equals the time's up to
sign) with ``scipy.optimize.least_squares`` within bounds, reports one-sigma uncertainties from the
Jacobian (s^2 (J^T J)^-1, the Gauss-Newton covariance) and cross-validates over runs
(``sklearn.model_selection`` KFold, or LeaveOneGroupOut by model / parallelism kind) to give
before/after error on held-out runs. Calibrations are JSON files, written atomically, never pickles.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from costmodel.core.kinds import COLLECTIVE_KINDS
from costmodel.estimate import Estimate, estimate
from costmodel.fitting.cpu_hardware import CPU_GPU_KEY
from planner import __version__
from planner.intervals import MOE_TABLE, fit_intervals, lookup, moe_lookup, plan_framework, time_residual
from planner.prediction import Prediction, prediction
from planner.validation.compare import compare
from planner.validation.runs import RunRow, default_hardware, load_runs, parallelism_kind, row_to_inputs

SCHEMA_VERSION = 1
USER_DIR = "<user config>"
"""``out_dir`` of :func:`calibrate_files` that means the user's calibration directory (:func:`calibration_dir`)."""
LEGACY_DIR = Path("calibrations")
"""Where `planner calibrate` wrote before calibrations lived in the user's config directory (relative to the
directory it ran in): a name found only there is reported with the path to pass."""
CV_SCHEMES = ("kfold", "model", "kind", "source")
DEFAULT_NAME = "default"
"""Name of the shipped default calibration (search_spaces/calibration/default.json)."""


@dataclass(frozen=True)
class ConstantSpec:
    """One calibratable constant."""

    default: float
    """Value that leaves the prediction uncalibrated."""
    lower: float
    """Lower bound of the fit."""
    upper: float
    """Upper bound of the fit."""
    unit: str
    """Unit shown in reports ('' = dimensionless)."""
    doc: str
    """What the constant does."""


# Bounds are search ranges, not data: scales from 1/20x to 20x, overlap is a fraction by definition, the
# overhead is non-negative (an hour per iteration as an upper end only keeps the search finite).
CONSTANTS: dict[str, ConstantSpec] = {
    "compute_scale": ConstantSpec(1.0, 0.05, 20.0, "", "multiplies every compute-operator time"),
    "comm_scale": ConstantSpec(1.0, 0.05, 20.0, "", "multiplies every collective (communication) time"),
    "overlap_efficiency": ConstantSpec(1.0, 0.0, 1.0, "",
                                       "fraction of the DP gradient reduction that can hide under backward"),
    "iteration_overhead_s": ConstantSpec(0.0, 0.0, 3600.0, "s", "fixed framework overhead per iteration"),
    "compute_scale_torch": ConstantSpec(1.0, 0.05, 20.0, "",
                                        "multiplies compute-operator times of plans run by a stack outside "
                                        "Megatron-Core / Transformer Engine in PyTorch (framework fsdp or "
                                        "torchtitan), on top of compute_scale"),
    "compute_scale_gh200": ConstantSpec(1.0, 0.05, 20.0, "",
                                        "multiplies compute-operator times of plans on the 96 GB GH200 superchip "
                                        "(GPU gh200), on top of compute_scale: the rate its quad-GH200 systems "
                                        "sustain (CPU and GPU share one module power budget, 680 W on JUPITER's "
                                        "Booster SKU) against the kernel data, taken on other parts or at burst "
                                        "clocks; not on TACC Vista's nodes, whose own measurements sustain the "
                                        "kernel rate (planner.calibrate.NODE_EXEMPT)"),
    "compute_scale_blackwell": ConstantSpec(1.0, 0.05, 20.0, "",
                                            "multiplies compute-operator times of dense plans on Blackwell GPUs "
                                            "(b200, gb200, b300, gb300), on top of compute_scale: the rate they "
                                            "sustain in training against their kernel data, CUDA-graph bursts "
                                            "whose large GEMMs already lose rate with kernel duration (MoE plans "
                                            "take compute_scale_moe instead)"),
    "compute_scale_moe": ConstantSpec(1.0, 0.05, 20.0, "",
                                      "multiplies compute-operator times of mixture-of-experts plans, on top of "
                                      "compute_scale: what MoE training steps take beyond their operators (router "
                                      "and token permutation, expert imbalance, dispatcher host work)"),
}
TORCH_NATIVE = ("fsdp", "torchtitan", "torchtitan-eager")
"""Frameworks whose plans compute_scale_torch applies to (costmodel.core.specs.framework): the PyTorch-native stacks
(eager dispatch and autograd per op, FSDP hooks, PyTorch's own kernels). llm.c (framework llmc: C/CUDA, no Python, its
own fused kernels) takes compute_scale alone: with it among these stacks, the pooled leave-one-source-out MAPE of the
three open run files was 9.62 %, without it 9.40 % (SMALL-LLMC 13.2 -> 7.9 %, TORCHTITAN 13.5 -> 12.6 %, every other
source within 1.4 points; scripts/fit_default_calibration.py at the commit that moved it)."""
GPU_SCOPED: dict[str, tuple[str, ...]] = {
    # the catalogue's 96 GB GH200, whose power figure is the whole superchip's (search_spaces/hardware/gpus.toml:
    # 680 W, JSC JUPITER configuration page); the 900 W HBM3e part (gh200-144gb) has no measured runs here
    "compute_scale_gh200": ("gh200",),
    "compute_scale_blackwell": ("b200", "gb200", "b300", "gb300"),
}
"""GPU-scoped constants -> the catalogue GPU keys whose plans they scale (on top of compute_scale)."""
DENSE_ONLY = frozenset({"compute_scale_blackwell"})
"""GPU-scoped constants that leave mixture-of-experts plans alone. The dense Blackwell runs (NeMo B200 / GB200 in
gh200_small_blackwell_runs.csv) sustain less than the kernel data; the MoE runs on the same GPUs do not, beyond what
compute_scale_moe (fitted on H100 and Blackwell MoE runs together) gives them: applied to MoE plans as well,
moe_runs.csv's own leave-one-source-out error went from 12.1 to 16.1 % (scripts/fit_default_calibration.py's
docstring has the measurement)."""


NODE_EXEMPT: dict[str, tuple[str, ...]] = {
    # TACC Vista's one-GH200 nodes sustain the kernel rate: the paper's own operator samples there
    # (shared/data/estimate-train-time/Vista/operator, eager fp16 QKV / MLP GEMMs of >= 4,096 tokens and hidden
    # >= 4,096: median 796-818 TFLOP/s forward, 828-883 backward, against mamf.csv's 829 for the 900 W GH200 and 795
    # for H100 SXM; the same files on Perlmutter give A100 its MAMF, 249-265 of 271) are what the paper composes
    # into its 9.38 % mean end-to-end error on Vista (Zhang et al., arXiv 2509.22832, abstract). The measured
    # JUPITER and Alps runs sustain 1/1.41 of that.
    "compute_scale_gh200": ("vista",),
}
"""GPU-scoped constants -> node types (catalogue keys) of their GPUs that they leave alone, because measurements
on that system show it sustaining the rate the constant corrects for."""


def gpu_scopes(gpu: str, moe: bool = False, cluster: str = "") -> list[str]:
    """Names of the GPU-scoped constants that act on a plan on ``gpu`` (catalogue key) in node type ``cluster``
    (catalogue key; '' = any) of a mixture-of-experts model when ``moe``."""
    return [name for name, gpus in GPU_SCOPED.items() if gpu in gpus and not (moe and name in DENSE_ONLY)
            and cluster not in NODE_EXEMPT.get(name, ())]


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _planner_version() -> str:
    return __version__


@dataclass
class Calibration:
    """A named set of fitted composition constants and the evidence behind them."""

    name: str
    """Name used for the file (``calibrations/<name>.json``) and ``--calibration NAME``."""
    constants: dict
    """Constant name -> value; constants not listed keep their default (see CONSTANTS)."""
    uncertainty: dict = field(default_factory=dict)
    """Constant name -> one-sigma standard error from the Jacobian (None = not identifiable)."""
    fitted_on: list = field(default_factory=list)
    """[{file, sha256, run_ids}] of the run files the constants were fitted on."""
    cv: dict = field(default_factory=dict)
    """Cross-validation: scheme, folds, held-out MAPE/median/bias before and after, per-run errors."""
    in_sample: dict = field(default_factory=dict)
    """MAPE / bias before and after on all fitted runs (optimistic; cv is the honest figure)."""
    cost_model: str = ""
    """Name of the operator cost model the constants were fitted on top of."""
    planner_version: str = ""
    """planner version that fitted them."""
    created_utc: str = ""
    """ISO 8601 time of the fit (UTC)."""
    warnings: list = field(default_factory=list)
    """Notes from the fit (unidentifiable constants, constants at a bound, skipped runs)."""
    intervals: dict = field(default_factory=dict)
    """80 % interval table from leave-one-source-out residuals (planner.intervals.fit_intervals); {} = none."""
    provenance: dict = field(default_factory=dict)
    """How the file was made (command, runs file, rows and sources each constant rests on); free-form."""
    schema_version: int = SCHEMA_VERSION
    """Version of this file format."""

    def value(self, name: str) -> float:
        return float(self.constants.get(name, CONSTANTS[name].default))

    @property
    def compute_scale(self) -> float:
        return self.value("compute_scale")

    @property
    def comm_scale(self) -> float:
        return self.value("comm_scale")

    @property
    def overlap_efficiency(self) -> float:
        return self.value("overlap_efficiency")

    @property
    def iteration_overhead_s(self) -> float:
        return self.value("iteration_overhead_s")

    def scale_times(self, times: dict, framework: str = "megatron", gpu: str = "", moe: bool = False,
                    cluster: str = "") -> dict:
        """Operator times keyed by ``Op.key()`` (kind first) of a plan run by ``framework`` on ``gpu`` (catalogue
        key) in node type ``cluster``, of a mixture-of-experts model when ``moe`` -> scaled copy (the same dict when
        every scale is 1)."""
        cs, ms = self.compute_scale, self.comm_scale
        if framework in TORCH_NATIVE:
            cs *= self.value("compute_scale_torch")
        if moe:
            cs *= self.value("compute_scale_moe")
        for name in gpu_scopes(gpu, moe, cluster):
            cs *= self.value(name)
        if cs == 1.0 and ms == 1.0:
            return times
        return {k: v * (ms if k[0] in COLLECTIVE_KINDS else cs) for k, v in times.items()}

    def gpu_scale_note(self, gpu: str, moe: bool = False, cluster: str = "") -> str | None:
        """What a GPU-scoped constant of this calibration does to plans on ``gpu`` (catalogue key) in node type
        ``cluster``, of a mixture-of-experts model when ``moe``, with the runs it rests on; None when none applies or
        it is 1."""
        for name in gpu_scopes(gpu, moe, cluster):
            value = self.value(name)
            if value != 1.0:
                support = (self.provenance.get("constant_support") or {}).get(name) or {}
                rests = (f", fitted on {support['rows']} measured runs of {', '.join(support['sources'])}"
                         if support.get("rows") else "")
                return (f"calibration {self.name!r} runs compute on {gpu} {value:.3g}x the time of the kernel data "
                        f"({name}{rests}; {CONSTANTS[name].doc})")
        return None

    def exempted_constant(self, gpu: str, moe: bool = False, cluster: str = "") -> tuple[str, tuple[str, ...]] | None:
        """(name, exempt node types) of the GPU-scoped constant of this calibration that acts on plans on ``gpu`` in
        node type ``cluster`` (of a mixture-of-experts model when ``moe``) with a value other than 1 and that other
        node types of that GPU are measured not to need (NODE_EXEMPT); None when there is none."""
        return next(((name, NODE_EXEMPT[name]) for name in gpu_scopes(gpu, moe, cluster)
                     if self.value(name) != 1.0 and NODE_EXEMPT.get(name)), None)

    def without(self, name: str) -> "Calibration":
        """A copy of this calibration with constant ``name`` at its default (no effect); the same name."""
        return replace(self, constants={k: v for k, v in self.constants.items() if k != name})

    def fitted_run_ids(self) -> set[str]:
        """Ids of the runs the constants were fitted on (empty when the file records none)."""
        return {rid for entry in self.fitted_on for rid in entry.get("run_ids", ())}

    def applies_to(self, hardware) -> bool:
        """False for the shipped default calibration on the CPU device: it was fitted on published GPU runs
        (a calibration a user fits on CPU runs applies there)."""
        return not (self.name == DEFAULT_NAME and getattr(hardware.gpu, "name", "") == CPU_GPU_KEY)

    def scaler(self, plan, hardware=None, model=None) -> Callable[[dict], dict]:
        """:meth:`scale_times` for ``plan``'s framework on ``hardware``'s GPU, for ``model`` (MoE or not)."""
        framework = getattr(plan, "framework", "megatron")
        gpu = getattr(getattr(hardware, "gpu", None), "name", "")
        cluster = getattr(getattr(hardware, "cluster", None), "name", "")
        moe = bool(getattr(model, "is_moe", False))
        return lambda times: self.scale_times(times, framework, gpu, moe, cluster)

    def warnings_for(self, cost_model_name: str) -> list[str]:
        """A warning when applied on top of a different cost model than it was fitted on."""
        if self.cost_model and cost_model_name != self.cost_model:
            return [f"calibration {self.name!r} was fitted on cost model {self.cost_model!r}, "
                    f"applied to {cost_model_name!r}"]
        return []

    def interval_group(self, gpu: str, framework: str, moe: bool = False) -> tuple[str, dict] | None:
        """(group key, {n, q_low, q_high}) of the 80 % interval for a plan on ``gpu`` with ``framework`` (``moe``:
        a mixture-of-experts plan, from the calibration's MoE table); None when the calibration carries no such
        table (planner.intervals.lookup, moe_lookup)."""
        return moe_lookup(self.intervals, gpu, framework) if moe else lookup(self.intervals, gpu, framework)

    def to_dict(self) -> dict:
        return asdict(self)


def identity(constants: dict | None = None, name: str = "identity") -> Calibration:
    """A calibration with the given constants (defaults elsewhere); used for synthetic runs and tests."""
    return Calibration(name=name, constants=dict(constants or {}))


# ------------------------------------------------------------------------------------------ files
def _check(data: object, where: str) -> Calibration:
    """Calibration from parsed JSON; PlannerError naming the first problem."""
    fix = "re-run planner calibrate or fix the file"
    if not isinstance(data, dict):
        raise PlannerError(f"calibration file {where} does not hold a JSON object; {fix}.")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PlannerError(f"calibration file {where} has schema_version {data.get('schema_version')!r}, "
                           f"this planner reads {SCHEMA_VERSION}; {fix}.")
    if not isinstance(data.get("name"), str) or not isinstance(data.get("constants"), dict):
        raise PlannerError(f"calibration file {where} lacks a name or a constants object; {fix}.")
    for key, value in data["constants"].items():
        spec = CONSTANTS.get(key)
        if spec is None:
            raise PlannerError(f"calibration file {where} has unknown constant {key!r} "
                               f"(known: {', '.join(CONSTANTS)}); {fix}.")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (isinstance(value, float) and not math.isfinite(value)) \
                or not spec.lower <= value <= spec.upper:
            raise PlannerError(f"calibration file {where}: {key} = {value!r} is not a number in "
                               f"[{spec.lower:g}, {spec.upper:g}]; {fix}.")
    known = {f for f in Calibration.__dataclass_fields__}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlannerError(f"calibration file {where} has unknown field {unknown[0]!r}; {fix}.")
    return Calibration(**data)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file; PlannerError (one line) when missing or corrupted."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerError(f"calibration file {path} not found; pass a file written by planner calibrate.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"cannot read calibration file {path} ({type(exc).__name__}); "
                           "pass a file written by planner calibrate.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlannerError(f"calibration file {path} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                           "re-run planner calibrate or fix the file.") from None
    except RecursionError:
        raise PlannerError(f"calibration file {path} is nested too deeply to be a calibration; "
                           "re-run planner calibrate or fix the file.") from None
    return _check(data, str(path))


def calibration_dir() -> Path:
    """The user's calibration directory: ``$XDG_CONFIG_HOME/planner/calibrations``, ``~/.config/planner/
    calibrations`` when XDG_CONFIG_HOME is unset or not absolute (XDG Base Directory Specification 0.8:
    "If $XDG_CONFIG_HOME is either not set or empty, a default equal to $HOME/.config should be used"; relative
    paths "should be ignored")."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "planner" / "calibrations"


def resolve_calibration(ref: str | Path, directory: str | Path | None = None) -> Calibration:
    """``ref`` is a path to a calibration file, or a NAME saved as ``<directory>/<NAME>.json`` (default: the user's
    calibration directory, :func:`calibration_dir`), so a name works from any working directory."""
    ref_s = str(ref)
    path = Path(ref_s)
    if path.is_file() or ref_s.endswith(".json") or os.sep in ref_s or "/" in ref_s:
        return load_calibration(path)
    candidate = Path(directory if directory is not None else calibration_dir()) / f"{ref_s}.json"
    if not candidate.is_file():
        legacy = LEGACY_DIR / f"{ref_s}.json"
        hint = (f"; {legacy} exists (written by an older planner): pass --calibration {legacy} or move it to "
                f"{candidate.parent}" if directory is None and legacy.is_file() else
                "; pass a calibration file path or a name saved by planner calibrate")
        raise PlannerError(f"calibration {ref_s!r} not found as a file or as {candidate}{hint}.")
    return load_calibration(candidate)


def default_calibration_path() -> Path:
    """The shipped default calibration (fitted on the open run files by
    scripts/fit_default_calibration.py; provenance inside the file)."""
    import search_spaces  # deferred: only to locate the package data folder

    return Path(search_spaces.__file__).resolve().parent / "calibration" / f"{DEFAULT_NAME}.json"


def calibration_option(ref: str | Path | None, directory: str | Path | None = None) -> Calibration | None:
    """``--calibration``: None (not given) = the shipped default calibration when it exists, 'none' = no
    calibration, else a path or NAME as :func:`resolve_calibration`."""
    if ref is None:
        path = default_calibration_path()
        return load_calibration(path) if path.is_file() else None
    if str(ref).strip().lower() == "none":
        return None
    own = Path(directory if directory is not None else calibration_dir()) / f"{DEFAULT_NAME}.json"
    if str(ref) == DEFAULT_NAME and not own.is_file():
        return load_calibration(default_calibration_path())
    return resolve_calibration(ref, directory)


def save_calibration(cal: Calibration, directory: str | Path | None = None) -> Path:
    """Write ``<directory>/<name>.json`` atomically (temporary file + rename; default directory: the user's,
    :func:`calibration_dir`); returns the path."""
    if not NAME_RE.match(cal.name):
        raise PlannerError(f"calibration name {cal.name!r} must be letters, digits, '_', '.' or '-' "
                           "(starting with a letter or digit); choose another --name.")
    directory = Path(directory if directory is not None else calibration_dir())
    try:
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(cal.to_dict(), indent=2, allow_nan=False) + "\n"
        target = atomic_write_text(directory / f"{cal.name}.json", text)
    except OSError as exc:
        raise PlannerError(f"cannot write calibration to {directory} ({exc.strerror}); "
                           "pass a writable --out DIR.") from None
    return target


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ fitting
@dataclass
class PreparedRun:
    """A measured run with its uncalibrated estimate (the plan costed once; calibrations recompose it)."""

    row: RunRow
    """The run."""
    estimate: Estimate
    """The run's plan costed without calibration (:func:`costmodel.estimate.estimate`)."""

    @property
    def model(self):
        """ModelSpec."""
        return self.estimate.model

    @property
    def plan(self):
        """ParallelPlan, with the layer split the estimate chose where PP x VPP does not divide the layers."""
        return self.estimate.plan

    @property
    def hardware(self):
        """Hardware it ran on."""
        return self.estimate.hardware

    def predict(self, cal: Calibration | None) -> Prediction:
        """The run predicted with ``cal`` (None: uncalibrated) from the same costing; its warnings are the
        costing's and the composition's (the run's inputs are given, not chosen)."""
        est = self.estimate.recalibrated(cal)
        own = est.composition.warnings if est.composition is not None else ()
        return prediction(est, est.cost_warnings + own)

    def predicted_value(self, cal: Calibration | None) -> float:
        """Prediction in the row's measured metric (planner.validation.compare.compare)."""
        return compare(self.row, self.predict(cal), self.model, self.plan, self.hardware)[0]


def prepare_runs(rows: Iterable[RunRow], cost_model=None, hardware_fn: Callable | None = None,
                 progress: Callable[[int, int], None] | None = None
                 ) -> tuple[list[PreparedRun], list[tuple[str, str]]]:
    """(prepared runs, [(run id, reason)] of rows that cannot be predicted); ``progress(done, total)`` is called
    before each row."""
    hardware_fn = hardware_fn or default_hardware()
    prepared, skipped, hw_cache = [], [], {}
    rows = list(rows)
    for i, row in enumerate(rows):
        if progress is not None:
            progress(i, len(rows))
        if row.skip_reason:
            skipped.append((row.id, row.skip_reason))
            continue
        try:
            model, plan, gpu_key, gpn = row_to_inputs(row)
            key = (gpu_key, gpn, row.cluster)
            if key not in hw_cache:
                hw_cache[key] = hardware_fn(gpu_key, gpn, row.cluster)
            run = PreparedRun(row, estimate(model, plan, hw_cache[key], cost_model=cost_model))
            run.predicted_value(None)
        except (PlannerError, NotImplementedError, ValueError) as exc:
            skipped.append((row.id, f"prediction failed: {exc}"))
            continue
        prepared.append(run)
    return prepared, skipped


def parse_constants(text: str | Sequence[str] | None) -> list[str]:
    """'compute_scale,comm_scale' -> ['compute_scale', 'comm_scale']; None -> all constants."""
    if text is None:
        return list(CONSTANTS)
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    bad = [n for n in names if n not in CONSTANTS]
    if bad or not names:
        raise PlannerError(f"unknown constant {bad[0] if bad else text!r}: choose from {', '.join(CONSTANTS)}.")
    return list(dict.fromkeys(names))


def _least_squares():
    try:
        from scipy.optimize import least_squares
    except ImportError as exc:
        raise PlannerError(f"planner calibrate needs scipy ({exc}); install it: pip install scikit-learn.") from None
    return least_squares


@dataclass
class FitResult:
    """Constants fitted on one set of runs."""

    constants: dict
    """Fitted values (all names of the fit)."""
    uncertainty: dict
    """One-sigma standard errors (None where not identifiable)."""
    warnings: list
    """Unidentifiable constants, constants at a bound."""
    rms_log_error: float
    """Root mean squared log error at the solution."""
    unidentified: tuple = ()
    """Constants these runs cannot move, or move only together with others (kept at the prior or their default),
    e.g. compute_scale_torch without torch runs."""


def _residuals(runs: Sequence[PreparedRun], names: Sequence[str], x: np.ndarray) -> np.ndarray:
    cal = identity(dict(zip(names, (float(v) for v in x))), name="fit")
    return np.array([math.log(r.predicted_value(cal) / r.row.measured_value) for r in runs])


def _tied_constants(jac: np.ndarray, idx: np.ndarray, rel_tol: float = 1e-6) -> list[int]:
    """Of the columns ``idx`` of the fit's Jacobian, those to hold fixed so that the others are separately
    identifiable, first in the order of the names (compute_scale first in the default set): each column whose removal
    leaves the rank of the still-free columns unchanged, until as many are free as the rank. Empty when the
    columns are independent (singular values above ``rel_tol`` of the largest)."""
    def rank(cols: list[int]) -> int:
        if not cols:
            return 0
        sv = np.linalg.svd(jac[:, cols], compute_uv=False)
        return int((sv > rel_tol * sv[0]).sum()) if sv.size and sv[0] > 0 else 0

    free = [int(i) for i in idx]
    full = rank(free)
    tied: list[int] = []
    for i in list(free):
        if len(free) == full:
            break
        trial = [j for j in free if j != i]
        if rank(trial) == full:
            free, tied = trial, tied + [i]
    return tied


def fit_constants(runs: Sequence[PreparedRun], names: Sequence[str], prior: dict | None = None) -> FitResult:
    """Least-squares fit of ``names`` to the log errors of ``runs`` (bounded, trust-region reflective). A constant
    these runs cannot move keeps its value in ``prior`` (a calibration fitted on other runs), else its default; so
    do constants these runs move only together with others (:func:`_tied_constants`), so that the rest are fitted
    relative to them."""
    least_squares = _least_squares()
    names = list(names)
    lb = np.array([CONSTANTS[n].lower for n in names])
    ub = np.array([CONSTANTS[n].upper for n in names])
    x_default = np.array([CONSTANTS[n].default for n in names])
    # two starts: the uncalibrated point, and the same with fractions at mid-range (overlap is piecewise)
    starts = [x_default, np.where(ub <= 1.0, 0.5 * (lb + ub), x_default)]
    best = None
    for x0 in starts:
        res = least_squares(lambda x: _residuals(runs, names, x), x0, bounds=(lb, ub), method="trf",
                            x_scale="jac", diff_step=1e-4)
        if best is None or res.cost < best.cost:
            best = res
    x, jac, r = best.x.copy(), np.asarray(best.jac), best.fun
    n, k = len(r), len(names)
    warnings, uncertainty = [], {}
    col = np.linalg.norm(jac, axis=0)
    ident = col > 1e-9 * max(1.0, float(col.max()) if col.size else 1.0)
    for i, name in enumerate(names):
        if not ident[i]:
            x[i] = float((prior or {}).get(name, x_default[i]))
            warnings.append(f"{name} has no effect on these runs at the fitted point: kept at {x[i]:g}")
    tied = _tied_constants(jac, np.flatnonzero(ident))
    if tied:
        # these runs move the tied constants only together (e.g. compute_scale and the GPU- and stack-scoped scales
        # when every run has one of those scopes): hold them at the prior and fit the rest, so the fit does not land
        # on an arbitrary point of a ridge of equal error
        for i in tied:
            ident[i] = False
            x[i] = float((prior or {}).get(names[i], x_default[i]))
            warnings.append(f"{names[i]} moves these runs only together with other constants: kept at {x[i]:g}")
        free = np.flatnonzero(ident)

        def sub(v: np.ndarray) -> np.ndarray:
            full = x.copy()
            full[free] = v
            return _residuals(runs, names, full)

        res = least_squares(sub, x[free], bounds=(lb[free], ub[free]), method="trf", x_scale="jac", diff_step=1e-4)
        x[free], r = res.x, res.fun
        jac = np.zeros_like(jac)
        jac[:, free] = np.asarray(res.jac)
    idx = np.flatnonzero(ident)
    std = np.full(k, np.nan)
    if idx.size and n > idx.size:
        s2 = float(r @ r) / (n - idx.size)
        jj = jac[:, idx].T @ jac[:, idx]
        try:
            cov = np.linalg.inv(jj) * s2
            std[idx] = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        except np.linalg.LinAlgError:
            warnings.append("the constants are not separately identifiable from these runs (singular J^T J)")
    for i, name in enumerate(names):
        uncertainty[name] = float(std[i]) if math.isfinite(std[i]) else None
        at = [b for b in (lb[i], ub[i]) if math.isclose(x[i], b, rel_tol=1e-6, abs_tol=1e-9)]
        if ident[i] and at and at[0] != x_default[i]:
            warnings.append(f"{name} = {x[i]:g} is at its search bound [{lb[i]:g}, {ub[i]:g}]")
    return FitResult(constants={n_: float(v) for n_, v in zip(names, x)}, uncertainty=uncertainty,
                     warnings=warnings, rms_log_error=float(math.sqrt(float(r @ r) / max(n, 1))),
                     unidentified=tuple(name for i, name in enumerate(names) if not ident[i]))


def error_stats(errors: Sequence[float]) -> dict:
    """MAPE, median |error|, p90 |error| and mean signed error in percent (as planner validate)."""
    e = np.asarray(errors, dtype=float) * 100.0
    if e.size == 0:
        return {"n": 0, "mape_pct": None, "median_abs_pct": None, "p90_abs_pct": None, "bias_pct": None}
    a = np.abs(e)
    return {"n": int(e.size), "mape_pct": float(a.mean()), "median_abs_pct": float(np.median(a)),
            "p90_abs_pct": float(np.percentile(a, 90)), "bias_pct": float(e.mean())}


def _rel_error(run: PreparedRun, cal: Calibration | None) -> float:
    return run.predicted_value(cal) / run.row.measured_value - 1.0


def cross_validate(runs: Sequence[PreparedRun], names: Sequence[str], scheme: str = "kfold", folds: int = 5,
                   seed: int = 0, prior: dict | Callable[[list], dict | None] | None = None) -> dict:
    """Held-out error before/after: fit on the training runs of each fold, predict the held-out ones; a constant a
    fold's training runs cannot move keeps its ``prior`` value (:func:`fit_constants`; ``prior`` may be a function
    of the fold's held-out groups, so that it never rests on them)."""
    from sklearn.model_selection import KFold, LeaveOneGroupOut  # deferred: scikit-learn (~0.5 s) only for CV

    if scheme not in CV_SCHEMES:
        raise PlannerError(f"unknown --cv {scheme!r}: use one of {', '.join(CV_SCHEMES)}.")
    n = len(runs)
    idx = np.arange(n)
    if scheme == "kfold":
        splits = list(KFold(n_splits=max(2, min(folds, n)), shuffle=True, random_state=seed).split(idx))
    else:
        groups = [cv_group(r, scheme) for r in runs]
        if len(set(groups)) < 2:
            what = {"model": "models", "kind": "parallelism kinds", "source": "sources"}[scheme]
            raise PlannerError(f"--cv {scheme} needs runs of at least two different {what}; use --cv kfold.")
        splits = list(LeaveOneGroupOut().split(idx, groups=groups))
    per_run, skipped_folds, fold_constants = [], 0, []
    for fold, (train, test) in enumerate(splits):
        if len(train) < len(names):
            skipped_folds += 1
            continue
        held_out = sorted({cv_group(runs[i], scheme) for i in test}) if scheme != "kfold" else []
        fit = fit_constants([runs[i] for i in train], names, prior(held_out) if callable(prior) else prior)
        cal = identity(fit.constants, name=f"fold-{fold}")
        fold_constants.append({"fold": fold, "held_out": held_out, "constants": fit.constants,
                               "unidentified": list(fit.unidentified)})
        for i in test:
            run = runs[i]
            pred = run.predicted_value(cal)
            per_run.append({"id": run.row.id, "fold": fold, "source": run.row.prefix, "gpu": run.hardware.gpu.name,
                            "framework": plan_framework(run.plan), "metric": run.row.measured_metric,
                            "predicted": pred, "before": _rel_error(run, None),
                            "after": pred / run.row.measured_value - 1.0,
                            "residual": time_residual(run.row.measured_metric, pred, run.row.measured_value)})
    return {"scheme": scheme, "folds": len(splits), "folds_skipped": skipped_folds,
            "held_out_before": error_stats([p["before"] for p in per_run]),
            "held_out_after": error_stats([p["after"] for p in per_run]), "fold_constants": fold_constants,
            "per_run": per_run}


def interval_records(runs: Sequence[PreparedRun], cvres: dict, full: dict) -> list[dict]:
    """The held-out residual records the shipped interval table is fitted on. A constant a fold could not
    identify (its held-out source was the only one it acts on, e.g. compute_scale_torch with TORCHTITAN held
    out) takes the full fit's value there, so the residuals describe the predictions the calibration makes for
    such plans (the strict held-out coverage in validate --cv source uses the fold's own constants)."""
    by_id = {r.row.id: r for r in runs}
    fixes = {f["fold"]: {k: full[k] for k in f.get("unidentified", []) if k in full} for f in cvres["fold_constants"]}
    consts = {f["fold"]: f["constants"] for f in cvres["fold_constants"]}
    out = []
    for rec in cvres["per_run"]:
        fix = fixes.get(rec["fold"])
        if fix:
            run = by_id[rec["id"]]
            pred = run.predicted_value(identity({**consts[rec["fold"]], **fix}, name="interval"))
            rec = {**rec, "residual": time_residual(run.row.measured_metric, pred, run.row.measured_value)}
        out.append(rec)
    return out


def interval_tables(runs: Sequence[PreparedRun], records: Sequence[dict]) -> dict:
    """The 80 % interval tables from held-out residual ``records`` of ``runs`` (:func:`interval_records`): the dense
    runs' residuals make the table, the mixture-of-experts runs' their own (planner.intervals.MOE_TABLE, when there
    are any), so an MoE plan's band never comes from dense runs, nor a dense plan's from MoE runs."""
    moe_ids = {r.row.id for r in runs if r.model.is_moe}
    table = fit_intervals([rec for rec in records if rec["id"] not in moe_ids])
    moe = [rec for rec in records if rec["id"] in moe_ids]
    return {**table, MOE_TABLE: fit_intervals(moe)} if moe else table


def cv_group(run: PreparedRun, scheme: str) -> str:
    """The group of a run under a leave-one-group-out scheme: its model, parallelism kind or source (the run
    id's prefix, as planner validate groups sources)."""
    if scheme == "model":
        return run.model.name
    if scheme == "kind":
        return parallelism_kind(run.plan)
    return run.row.prefix


def fit_calibration(runs: Sequence[PreparedRun], name: str, constants: Sequence[str] | None = None, *,
                    cv: str = "kfold", folds: int = 5, seed: int = 0, fitted_on: list | None = None,
                    skipped: Sequence[tuple[str, str]] = ()) -> Calibration:
    """Fit ``constants`` (default all) on ``runs``, cross-validate, and return the named Calibration."""
    names = parse_constants(constants)
    if not NAME_RE.match(name):
        raise PlannerError(f"calibration name {name!r} must be letters, digits, '_', '.' or '-' "
                           "(starting with a letter or digit); choose another --name.")
    if len(runs) < len(names) + 2:
        why = (f" ({len(skipped)} left out, e.g. {skipped[0][0]}: {skipped[0][1].rstrip('.')})"
               if skipped else "")
        raise PlannerError(f"fitting {len(names)} constants needs at least {len(names) + 2} predictable measured "
                           f"runs, got {len(runs)}{why}; add runs or fit fewer constants with --constants.")
    fit = fit_constants(runs, names)
    cal = identity(fit.constants, name=name)
    cvres = cross_validate(runs, names, cv, folds, seed)
    warnings = list(fit.warnings)
    if skipped:
        warnings.append(f"{len(skipped)} runs could not be predicted and were left out: "
                        + "; ".join(f"{i} ({why})" for i, why in list(skipped)[:5])
                        + (" ..." if len(skipped) > 5 else ""))
    cal.uncertainty = fit.uncertainty
    cal.fitted_on = list(fitted_on or [{"file": "", "sha256": "", "run_ids": [r.row.id for r in runs]}])
    cal.cv = cvres
    cal.in_sample = {"before": error_stats([_rel_error(r, None) for r in runs]),
                     "after": error_stats([_rel_error(r, cal) for r in runs]),
                     "rms_log_error": fit.rms_log_error}
    cal.cost_model = runs[0].estimate.cost_model
    cal.planner_version = _planner_version()
    cal.created_utc = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    cal.warnings = warnings
    if cv == "source":  # held-out residuals of sources the fold never saw: the 80 % interval table
        cal.intervals = interval_tables(runs, interval_records(runs, cvres, fit.constants))
    return cal


def calibrate_files(paths: Sequence[str | Path], name: str, constants: Sequence[str] | str | None = None, *,
                    out_dir: str | Path | None = USER_DIR, cv: str = "kfold", folds: int = 5, seed: int = 0,
                    tiers: Sequence[str] | None = None, cost_model=None, hardware_fn: Callable | None = None
                    ) -> tuple[Calibration, Path | None]:
    """Load run files, fit and cross-validate, save ``<out_dir>/<name>.json`` (``USER_DIR``: the user's
    calibration directory, :func:`calibration_dir`; None: not saved)."""
    if not paths:
        raise PlannerError("no run files: pass --runs FILE (repeatable) with measured runs.")
    names = parse_constants(constants)
    wanted = {t.upper() for t in tiers} if tiers else None
    per_file = [(p, [r for r in load_runs(p) if wanted is None or r.tier in wanted]) for p in paths]
    runs, skipped = prepare_runs([r for _, rows in per_file for r in rows], cost_model, hardware_fn)
    used = {id(r.row) for r in runs}
    fitted_on = [{"file": str(p), "sha256": file_sha256(p), "run_ids": [r.id for r in rows if id(r) in used]}
                 for p, rows in per_file]
    cal = fit_calibration(runs, name, names, cv=cv, folds=folds, seed=seed, fitted_on=fitted_on, skipped=skipped)
    path = None if out_dir is None else save_calibration(cal, None if out_dir == USER_DIR else out_dir)
    return cal, path
