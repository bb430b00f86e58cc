"""The Python API: `planner predict` and `planner explain` as functions (:func:`predict`, :func:`explain`; `search`,
`size` and `compare` are in :mod:`planner.search.api`). All five are exported by the package: ``planner.predict(...)``.

Keyword names are the commands' flags with underscores (``model='llama-13b', gpu='a100-80gb', gpus=16, tp=2``), the
plan keywords are the fields of :class:`planner.requests.PlanRequest` (the keys of a `predict --batch` line) with
its defaults, and the shipped default calibration is applied unless ``calibration='none'``: the numbers are the
CLI's. Each returns a typed result whose ``to_dict()`` is the command's ``--format json`` object; bad input raises
:class:`costmodel.core.errors.PlannerError` (a layout that does not divide: its subclass ``PlanError``). Output
options (--format, --verbose, --report) are the CLI's own.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from pathlib import Path

from costmodel.core.specs.framework import attention_kernel
from planner.calibrate import Calibration, calibration_option
from planner.models_dir import models_dir_for, use_models_dir
from planner.plan_file import plan_file_values
from planner.prediction import Prediction
from planner.prediction import predict as predict_plan
from planner.requests import REQUEST_KEYS, REQUIRED, PlanRequest
from planner.search.explain import ExplainResult, explain_plan

__all__ = ["ExplainResult", "PredictResult", "explain", "predict", "predict_request"]


@dataclass
class PredictResult(Prediction):
    """A :class:`~planner.prediction.Prediction` with what `planner predict` reports beside it."""

    calibration: str = "none"
    """Name of the calibration applied ('none': uncalibrated)."""
    models_dir: str = ""
    """Folder of the fitted operator models used for this GPU ('' = none: roofline)."""
    plan: dict = field(default_factory=dict)
    """The plan as predicted: model, GPU, every parallel degree, batch, layer split, framework, MoE layout."""


def moe_plan_keys(plan) -> dict:
    """The MoE layout of a plan as JSON keys (ep, etp, expert_dp, moe_dispatcher, moe_imbalance: None = the
    cost model's default, moe_routing, moe_overlap_comm, moe_grouped_gemm)."""
    return {"ep": plan.ep, "etp": plan.etp, "expert_dp": plan.expert_dp, "moe_dispatcher": plan.moe_dispatcher,
            "moe_imbalance": plan.moe_imbalance, "moe_routing": plan.moe_routing,
            "moe_overlap_comm": plan.moe_overlap_comm, "moe_grouped_gemm": plan.moe_grouped_gemm}


def _plan_record(req: PlanRequest, res, pred: Prediction) -> dict:
    """The "plan" object of a `planner predict` record."""
    plan = res.plan
    out = {"model": res.model.name, "gpu": res.hardware.gpu.name, "cluster": res.hardware.cluster.name,
           "gpus": plan.gpus, "gpus_per_node": plan.gpus_per_node, "tp": plan.tp,
           "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "vpp": plan.vpp,
           "mbs": plan.mbs, "gbs": plan.gbs,
           "seq_len": plan.seq_len, "num_microbatches": plan.num_microbatches,
           "recompute": plan.recompute, "sequence_parallel": plan.sp, "zero": plan.zero,
           "dtype": plan.dtype, "layer_split": pred.layer_split, "framework": plan.framework,
           "attention": attention_kernel(plan)}
    if plan.pipeline_layout is not None:  # layers per virtual stage; absent for Megatron's classic split
        out["pipeline_layout"] = list(plan.pipeline_layout)
    if plan.recompute_modules:  # Megatron-Core --recompute-modules; absent for the default selective
        out["recompute_modules"] = list(plan.recompute_modules)
    if res.model.is_moe:  # MoE keys only for MoE models: a dense plan's record stays as it was
        out.update(moe_plan_keys(plan))
    out.update(req.memory_fields())  # memory features only where the request sets them
    if plan.cuda_graphs:  # absent without CUDA graphs: a plan's record stays as it was
        out["cuda_graphs"] = True
    if plan.tp_comm_overlap:  # absent without it: a plan's record stays as it was
        out["tp_comm_overlap"] = True
    if plan.cross_entropy_fusion is not None:
        out["cross_entropy_fusion"] = plan.cross_entropy_fusion
    return out


def predict_request(req: PlanRequest, hardware_files: tuple = (), calibration: Calibration | None = None
                    ) -> PredictResult:
    """Predict one PlanRequest with ``calibration`` (None: uncalibrated); raises PlannerError on bad input."""
    res = req.resolve(hardware_files)
    pred = predict_plan(res.model, res.plan, res.hardware, calibration=calibration)
    return PredictResult(**{f.name: getattr(pred, f.name) for f in fields(Prediction)},
                         calibration=calibration.name if calibration is not None else "none",
                         # '' = no fitted model for this GPU (roofline)
                         models_dir=models_dir_for(res.hardware.gpu.name), plan=_plan_record(req, res, pred))


def _inputs(plan: dict, hardware_file, models, calibration, plan_file=None
            ) -> tuple[PlanRequest, tuple, Calibration | None]:
    """The request, hardware files and calibration of an API call (``models``: as the CLI's --models;
    ``plan_file``: a plan file whose keys the keywords given override)."""
    if plan_file is not None:
        plan = {**plan_file_values(plan_file), **plan}
    if models is not None:
        use_models_dir(Path(models))
    cal = calibration if isinstance(calibration, Calibration) else calibration_option(calibration)
    return PlanRequest.from_dict(plan), tuple(hardware_file), cal


def predict(*, hardware_file: list[str] | tuple[str, ...] = (), models: str | Path | None = None,
            calibration: str | Calibration | None = None, plan: str | Path | None = None, **keys) -> PredictResult:
    """`planner predict`: one plan's iteration time, throughput, MFU, memory and operator breakdown.

    ``keys``: the plan keywords (``model``, ``gpu`` and ``gpus`` required unless ``plan`` gives them; see the
    signature). ``plan``: a plan file (TOML/YAML, the batch keys; planner.plan_file); keywords given override it.
    ``calibration``:
    None = the shipped default calibration, 'none' = uncalibrated, a NAME or file from `planner calibrate`, or a
    :class:`planner.calibrate.Calibration`. ``models``: a folder from `planner fit --out DIR`, read first from then
    on in this process (as --models). ``hardware_file``: TOML/YAML files adding GPUs or clusters.
    """
    req, files, cal = _inputs(keys, hardware_file, models, calibration, plan)
    return predict_request(req, files, cal)


def explain(*, hardware_file: list[str] | tuple[str, ...] = (), models: str | Path | None = None,
            calibration: str | Calibration | None = None, plan: str | Path | None = None, **keys) -> ExplainResult:
    """`planner explain`: :func:`predict`'s prediction (the same iteration time) with every operator per pipeline
    stage and phase. Keywords as :func:`predict`'s."""
    req, files, cal = _inputs(keys, hardware_file, models, calibration, plan)
    res = req.resolve(files)
    return explain_plan(res.model, res.plan, res.hardware, calibration=cal)


def _signature(function, plan_keys: tuple[str, ...]) -> inspect.Signature:
    """``function``'s signature with ``**plan`` spelled out as the PlanRequest keywords and their defaults."""
    defaults = {f.name: f.default for f in fields(PlanRequest)}
    kw = inspect.Parameter.KEYWORD_ONLY
    spelled = [inspect.Parameter(k, kw, default=inspect.Parameter.empty if k in REQUIRED else defaults[k])
               for k in plan_keys]
    own = [p for p in inspect.signature(function).parameters.values() if p.kind is kw]
    return inspect.Signature(spelled + own, return_annotation=inspect.signature(function).return_annotation)


PLAN_KEYWORDS = tuple(k for k in REQUEST_KEYS if k != "id")
"""The plan keywords of :func:`predict` and :func:`explain`: PlanRequest's fields (the batch-file keys)."""
predict.__signature__ = _signature(predict, PLAN_KEYWORDS)  # type: ignore[attr-defined]
explain.__signature__ = _signature(explain, PLAN_KEYWORDS)  # type: ignore[attr-defined]
