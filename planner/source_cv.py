"""``planner validate --cv source``: every source predicted by constants fitted on the other sources only.

The published runs are grouped by source (the run id's prefix, as the report's ``source`` group). For each
source, :func:`planner.calibrate.cross_validate` (scikit-learn ``LeaveOneGroupOut``) fits the calibration
constants (:data:`planner.calibrate.CONSTANTS`) on the runs of all other sources and predicts the held-out
source with them; the report's summaries are computed from these held-out predictions. Each held-out run's
80 % interval comes from the held-out residuals of the *other* sources (:mod:`planner.intervals`), so a
source's coverage never uses its own errors. In-sample figures (constants fitted on every run, the way the
shipped default calibration is) and uncalibrated figures are reported beside, labelled so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from costmodel.core.errors import PlannerError
from planner.calibrate import (
    PreparedRun,
    calibration_option,
    cross_validate,
    error_stats,
    fit_constants,
    identity,
    parse_constants,
    prepare_runs,
)
from planner.intervals import covers, held_out_coverage
from planner.validation.compare import measured_mfu
from planner.validation.report import RowResult, ValidationReport, expert_layout
from planner.validation.runs import RunRow, parallelism_kind
from planner.validation.stats import GroupSummary, group_summaries


@dataclass
class CVRowResult(RowResult):
    """A row predicted by the calibration of the fold that held its source out."""

    uncalibrated_error: float | None = None
    """Signed relative error without any calibration."""
    interval_low: float | None = None
    """Lower end of the 80 % interval in the row's metric (from the other sources' residuals)."""
    interval_high: float | None = None
    """Upper end of the 80 % interval in the row's metric."""
    interval_group: str = ""
    """Regime group the interval was taken from (planner.intervals), e.g. 'gpu_family=hopper'."""
    interval_n: int = 0
    """Held-out residuals of other sources in that group."""
    covered: bool | None = None
    """Measured value inside the interval (None: no interval)."""


@dataclass
class CoveredSummary(GroupSummary):
    """A GroupSummary with the measured coverage of the 80 % interval."""

    interval_coverage: float | None = None
    """Fraction of the group's runs whose measured value lies inside their 80 % interval."""


@dataclass
class CVReport(ValidationReport):
    """ValidationReport of held-out predictions, with in-sample and uncalibrated figures beside."""

    cv: str = "source"
    """Cross-validation scheme of the headline figures."""
    constants: list = field(default_factory=list)
    """Names of the fitted constants."""
    folds: list = field(default_factory=list)
    """[{held_out, constants}] per fold."""
    in_sample: dict = field(default_factory=dict)
    """Error statistics with constants fitted on all runs (optimistic)."""
    uncalibrated: dict = field(default_factory=dict)
    """Error statistics without calibration."""

    def to_dict(self) -> dict:
        return {"cv": self.cv, **super().to_dict(), "constants": self.constants, "folds": self.folds,
                "in_sample": self.in_sample, "uncalibrated": self.uncalibrated}


def _band(metric: str, predicted: float, group: dict) -> tuple[float, float]:
    """80 % interval in the row's metric: a time scales with exp(-residual), a rate with exp(+residual)."""
    if metric == "iteration_time_s":
        return predicted * math.exp(-group["q_high"]), predicted * math.exp(-group["q_low"])
    return predicted * math.exp(group["q_low"]), predicted * math.exp(group["q_high"])


def _row_result(run: PreparedRun, rec: dict, cal) -> CVRowResult:
    row, plan = run.row, run.plan
    pred = run.predict(cal)
    res = CVRowResult(id=row.id, source=row.prefix, model=row.model_name, gpu=run.hardware.gpu.name,
                      cluster=row.cluster, n_gpus=row.get("n_gpus"),
                      layout={"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "vp": plan.vpp,
                              "mbs": plan.mbs, "gbs": plan.gbs,
                              **expert_layout(run.model, plan)},
                      kind=parallelism_kind(plan), metric=row.measured_metric, measured=row.measured_value,
                      predicted=rec["predicted"], error=rec["after"], tier=row.tier,
                      assumptions=list(row.assumptions), warnings=list(pred.warnings),
                      uncalibrated_error=rec["before"], dtype=plan.dtype, predicted_mfu=pred.mfu,
                      measured_mfu=measured_mfu(row.measured_metric, rec["predicted"], row.measured_value,
                                                pred.mfu))
    if pred.fits_in_memory is False:
        res.warnings.append(f"predicted not to fit in memory ({pred.memory_gib_per_gpu:.1f} GiB/GPU) "
                            "although the run was measured")
    return res


