"""Shipped model presets (``search_spaces/models/<name>.toml``) and model-argument resolution.

Each preset file holds ModelSpec fields directly plus ``source`` (the public config.json or paper
table the numbers come from) and an optional ``[extra]`` table. Files are read once and cached.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.core.paths import REPO_ROOT
from costmodel.core.specs.hf_config import from_hf_config
from costmodel.core.specs.model import ModelSpec

MODELS_DIR = REPO_ROOT / "search_spaces" / "models"
"""Folder of the preset files (one ``<name>.toml`` per model)."""

_SPEC_FIELDS = {f.name for f in fields(ModelSpec)}

UNMODELLED_EXTRA = ("sliding_window",)
"""[extra] keys that change the architecture but not the cost model (attention is costed over the whole causal
sequence): a preset carrying one warns as a config.json does (hf_config.unread_keys -> extra['unread_keys'])."""


COMMON_TRAINING_SEQ_LEN = 4096
"""Default sequence length of a model whose source cites no pre-training context (a config.json): 4096, the
pre-training length of Llama 2 (arXiv 2307.09288 Table 1), DeepSeek-V3 (arXiv 2412.19437 sec. 4.2) and Qwen3's
main stages (arXiv 2505.09388 sec. 3.2); a config.json's max_position_embeddings is an inference limit (often after
a context extension), not the length a run trains at."""


def default_seq_len(model: ModelSpec) -> tuple[int, str]:
    """(sequence length a plan gets when none is given, where it comes from in words): a preset's cited
    pre-training context (``max_seq_len`` with ``extra['seq_len_source']``), else the smaller of the model's
    positions and :data:`COMMON_TRAINING_SEQ_LEN`."""
    cited = model.extra.get("seq_len_source") if isinstance(model.extra, dict) else None
    if cited:
        return model.max_seq_len, f"the preset's pre-training context ({cited})"
    if model.max_seq_len <= COMMON_TRAINING_SEQ_LEN:
        return model.max_seq_len, f"the model's {model.max_seq_len} positions"
    return COMMON_TRAINING_SEQ_LEN, (f"planner's common training length {COMMON_TRAINING_SEQ_LEN} (Llama 2, "
                                     f"DeepSeek-V3 and Qwen3 pre-train at 4096; the model's {model.max_seq_len} "
                                     "positions are an inference limit)")


def _load_preset(path: Path) -> ModelSpec:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise PlannerError(f"model preset {path} is not valid TOML ({exc}); fix the file.") from None
    unknown = sorted(set(data) - _SPEC_FIELDS)
    if unknown:
        raise PlannerError(f"model preset {path} has unknown keys {', '.join(unknown)}; use ModelSpec field "
                           "names (see costmodel/core/specs/model.py) or put them under [extra].")
    if not str(data.get("source", "")).strip():
        raise PlannerError(f"model preset {path} has no 'source'; name the config.json or paper table "
                           "the numbers come from.")
    name = data.pop("name", path.stem)
    if name != path.stem:
        raise PlannerError(f"model preset {path} says name = {name!r}; the name must match the file name "
                           f"{path.stem!r}.")
    extra = data.get("extra")
    if isinstance(extra, dict):
        unmodelled = [k for k in UNMODELLED_EXTRA if extra.get(k) is not None]
        if unmodelled:
            data["extra"] = {**extra, "unread_keys": unmodelled}
    return ModelSpec(name=name, **data)


@lru_cache(maxsize=1)
def _presets() -> dict[str, ModelSpec]:
    """All presets keyed by lower-case name (read once per process)."""
    if not MODELS_DIR.is_dir():
        return {}
    return {p.stem.lower(): _load_preset(p) for p in sorted(MODELS_DIR.glob("*.toml"))}


def preset_names() -> list[str]:
    """Names of the shipped presets in natural order (llama-7b before llama-13b)."""
    def key(name: str) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name.lower())]
    return sorted((spec.name for spec in _presets().values()), key=key)


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive)."""
    spec = _presets().get(name.strip().lower())
    if spec is None:
        raise PlannerError(f"unknown model preset {name!r}; choose one of {', '.join(preset_names())} "
                           "(see `planner models`) or give the path of a Hugging Face config.json.")
    return spec


def resolve_model(arg: str | dict | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a preset name, a path to a config.json (or its folder), or a config.json dict."""
    if isinstance(arg, ModelSpec):
        return arg
    if isinstance(arg, dict):
        return from_hf_config(arg)
    if isinstance(arg, Path):
        return from_hf_config(arg)
    if isinstance(arg, str):
        if arg.strip().lower() in _presets():
            return get_preset(arg)
        path = Path(arg).expanduser()
        if path.exists() or arg.endswith(".json") or "/" in arg or "\\" in arg:
            return from_hf_config(path)
        return get_preset(arg)
    raise PlannerError(f"cannot read a model from a {type(arg).__name__}; give a preset name (see `planner models`), "
                       "a config.json path or a config dict.")
