"""Turn user input (CLI flags or one JSON object of a batch file) into the three cost-model inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.core.errors import PlannerError
from costmodel.core.specs.hardware import Hardware
from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import DTYPES, RECOMPUTE_MODES, ParallelPlan

DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
"""Default global batch in tokens when none is given: 4M tokens, the batch of Llama 2
(Touvron et al. 2023, §2.2 'global batch-size of 4M tokens'). Rounded up to a multiple of MBS x DP."""

# key -> (type, default, help). `model`, `gpu` and `gpus` are required.
REQUEST_KEYS: dict[str, tuple[type | tuple, object, str]] = {
    "id": ((str, int), None, "your identifier, echoed back"),
    "model": ((str, dict), None, "preset name, path to a config.json, or an inline config.json object"),
    "gpu": (str, None, "GPU key from `planner gpus`"),
    "gpus": (int, None, "total number of GPUs"),
    "cluster": (str, None, "node type from `planner gpus` (default: the GPU's default node type)"),
    "gpus_per_node": (int, None, "GPUs per node (default: from the node type)"),
    "tp": (int, 1, "tensor-parallel degree"),
    "pp": (int, 1, "pipeline-parallel degree"),
    "cp": (int, 1, "context-parallel degree"),
    "vpp": (int, 1, "virtual pipeline chunks per stage"),
    "mbs": (int, 1, "micro-batch size (sequences)"),
    "gbs": (int, None, "global batch size (sequences); default about 4M tokens"),
    "seq_len": (int, None, "sequence length (default: the model's max_seq_len)"),
    "recompute": (str, "selective", "none | selective | full"),
    "sequence_parallel": (bool, True, "Megatron sequence parallelism when tp > 1"),
    "zero": (int, 1, "ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP)"),
    "dtype": (str, "bf16", "bf16 | fp16 | fp8"),
    "layer_split": (list, None, "layers per pipeline stage when uneven, e.g. [9, 8, 8, 7]"),
}
REQUIRED = ("model", "gpu", "gpus")
MAX_INT = 2**53
"""Integers must stay below 2**53, the range where every integer is exact as an IEEE 754 double
(53-bit significand): the cost model computes in floats, and larger values overflow or lose digits."""


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    plan: ParallelPlan
    hardware: Hardware


def _check_type(key: str, value: object) -> object:
    typ = REQUEST_KEYS[key][0]
    if typ is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlannerError(f"{key}={value!r} must be an integer")
        if value <= 0 and key != "zero":
            raise PlannerError(f"{key}={value} must be a positive integer")
        if value >= MAX_INT:
            raise PlannerError(f"{key}={value} is too large; it must be below 2**53")
        return value
    if typ is list:
        if (not isinstance(value, list) or not value
                or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value)):
            raise PlannerError(f"{key}={value!r} must be a list of positive integers, one per pipeline stage")
        return tuple(value)
    if typ is bool:
        if not isinstance(value, bool):
            raise PlannerError(f"{key}={value!r} must be true or false")
        return value
    if not isinstance(value, typ):
        names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise PlannerError(f"{key}={value!r} must be a {names}")
    return value


def build_request(raw: dict, hardware_files: tuple = ()) -> Request:
    """Validate a request dict (batch-line keys) and resolve model, plan and hardware."""
    from costmodel.core.specs.catalogue import load_catalogue
    from costmodel.core.specs.presets import resolve_model

    if not isinstance(raw, dict):
        raise PlannerError("each request must be a JSON object with keys model, gpu, gpus")
    unknown = sorted(set(raw) - set(REQUEST_KEYS))
    if unknown:
        raise PlannerError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REQUEST_KEYS)}")
    missing = [k for k in REQUIRED if raw.get(k) is None]
    if missing:
        raise PlannerError(f"missing required key(s) {', '.join(missing)}")
    vals = {k: (_check_type(k, raw[k]) if raw.get(k) is not None else REQUEST_KEYS[k][1]) for k in REQUEST_KEYS}
    if vals["recompute"] not in RECOMPUTE_MODES:
        raise PlannerError(f"recompute={vals['recompute']!r} must be one of {', '.join(RECOMPUTE_MODES)}")
    if vals["dtype"] not in DTYPES:
        raise PlannerError(f"dtype={vals['dtype']!r} must be one of {', '.join(DTYPES)}")
    model = resolve_model(vals["model"])
    model.require_dense()
    hardware = load_catalogue(hardware_files).resolve(vals["gpu"], vals["cluster"], vals["gpus_per_node"])
    gpus = vals["gpus"]
    gpn = min(hardware.gpus_per_node, gpus)
    seq = vals["seq_len"] or model.max_seq_len
    mp = vals["tp"] * vals["pp"] * vals["cp"]
    dp = gpus // mp if mp and gpus % mp == 0 else 1
    gbs = vals["gbs"]
    if gbs is None:
        unit = vals["mbs"] * dp
        gbs = unit * max(1, -(-DEFAULT_BATCH_TOKENS // (seq * unit)))
    plan = ParallelPlan(world_size=gpus, gpus_per_node=gpn, global_batch_size=gbs, seq_len=seq,
                        tp=vals["tp"], pp=vals["pp"], cp=vals["cp"], vpp=vals["vpp"],
                        micro_batch_size=vals["mbs"], recompute=vals["recompute"],
                        sequence_parallel=vals["sequence_parallel"], zero=vals["zero"], dtype=vals["dtype"],
                        layer_split=vals["layer_split"])
    plan.validate(model)
    return Request(model, plan, hardware)
