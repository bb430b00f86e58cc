"""Predict every run of a run file and compare with the measured values: the ValidationReport.

:func:`validate_files` loads run files (default: shared/validation/published_runs.csv) and checks the tier
filter; :func:`validate` maps each usable row (:mod:`planner.validation.runs`), predicts it, puts the prediction into
the row's measured metric (:mod:`planner.validation.compare`) and summarises the errors per group
(:mod:`planner.validation.stats`). Rows that cannot be predicted stay in the report with their reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.core.paths import validation_dir
from planner.prediction import predict
from planner.validation.compare import compare, measured_mfu
from planner.validation.runs import RunRow, default_hardware, load_runs, parallelism_kind, row_to_inputs
from planner.validation.stats import GroupSummary, group_summaries

RUN_FILE_NAME = "published_runs.csv"
MOE_RUN_FILE_NAME = "moe_runs.csv"
"""The published mixture-of-experts runs beside it (shared/validation/MOE_README.md)."""
GH200_RUN_FILE_NAME = "gh200_small_blackwell_runs.csv"
"""Quad-GH200 (JUPITER, Alps), small-model and Blackwell runs beside it (GH200_SMALL_BLACKWELL_README.md)."""
TIERS = ("A", "B", "C")


@dataclass
class RowResult:
    """One row of the validation report."""

    id: str
    """Run id."""
    source: str
    """Source prefix of the id."""
    model: str
    """Model name."""
    gpu: str
    """Catalogue GPU key ('' when unmapped)."""
    cluster: str
    """Catalogue node type used ('' = the GPU's default)."""
    n_gpus: int | None
    """GPUs in the run."""
    layout: dict
    """tp, pp, dp, cp, vp, mbs, gbs as used for the prediction (empty when skipped before mapping)."""
    kind: str
    """Parallelism kind, e.g. TP+PP+DP."""
    metric: str
    """Measured metric name."""
    measured: float | None
    """Published value."""
    predicted: float | None = None
    """Predicted value in the same metric (None when skipped)."""
    error: float | None = None
    """Signed relative error (pred - meas) / meas (fraction, None when skipped)."""
    tier: str = ""
    """A/B/C."""
    assumptions: list = field(default_factory=list)
    """Assumptions made to map the row."""
    warnings: list = field(default_factory=list)
    """Prediction warnings."""
    skip_reason: str = ""
    """Why the row was not predicted ('' when predicted)."""
    dtype: str = ""
    """Compute dtype of the plan predicted (bf16, fp8, ...; '' when skipped)."""
    predicted_mfu: float | None = None
    """Predicted model FLOPs utilisation (fraction of the dense bf16 peak; None when skipped)."""
    measured_mfu: float | None = None
    """The measured run's MFU in the same convention (planner.validation.compare.measured_mfu; None when skipped)."""


@dataclass
class ValidationReport:
    """Per-row results and grouped error summaries."""

    rows: list
    """RowResult for every selected row (predicted and skipped)."""
    summaries: list
    """GroupSummary list: groups source, gpu, kind, tier, metric, then overall."""
    excluded_by_tier: int = 0
    """Rows left out because their tier was not selected."""

    @property
    def predicted(self) -> list:
        return [r for r in self.rows if not r.skip_reason]

    @property
    def skipped(self) -> list:
        return [r for r in self.rows if r.skip_reason]

    def overall(self) -> GroupSummary | None:
        return next((s for s in self.summaries if s.group == "overall"), None)

    def to_dict(self) -> dict:
        return {"rows": [asdict(r) for r in self.rows], "summaries": [asdict(s) for s in self.summaries],
                "excluded_by_tier": self.excluded_by_tier}


def validate(rows: list[RunRow], predict_fn: Callable | None = None, tiers: Iterable[str] | None = None,
             hardware_fn: Callable | None = None, progress: Callable[[int, int], None] | None = None
             ) -> ValidationReport:
    """Predict every usable row (of the selected tiers, when ``tiers`` is given) and summarise the errors.

    ``predict_fn(model, plan, hardware)`` defaults to :func:`planner.prediction.predict`;
    ``hardware_fn(gpu_key, gpus_per_node, cluster)`` defaults to the hardware catalogue
    (:func:`planner.validation.runs.default_hardware`). ``progress(done, total)`` is called before each row.
    """
    if tiers is None:  # no filter: every row, including users' runs without a TIER= tag
        selected = list(rows)
    else:
        tiers = tuple(t.upper() for t in tiers)
        selected = [r for r in rows if r.tier in tiers]
    predict_fn = predict_fn or predict
    hw_cache: dict = {}
    results = []
    for i, row in enumerate(selected):
        if progress is not None:
            progress(i, len(selected))
        res = RowResult(id=row.id, source=row.prefix, model=row.model_name, gpu="", cluster="",
                        n_gpus=row.get("n_gpus"),
                        layout={}, kind="", metric=row.measured_metric, measured=row.measured_value,
                        tier=row.tier, skip_reason=row.skip_reason)
        results.append(res)
        if row.skip_reason:
            res.assumptions = list(row.assumptions)
            continue
        model, plan, gpu_key, gpn = row_to_inputs(row)
        hardware_fn = hardware_fn or default_hardware()  # the catalogue is read only when a row is usable
        res.assumptions = list(row.assumptions)
        res.gpu, res.kind, res.cluster = gpu_key, parallelism_kind(plan), row.cluster
        res.layout = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "vp": plan.vpp,
                      "mbs": plan.mbs, "gbs": plan.gbs, **expert_layout(model, plan)}
        try:
            key = (gpu_key, gpn, row.cluster)
            if key not in hw_cache:
                hw_cache[key] = hardware_fn(gpu_key, gpn, row.cluster)
            hardware = hw_cache[key]
            prediction = predict_fn(model, plan, hardware)
            res.predicted, res.error = compare(row, prediction, model, plan, hardware)
        except (PlannerError, NotImplementedError) as exc:
            res.skip_reason = f"prediction failed: {exc}"
            continue
        res.dtype = plan.dtype
        if (mfu := getattr(prediction, "mfu", None)) is not None:
            res.predicted_mfu, res.measured_mfu = mfu, measured_mfu(res.metric, res.predicted, res.measured, mfu)
        res.warnings = list(getattr(prediction, "warnings", []) or [])
        if getattr(prediction, "fits_in_memory", True) is False:
            res.warnings.append(f"predicted not to fit in memory "
                                f"({prediction.memory_gib_per_gpu:.1f} GiB/GPU) although the run was measured")
    done = [r for r in results if not r.skip_reason]
    return ValidationReport(rows=results, summaries=group_summaries(done),
                            excluded_by_tier=len(rows) - len(selected))


