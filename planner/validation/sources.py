"""Rules of the published sources, read from ``search_spaces/validation/published_sources.toml``.

A published source (e.g. Narayanan et al. SC21 Table 1) may need a rule that its rows do not state: its
``tflops_per_gpu`` counts the recompute forward pass, or its runs trained with dropout. Such rules live in
the shipped TOML file, one table per source with the exact ``source`` texts of its rows and each rule's
assumption and citation. A run row gets a rule only when its ``source`` column is one of those texts; the
row id plays no part, so a user's own run file gets no rule unless it names a published source.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import search_spaces
from costmodel.core.errors import PlannerError

FILE_NAME = "published_sources.toml"

RULES = {
    "tflops_counts_recompute": "tflops_per_gpu counts the recompute forward pass (HFU-like): compared with "
                               "the predicted hardware FLOPs instead of model FLOPs",
    "dropout": "the runs trained with dropout active: the model is built with dropout",
    "unfused_attention": "the stack predates FlashAttention: the plan's attention kernel is unfused",
    "no_gradient_accumulation": "the stack has no gradient accumulation: an unstated micro-batch is the global "
                                "batch over data-parallel replicas",
    "cross_entropy_fusion": "the source's runs computed the loss with one fused kernel (Megatron-Core "
                            "--cross-entropy-fusion-impl te): the plan's cross_entropy_fusion is on",
    "dp_overlap": "the source's runs overlapped the DP gradient reduction and the distributed optimizer's "
                  "parameter all-gather with compute (Megatron --overlap-grad-reduce --overlap-param-gather)",
    "recompute_none": "the source's recipes recompute nothing: a row that states no recompute mode ran without "
                      "activation recomputation",
    "tp_comm_overlap": "the source's runs overlapped the TP all-gathers / reduce-scatters with the GEMMs "
                       "(Transformer Engine userbuffers: Megatron --tp-comm-overlap)",
    "flash1_attention": "the stack ran the first FlashAttention kernels (PyTorch 2.0 / 2.1 "
                        "scaled_dot_product_attention): the plan's attention kernel is flash1",
    "flash2_attention": "the stack ran FlashAttention-2 kernels (Transformer Engine's flash backend): the plan's "
                        "attention kernel is flash2",
    "tflops_mcore_full_attention": "a source's tflops_per_gpu is Megatron-Core's 2024 FLOPs counter (full s x s "
                                   "attention; planner.validation.moe_rows.megatron_flops)",
    "tflops_mcore_causal": "a source's tflops_per_gpu is Megatron-Core's 2025+ FLOPs counter (causal half of "
                           "the attention, dense/MoE/shared MLPs, MLA; planner.validation.moe_rows.megatron_flops)",
    "moe_token_drop": "an MoE source's recipe drops tokens at capacity factor 1 and pads every expert to capacity: "
                      "every expert runs the balanced share (routing imbalance 1)",
    "grads_bf16": "the runs keep and reduce bf16 main gradients (main_grads_dtype bf16)",
    "fp8_param_gather": "fp8 runs keep fp8 primary weights, all-gathered in fp8 (fp8_param_gather; not with ZeRO-3)",
    "fp8_moments_bf16": "fp8 runs store Adam's moments in bf16 (exp_avg_dtype and exp_avg_sq_dtype bf16)",
    "optimizer_states_bf16": "the optimizer keeps bf16 main parameters and bf16 moments (main_params_dtype, "
                             "exp_avg_dtype, exp_avg_sq_dtype bf16)",
    "bf16_model_states": "a bf16 model under PyTorch FSDP2 and a torch optimizer: no main copy, bf16 moments and "
                         "gradients (main_params_dtype none; exp_avg_dtype, exp_avg_sq_dtype, main_grads_dtype bf16)",
}
"""Rule name -> what it changes. A rule not listed here is an error in the TOML file."""


@dataclass(frozen=True)
class Rule:
    """One source-specific rule."""

    name: str
    """One of the RULES keys."""
    assumption: str
    """The assumption the rule makes (the dropout rule's text is listed among a row's assumptions)."""
    citation: str
    """Where the assumption comes from."""


@dataclass(frozen=True)
class PublishedSource:
    """One published source: the ``source`` texts of its rows and its rules."""

    key: str
    """Table name, the id prefix of the source's rows (e.g. ``NARAY21``)."""
    sources: tuple[str, ...]
    """Exact texts of the run file's ``source`` column that name this publication."""
    rules: dict[str, Rule] = field(default_factory=dict)
    """Rule name -> Rule."""


def sources_file() -> Path:
    """The shipped ``search_spaces/validation/published_sources.toml``."""
    for base in search_spaces.__path__:  # a namespace package under an editable install: search every path
        path = Path(base) / "validation" / FILE_NAME
        if path.is_file():
            return path
    raise PlannerError(f"the published-source rules (search_spaces/validation/{FILE_NAME}) are missing; "
                       "reinstall planner.")


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PlannerError(f"{where} must be a non-empty string")
    return value.strip()


def parse_sources(data: dict, where: str = FILE_NAME) -> dict[str, PublishedSource]:
    """Table name -> PublishedSource from the parsed TOML; PlannerError naming the bad entry."""
    out: dict[str, PublishedSource] = {}
    owner: dict[str, str] = {}
    for key, table in data.items():
        if not isinstance(table, dict):
            raise PlannerError(f"{where}: [{key}] must be a table with a `sources` list")
        unknown = set(table) - {"sources", "rules"}
        if unknown:
            raise PlannerError(f"{where}: [{key}] has unknown key {sorted(unknown)[0]!r}; use sources and rules")
        texts = table.get("sources")
        if not isinstance(texts, list) or not texts:
            raise PlannerError(f"{where}: [{key}] needs a non-empty `sources` list")
        texts = tuple(_text(t, f"{where}: [{key}] sources entry") for t in texts)
        for t in texts:
            if t in owner:
                raise PlannerError(f"{where}: source {t!r} is listed in both [{owner[t]}] and [{key}]")
            owner[t] = key
        rules = {}
        for name, rule in (table.get("rules") or {}).items():
            if name not in RULES:
                raise PlannerError(f"{where}: [{key}.rules.{name}] is not a known rule; use one of "
                                   f"{', '.join(RULES)}")
            if not isinstance(rule, dict) or set(rule) != {"assumption", "citation"}:
                raise PlannerError(f"{where}: [{key}.rules.{name}] needs exactly `assumption` and `citation`")
            rules[name] = Rule(name, _text(rule["assumption"], f"{where}: [{key}.rules.{name}] assumption"),
                               _text(rule["citation"], f"{where}: [{key}.rules.{name}] citation"))
        out[key] = PublishedSource(key, texts, rules)
    return out


def load_sources(path: str | Path) -> dict[str, PublishedSource]:
    """Read and check a published-source rules file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PlannerError(f"{path}: cannot read the published-source rules ({exc})") from None
    return parse_sources(data, str(path))


@lru_cache(maxsize=1)
def _by_source_text() -> dict[str, PublishedSource]:
    return {text: src for src in load_sources(sources_file()).values() for text in src.sources}


def published_source(source: str) -> PublishedSource | None:
    """The published source whose ``sources`` list holds exactly ``source`` (stripped), else None."""
    return _by_source_text().get(source.strip())


def source_rule(source: str, name: str) -> Rule | None:
    """Rule ``name`` of the published source named by ``source``; None for other sources (users' files)."""
    if name not in RULES:
        raise PlannerError(f"unknown source rule {name!r}; use one of {', '.join(RULES)}")
    src = published_source(source)
    return None if src is None else src.rules.get(name)
