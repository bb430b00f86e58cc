"""The global batch: one rule that turns tokens into sequences for every command, and the default range.

Every command that turns a batch in tokens into a global batch size (GBS, sequences) calls
:func:`batch_steps`: `planner predict` / `explain` / `export` for the one plan named, `search`, `compare` and
`size` for every plan they evaluate. A plan's GBS is a multiple of its MBS x DP (one optimizer step
accumulates whole micro-batches on every data-parallel rank):

* a single value T (``--tokens-per-batch 16M``): the multiple of MBS x DP nearest T / seq_len sequences
  (halves round up);
* a range MIN:MAX (``--tokens-per-batch 4M:16M``, or the default range below): the largest multiple of
  MBS x DP whose tokens do not exceed MAX, refused when it falls below MIN.

A plan whose MBS x DP alone exceeds the batch (no multiple fits: "DP capped by the batch") is refused by the
searches; `planner predict` still runs the plan it was given, with one micro-batch per DP rank.

Default range (`search`, `compare`, `size` without ``--gbs`` / ``--tokens-per-batch``): from
:data:`DEFAULT_BATCH_TOKENS` (Llama 2's 4M tokens) up to DeepSeek's compute-optimal batch (DeepSeek LLM,
arXiv 2401.02954 §3.1: B_opt = 0.2920 · C^0.3271 tokens, C = training compute in FLOPs), where C = model
FLOPs per token x the token budget (without ``--tokens``: Chinchilla's 20 tokens per parameter, Hoffmann et
al. 2022). The searches then take the largest batch in the range, the one that trains fastest per token.
For Llama 3 405B (C = 3.8e25) B_opt is 68M tokens; Meta trained it with batches growing 4M -> 8M -> 16M
(Dubey et al. 2024 §3.4.1), DeepSeek-V3 (C ≈ 3.3e24) with up to 63M (arXiv 2412.19437 §4.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.core.errors import PlannerError

DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
"""Default global batch in tokens of a named plan (`planner predict`) and the bottom of the searches' default range:
4M tokens, the batch of Llama 2 (Touvron et al. 2023, §2.2 'global batch-size of 4M tokens')."""

DEEPSEEK_BATCH_COEF = 0.2920
"""B_opt = DEEPSEEK_BATCH_COEF x C^DEEPSEEK_BATCH_EXP tokens: DeepSeek LLM (arXiv 2401.02954) §3.1, eq. 1."""
DEEPSEEK_BATCH_EXP = 0.3271
"""Exponent of the DeepSeek batch rule (same source)."""
CHINCHILLA_TOKENS_PER_PARAM = 20.0
"""Training tokens per parameter of a compute-optimal run (Hoffmann et al. 2022, "Training Compute-Optimal
Large Language Models"): the budget the default batch assumes when no --tokens is given."""


@dataclass(frozen=True)
class BatchRange:
    """The global batch in tokens a search may choose from, and where it came from."""

    min_tokens: float
    """Smallest batch in tokens."""
    max_tokens: float
    """Largest batch in tokens (the target)."""
    source: str = "--tokens-per-batch"
    """How the range was set (shown in the output)."""

    def __post_init__(self) -> None:
        text = f"--tokens-per-batch {self.min_tokens:.6g}:{self.max_tokens:.6g}"
        if not 0 < self.min_tokens <= self.max_tokens:
            raise PlannerError(f"{text} must be positive with MIN <= MAX, e.g. 4M:16M.")
        if not self.max_tokens < 2**53:  # planner.requests.MAX_INT: integers stay exact as doubles
            raise PlannerError(f"{text} must be below 2**53 tokens, e.g. 16M.")

    @property
    def single(self) -> bool:
        """One value (nearest rounding) rather than a range."""
        return self.min_tokens == self.max_tokens

    def text(self) -> str:
        """'16.8M' or '4.19M-16.8M'."""
        return tokens_text(self.max_tokens) if self.single else \
            f"{tokens_text(self.min_tokens)}-{tokens_text(self.max_tokens)}"

    def to_dict(self) -> dict:
        return {"min_tokens": self.min_tokens, "max_tokens": self.max_tokens, "source": self.source}


def suffixed_number(text: object, suffixes: dict[str, float]) -> float:
    """The number written in ``text`` ('4M', '2T', '1e12', '4_194_304'; case and underscores ignored), with a
    final letter of ``suffixes`` as its multiplier; raises ValueError when it is not a number."""
    s = str(text).strip().lower().replace("_", "")
    mult = 1.0
    if s and s[-1] in suffixes:
        s, mult = s[:-1], suffixes[s[-1]]
    return float(s) * mult


def tokens_text(tokens: float) -> str:
    """'16.8M', '1.05B', '2T', '524,288'."""
    if tokens >= 1e12:
        return f"{tokens / 1e12:.3g}T"
    return f"{tokens / 1e9:.3g}B" if tokens >= 1e9 else f"{tokens / 1e6:.3g}M" if tokens >= 1e6 else f"{tokens:,.0f}"


ROUNDING = ("GBS = a multiple of MBS x DP: the one nearest a single --tokens-per-batch value, else the largest "
            "not above the range's top (planner.batch)")
"""The rounding rule, as outputs state it."""


def batch_steps(seq_len: int, unit: int, batch: BatchRange) -> int:
    """Accumulation steps k of a plan whose MBS x DP is ``unit``: its GBS is k x unit sequences. 0 = no multiple
    of ``unit`` lies in the batch range (a single value: the nearest multiple is 0)."""
    per_step = seq_len * unit
    if batch.single:
        return math.floor(batch.max_tokens / per_step + 0.5)
    k = math.floor(batch.max_tokens / per_step)
    return k if k * per_step >= batch.min_tokens else 0


def batch_sequences(seq_len: int, unit: int, tokens: float = DEFAULT_BATCH_TOKENS) -> int:
    """GBS of one named plan (`planner predict`): the multiple of ``unit`` = MBS x DP nearest ``tokens``, at
    least one step (:func:`batch_steps` with a single value)."""
    return unit * max(1, batch_steps(seq_len, unit, BatchRange(tokens, tokens)))


def compute_optimal_batch(flops: float) -> float:
    """DeepSeek LLM's B_opt in tokens for a training run of ``flops`` FLOPs (§3.1)."""
    return DEEPSEEK_BATCH_COEF * flops ** DEEPSEEK_BATCH_EXP


def default_batch_range(model, seq_len: int, tokens: float | None = None) -> BatchRange:
    """The default range (module docstring): DEFAULT_BATCH_TOKENS (or B_opt when smaller) to B_opt, with C = model
    FLOPs per token (costmodel.schedule.flops, as MFU counts them) x ``tokens`` (None: 20 tokens per parameter)."""
    from costmodel.schedule.flops import model_flops_per_iteration  # deferred: the cost model loads only when needed

    per_token = model_flops_per_iteration(model, 1, seq_len) / seq_len
    budget = tokens if tokens is not None else CHINCHILLA_TOKENS_PER_PARAM * per_token / 6.0
    flops = per_token * budget
    top = compute_optimal_batch(flops)
    basis = "--tokens" if tokens is not None else "20 tokens per parameter"
    return BatchRange(min(float(DEFAULT_BATCH_TOKENS), top), top,
                      f"default: 4M (Llama 2) to DeepSeek's B_opt = 0.292 C^0.327 at C = {flops:.2g} FLOPs ({basis})")


def parse_batch_range(text: str | int | None) -> BatchRange | None:
    """--tokens-per-batch as a range: '16M' (one value) or '4M:16M'; None stays None."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        return BatchRange(float(text), float(text))
    parts = str(text).split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        values = [suffixed_number(p, {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}) for p in parts]
    except ValueError:
        raise PlannerError(f"--tokens-per-batch {text!r} must be tokens (4M, 16e6) or a range MIN:MAX (4M:16M)."
                           ) from None
    if not all(math.isfinite(v) and v >= 1 for v in values):
        raise PlannerError(f"--tokens-per-batch {text!r} must be positive numbers of tokens, e.g. 4M or 4M:16M.")
    return BatchRange(float(round(values[0])), float(round(values[-1])))


def batch_range(model, seq: int, tokens: float | None, tokens_per_batch) -> BatchRange:
    """The batch range of a search: ``tokens_per_batch`` as given (a BatchRange or a number of tokens), else
    :func:`default_batch_range`."""
    if isinstance(tokens_per_batch, BatchRange):
        return tokens_per_batch
    if tokens_per_batch is not None:
        if isinstance(tokens_per_batch, bool) or not tokens_per_batch > 0:
            raise PlannerError(f"--tokens-per-batch must be a positive number of tokens, got {tokens_per_batch!r}.")
        return BatchRange(float(tokens_per_batch), float(tokens_per_batch))
    return default_batch_range(model, seq, tokens)