def expert_layout(model, plan) -> dict:
    """{"ep", "etp"} of an MoE run's plan (empty for dense models: their layout stays as it was)."""
    return {"ep": plan.ep, "etp": plan.etp} if getattr(model, "is_moe", False) else {}


def default_moe_run_file() -> Path | None:
    """shared/validation/moe_runs.csv, or None when the shared data has none."""
    return _validation_file(MOE_RUN_FILE_NAME)


def default_gh200_run_file() -> Path | None:
    """shared/validation/gh200_small_blackwell_runs.csv, or None when the shared data has none."""
    return _validation_file(GH200_RUN_FILE_NAME)


def _validation_file(name: str) -> Path | None:
    d = validation_dir()
    return d / name if d is not None and (d / name).is_file() else None


def default_run_file() -> Path:
    """shared/validation/published_runs.csv (PlannerError when the shared data is not found)."""
    d = validation_dir()
    if d is None or not (d / RUN_FILE_NAME).is_file():
        raise PlannerError("no run file: pass --runs FILE or set PLANNER_DATA_DIR")
    return d / RUN_FILE_NAME


def validate_files(runs: Sequence[Path] | None, tiers: Sequence[str] | None,
                   predict_fn: Callable | None = None, progress: Callable[[int, int], None] | None = None
                   ) -> tuple[list[Path], ValidationReport]:
    """Load the run files (default: shared/validation/published_runs.csv), check the tier filter and
    predict every run with ``predict_fn`` (default :func:`planner.prediction.predict`; the CLI passes a
    calibrated one for ``--calibration``; ``progress`` as :func:`validate`'s)."""
    files, rows, tiers = load_run_files(runs, tiers)
    return files, validate(rows, predict_fn=predict_fn, tiers=tiers, progress=progress)


def load_run_files(runs: Sequence[Path] | None, tiers: Sequence[str] | None
                   ) -> tuple[list[Path], list[RunRow], list[str] | None]:
    """(files, their rows, upper-cased tiers or None): the run files (default:
    shared/validation/published_runs.csv) and a checked tier filter."""
    tiers = [t.upper() for t in tiers] if tiers else None
    bad = [t for t in tiers or () if t not in TIERS]
    if bad:
        raise PlannerError(f"unknown --tier {bad[0]!r}: use A, B or C.")
    files = list(runs) if runs else [default_run_file()]
    return files, [row for f in files for row in load_runs(f)], tiers
