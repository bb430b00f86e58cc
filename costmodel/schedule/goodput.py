"""Goodput at scale: the expected share of wall-clock time a training job spends on useful steps.

A perfect run trains ``ideal`` seconds; a real one is interrupted (hardware and software failures, planned
maintenance), loses the work since its last checkpoint, restarts, and stalls while each checkpoint is written.
Goodput G is productive time / wall-clock time, so ``wall = ideal / G``. Every input below has a published
default; the row ids (F7, §2.1, ...) are those of GOODPUT_FACTS.md (shared/data/reliability), which quotes each
source and its verification level.

Equations (first order, exponential failures, GOODPUT_FACTS.md §6.1):

* unplanned interruptions per hour  ``Λ = λ_gpu · N``  (λ_gpu per GPU-hour: F7, F9); job MTBF ``M = 1 / Λ``;
* planned interruptions per hour ``Λ_p`` for the whole job (F1), each costing a restart but no lost work (the
  job is stopped after a checkpoint);
* checkpoint bytes ``S = b · P`` with b bytes per parameter from precision and optimizer (§2.1);
* blocking time per checkpoint ``δ``: synchronous save ``S / BW`` (BW = aggregate storage write bandwidth), or
  asynchronous save: only the device-to-host copy blocks (§2.2, Google's badput rule);
* checkpoint interval ``τ``: Daly (2006), Future Generation Computer Systems 22(3):303-312, eq. 37
  ``τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ`` for δ < 2M, else ``τ = M`` (§3.2; the exact form as
  implemented in LLNL/scr scr_ckpt_interval.py);
* expected effective training time ratio, Meta's closed form (Kokolis et al., arXiv 2410.21680 §IV-E; §3.4):
  ``ETTR = (1 − (R + τ/2)/M − Λ_p·R) / (1 + δ/τ)`` (the planned term is this module's addition, zero when
  Λ_p = 0); R = restart time;
* goodput ``G = ETTR · (1 − s)``, s = slow-down from stragglers and environment while running (§4, §6.1).

:func:`ettr_exact` is Daly's complete expected wall time for exponential failures (§3.2, level S), for
checking the closed form against GOODPUT_FACTS.md §6.3's simulation column.

Not modelled (GOODPUT_FACTS.md §6.4; :data:`NOT_MODELLED` is what the tools print): correlated failures and
failure domains larger than a GPU (lemon nodes, burn-in, NVL72 racks), queueing and node-replacement time
after an interruption, silent data corruption and loss-spike rollbacks, and stragglers beyond ``s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from costmodel.core.errors import PlannerError

HOUR = 3600.0
DAY = 86400.0

DEFAULT_FAILURE_RATE = 1.97e-5
"""Unexpected interruptions per GPU-hour: Llama 3 405B, 419 unexpected interruptions in 54 days on 16,384
H100 (GOODPUT_FACTS.md F1, F7: 419 / (16,384 x 1,296 h); all causes, hardware and software). Published range
1.2e-5 (Meta RSC-2, F9) to 3.4e-5 (RSC-1) per GPU-hour, 8.1e-5 on an early-life cloud fleet (OPT-175B, F21)."""
DEFAULT_PLANNED_PER_DAY = 47 / 54
"""Planned interruptions per day for the whole job: Llama 3's 47 planned interruptions in 54 days (F1)."""
DEFAULT_RESTART_S = 600.0
"""Restart time R (detect, reschedule, initialise, load, warm up): 10 minutes (GOODPUT_FACTS.md §6.2; published
2-20 min: FT-HSDP 3 min F17, Meta's u0 5-20 min §2.3, MegaScale < 10 min to diagnose F15)."""
DEFAULT_SLOWDOWN = 0.015
"""Throughput lost while running (stragglers, temperature-driven clock changes): 1.5 %, Llama 3's 1-2 %
diurnal variation (GOODPUT_FACTS.md §4, §6.2)."""
DEFAULT_STORAGE_GBS_PER_GPU = 0.122
"""Aggregate checkpoint-write bandwidth per GPU of the job, GB/s: Llama 3's 2 TB/s sustained Tectonic
bandwidth / 16,384 GPUs (GOODPUT_FACTS.md §2.1); BLOOM wrote 2.3 TB in 40 s from 384 GPUs, 0.15 GB/s per GPU
(§2.2), within 25 %. A synchronous save of S bytes blocks S / (N x this) seconds unless --ckpt-bandwidth gives
the storage's aggregate bandwidth."""
DEFAULT_ASYNC_STALL_S = 6.3
"""Blocking time of an asynchronous save (the device-to-host copy): PyTorch DCP async, 7B model, 148.8 s ->
6.3 s (GOODPUT_FACTS.md §2.2, §6.2 "≈ 6 s")."""
CKPT_MODES = ("sync", "async")