def _covered_summaries(done: Sequence[CVRowResult]) -> list[CoveredSummary]:
    out = []
    for s in group_summaries(done):
        members = done if s.group == "overall" else [r for r in done if getattr(r, s.group) == s.value]
        flags = [r.covered for r in members if r.covered is not None]
        out.append(CoveredSummary(**asdict(s), interval_coverage=sum(flags) / len(flags) if flags else None))
    return out


def independent_prior(runs: Sequence[PreparedRun]) -> Callable[[list], dict | None] | None:
    """Per fold (its held-out sources), constants that rest on none of the held-out runs, for the constants the
    fold's training runs cannot move (compute_scale_torch when the only PyTorch-native source is held out), instead
    of the constant's neutral default: the shipped default calibration's constants when it was fitted on none of
    ``runs``; else, for a fold holding out one source the shipped calibration was fitted on, the constants of the
    shipped calibration's own leave-one-source-out fold without that source (stored in its ``cv``); else nothing."""
    cal = calibration_option(None)
    if cal is None:
        return None
    fitted = cal.fitted_run_ids()
    if not fitted:  # no record of the runs it rests on: nothing is known to be independent of them
        return None
    if not any(r.row.id in fitted for r in runs):
        shipped = dict(cal.constants)
        return lambda held_out: shipped
    folds = {tuple(f.get("held_out") or ()): dict(f["constants"]) for f in (cal.cv or {}).get("fold_constants", ())}
    return lambda held_out: folds.get(tuple(held_out))


def validate_source_cv(rows: Iterable[RunRow], tiers: Iterable[str] | None = None,
                       constants: Sequence[str] | str | None = None, cost_model=None,
                       hardware_fn: Callable | None = None, in_sample: bool = True,
                       progress: Callable[[int, int], None] | None = None) -> CVReport:
    """Leave-one-source-out validation of ``rows`` (of the selected tiers): see the module docstring.
    ``progress(done, total)`` is called before each run is predicted."""
    rows = list(rows)
    selected = rows if tiers is None else [r for r in rows if r.tier in {t.upper() for t in tiers}]
    names = parse_constants(constants)
    runs, skipped = prepare_runs(selected, cost_model, hardware_fn, progress)
    if len({r.row.prefix for r in runs}) < 2:
        raise PlannerError("--cv source needs predictable runs of at least two sources (run id prefixes); "
                           "add runs or use --cv none.")
    cv = cross_validate(runs, names, "source", prior=independent_prior(runs))
    fold_cal = {f["fold"]: identity(f["constants"], name=f"cv-fold-{f['fold']}") for f in cv["fold_constants"]}
    recs = {p["id"]: p for p in cv["per_run"]}
    bands = dict(zip((p["id"] for p in cv["per_run"]), held_out_coverage(cv["per_run"])))
    results: dict[str, CVRowResult] = {}
    for run in runs:
        rec = recs.get(run.row.id)
        if rec is None:  # a fold with fewer training runs than constants
            continue
        res = _row_result(run, rec, fold_cal[rec["fold"]])
        found = bands[run.row.id]  # from the other sources' held-out residuals only
        if found is not None:
            key, group = found
            res.interval_group, res.interval_n = key, group["n"]
            res.interval_low, res.interval_high = _band(res.metric, rec["predicted"], group)
            res.covered = covers(group, rec["residual"])
        results[run.row.id] = res
    reasons = dict(skipped)
    out: list[RowResult] = []
    for row in selected:
        if row.id in results:
            out.append(results[row.id])
            continue
        out.append(RowResult(id=row.id, source=row.prefix, model=row.model_name, gpu="", cluster="",
                             n_gpus=row.get("n_gpus"), layout={}, kind="", metric=row.measured_metric,
                             measured=row.measured_value, tier=row.tier, assumptions=list(row.assumptions),
                             skip_reason=reasons.get(row.id) or "its source's fold had too few training runs"))
    done = [r for r in out if isinstance(r, CVRowResult)]
    report = CVReport(rows=out, summaries=_covered_summaries(done), excluded_by_tier=len(rows) - len(selected),
                      constants=names, uncalibrated=error_stats([p["before"] for p in cv["per_run"]]),
                      folds=[{"held_out": f["held_out"], "constants": f["constants"]} for f in cv["fold_constants"]])
    if in_sample:
        fit = fit_constants(runs, names)
        cal = identity(fit.constants, name="in-sample")
        report.in_sample = {"constants": fit.constants,
                            **error_stats([r.predicted_value(cal) / r.row.measured_value - 1.0 for r in runs])}
    return report