NOT_MODELLED = ("correlated and rack-level failures, burn-in and lemon nodes; queueing or node replacement after "
                "an interruption; silent-data-corruption and loss-spike rollbacks; stragglers beyond the "
                "slow-down (GOODPUT_FACTS.md §6.4)")
"""What the goodput model leaves out, as the tools print it."""


@dataclass(frozen=True)
class FailureModel:
    """Inputs of the goodput model (defaults: GOODPUT_FACTS.md §6.2)."""

    failure_rate: float = DEFAULT_FAILURE_RATE
    """Unexpected interruptions per GPU-hour (λ_gpu)."""
    planned_per_day: float = DEFAULT_PLANNED_PER_DAY
    """Planned interruptions per day for the whole job (each costs one restart)."""
    restart_s: float = DEFAULT_RESTART_S
    """Seconds from an interruption until training runs again (R)."""
    ckpt_mode: str = "sync"
    """sync: the save blocks for checkpoint bytes / storage bandwidth; async: only the device-to-host copy
    blocks (Megatron --async-save, torchtitan checkpoint.async_mode)."""
    storage_gbs: float | None = None
    """Aggregate storage write bandwidth in GB/s for synchronous saves; None = DEFAULT_STORAGE_GBS_PER_GPU x N."""
    async_stall_s: float = DEFAULT_ASYNC_STALL_S
    """Blocking seconds per asynchronous save."""
    interval_s: float | None = None
    """Checkpoint interval in seconds; None = Daly's optimum."""
    slowdown: float = DEFAULT_SLOWDOWN
    """Fraction of throughput lost while running (s)."""

    def __post_init__(self) -> None:
        checks = [("failure rate", self.failure_rate, 0.0, 1.0), ("planned interruptions per day",
                  self.planned_per_day, 0.0, 1e3), ("restart time", self.restart_s, 0.0, 30 * DAY),
                  ("async stall", self.async_stall_s, 0.0, DAY), ("slow-down", self.slowdown, 0.0, 0.999)]
        for name, v, lo, hi in checks:
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                raise PlannerError(f"goodput {name} {v!r} must be a number in [{lo:g}, {hi:g}].")
        if self.ckpt_mode not in CKPT_MODES:
            raise PlannerError(f"--ckpt-mode {self.ckpt_mode!r} is not one of {', '.join(CKPT_MODES)}.")
        for name, given in (("--ckpt-bandwidth", self.storage_gbs), ("--ckpt-interval", self.interval_s)):
            if given is not None and not (isinstance(given, (int, float)) and math.isfinite(given) and given > 0):
                raise PlannerError(f"{name} {given!r} must be a positive number.")

    def describe(self) -> str:
        """The inputs as the tools print them, with what the model leaves out."""
        save = (f"async saves blocking {self.async_stall_s:g} s" if self.ckpt_mode == "async" else
                f"sync saves at {self.storage_gbs:g} GB/s" if self.storage_gbs is not None else
                "sync saves at 0.122 GB/s per GPU of the job (Llama 3's 2 TB/s over 16,384 GPUs)")
        return (f"{self.failure_rate:.3g} unexpected interruptions per GPU-hour (default: Llama 3, GOODPUT_FACTS.md "
                f"F7), {self.planned_per_day:.2g} planned per day, restart {self.restart_s / 60:g} min, {save}, "
                f"checkpoint interval {'given' if self.interval_s else 'from Daly (2006)'}, slow-down "
                f"{100 * self.slowdown:g} %; not modelled: {NOT_MODELLED}")


@dataclass(frozen=True)
class Goodput:
    """The goodput of one allocation and what it implies."""

    goodput: float
    """Productive time / wall-clock time, 0..1 (0: the job fails faster than it restarts)."""
    ettr: float
    """Expected effective training time ratio before the running slow-down."""
    gpus: int
    mtbf_s: float
    """Mean time between unexpected interruptions of the whole job (M)."""
    checkpoint_bytes: float
    """Bytes per checkpoint (S)."""
    blocking_s: float
    """Seconds each checkpoint blocks training (δ)."""
    interval_s: float
    """Checkpoint interval (τ): Daly's optimum or the given one."""
    interval_given: bool
    restart_s: float
    unplanned_per_s: float
    """Unexpected interruptions per second (Λ)."""
    planned_per_s: float
    """Planned interruptions per second (Λ_p)."""

    def wall_s(self, ideal_s: float) -> float | None:
        """Expected wall-clock seconds of a run that a perfect one trains in ``ideal_s`` (None when G = 0)."""
        return ideal_s / self.goodput if self.goodput > 0 else None

    def interruptions(self, wall_s: float) -> tuple[float, float]:
        """Expected (unexpected, planned) interruptions over ``wall_s`` seconds."""
        return self.unplanned_per_s * wall_s, self.planned_per_s * wall_s

    def lost_gpu_hours(self, ideal_s: float) -> float | None:
        """GPU-hours spent on restarts, lost work, checkpoint stalls and slow-down (wall - ideal, all GPUs)."""
        wall = self.wall_s(ideal_s)
        return None if wall is None else (wall - ideal_s) * self.gpus / HOUR

    def interval_iterations(self, iteration_s: float) -> int:
        """The checkpoint interval in optimizer steps (at least 1)."""
        return max(1, int(round(self.interval_s / iteration_s)))


def checkpoint_bytes_per_param(dtype: str = "bf16", framework: str = "megatron") -> float:
    """Bytes per parameter in a training checkpoint (GOODPUT_FACTS.md §2.1): 14 for mixed precision with a
    distributed optimizer (bf16/fp16 weights 2 + fp32 master 4 + Adam m, v 8; BLOOM-176B's 2.3 TB), 12 where
    the parameters themselves are fp32 (torchtitan/FSDP2 keep fp32 sharded parameters, torchtitan
    docs/checkpoint.md; pure fp32 training): 4 + 8. Gradients are not saved."""
    if dtype == "fp32" or framework in ("fsdp", "torchtitan"):
        return 12.0
    return 14.0


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006) eq. 37: optimum compute time between checkpoints for blocking cost ``delta_s`` and mean time
    between failures ``mtbf_s`` (GOODPUT_FACTS.md §3.2)."""
    if delta_s <= 0:
        return 0.0
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young (1974), CACM 17(9): τ = √(2 δ M) (GOODPUT_FACTS.md §3.1)."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def ettr_closed_form(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float,
                     planned_per_s: float = 0.0) -> float:
    """Meta's expected ETTR (arXiv 2410.21680 §IV-E; GOODPUT_FACTS.md §3.4) with a planned-interruption term:
    (1 - (R + τ/2)/M - Λ_p R) / (1 + δ/τ), floored at 0."""
    if interval_s <= 0:
        return 0.0
    lost = (restart_s + interval_s / 2.0) / mtbf_s + planned_per_s * restart_s
    return max(0.0, (1.0 - lost) / (1.0 + delta_s / interval_s))


def ettr_exact(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """τ / (M e^{R/M} (e^{(τ+δ)/M} - 1)): Daly's expected wall time per unit of work for exponential failures
    (GOODPUT_FACTS.md §3.2, level S; it matches that file's Monte-Carlo column of §6.3 within 0.3 %)."""
    return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + delta_s) / mtbf_s))


def blocking_seconds(fm: FailureModel, checkpoint_bytes: float, gpus: int) -> float:
    """δ: seconds one checkpoint blocks training (sync: bytes / aggregate bandwidth; async: the stall)."""
    if fm.ckpt_mode == "async":
        return fm.async_stall_s
    bw = fm.storage_gbs if fm.storage_gbs is not None else DEFAULT_STORAGE_GBS_PER_GPU * gpus
    return checkpoint_bytes / (bw * 1e9)


def goodput(params: float, gpus: int, fm: FailureModel | None = None, *, dtype: str = "bf16",
            framework: str = "megatron") -> Goodput:
    """Goodput of a job training a model of ``params`` parameters on ``gpus`` GPUs (module docstring)."""
    fm = fm or FailureModel()
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise PlannerError(f"the GPU count must be a positive integer, got {gpus!r}.")
    unplanned = fm.failure_rate * gpus / HOUR
    planned = fm.planned_per_day / DAY
    size = checkpoint_bytes_per_param(dtype, framework) * params
    delta = blocking_seconds(fm, size, gpus)
    mtbf = 1.0 / unplanned if unplanned > 0 else math.inf
    if fm.interval_s is not None:
        tau = fm.interval_s
    elif math.isinf(mtbf):
        tau = math.inf
    else:
        tau = daly_interval(delta, mtbf)
    if math.isinf(mtbf):  # no unexpected failures: only planned restarts and (infinitely rare) saves
        ettr = max(0.0, 1.0 - planned * fm.restart_s) / (1.0 if math.isinf(tau) else 1.0 + delta / tau)
    else:
        ettr = ettr_closed_form(tau, delta, fm.restart_s, mtbf, planned)
    return Goodput(ettr * (1.0 - fm.slowdown), ettr, gpus, mtbf, size, delta, tau, fm.interval_s is not None,
                   fm.restart_s, unplanned, planned)


def perfect_run() -> FailureModel:
    """A failure model with no interruptions, no save stalls and no slow-down (G = 1): the perfect run."""
    return replace(FailureModel(), failure_rate=0.0, planned_per_day=0.0, slowdown=0.0, ckpt_mode="async",
                   async_stall_s=0.0)
