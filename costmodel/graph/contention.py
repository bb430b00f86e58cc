"""What an overlapped collective costs the compute it hides under: the HBM traffic it moves at the same time.

A collective that runs concurrently with a layer's kernels (ZeRO-3 / FSDP parameter gathers and gradient
reduce-scatters, the CP KV ring, overlapped MoE dispatch) is not free for that compute: NCCL stores what it
receives in HBM and reads it back to forward it, and reads or writes the user buffers as well, so every byte it
sends over the links is about ``NCCL_HBM_PASSES`` bytes of HBM traffic, competing with the kernels it overlaps
(S. Jeaugey, NVIDIA NCCL maintainer, NVIDIA/nccl issue #1428, 2024-09-06: compute kernels that overlap an
all-gather run longer, "very likely, they're competing for memory bandwidth ... 300GB/s needs to be multiplied by
at least 2x for memory bandwidth, as we need to store to memory, then read back from it. If you add reading from
or writing to user data, it can be 3x").

The overlapped collectives of a layer get one HBM-pass operator per phase (costmodel.graph.opbuild.hbm_pass, costed
at the GPU's achieved HBM bandwidth), with that many bytes: the layer's compute grows by it, and the collective
stays exposed only beyond the grown compute (costmodel.schedule.compose.layer_and_stage_times), so a communication-bound
layer absorbs it. A lower bound of the interference: the SMs NCCL's kernels occupy while they run are not
charged.
"""

from __future__ import annotations

from costmodel.graph.conventions import busbw_factor_one
from costmodel.graph.opbuild import HBM_PASS, hbm_pass
from costmodel.graph.ops import Op

NCCL_HBM_PASSES = 3.0
"""HBM bytes per byte a collective sends over the links, for collectives that read and write user buffers (all
of FSDP's and the CP ring's): NVIDIA/nccl issue #1428 (module docstring)."""

CONTENTION = "contention."
HBM_PASS_PREFIX = HBM_PASS + CONTENTION
"""Operator-name prefix of these HBM passes (costmodel.graph.opbuild.HBM_PASS + ``contention.``)."""


def contention_ops(overlap: list[Op], dtype: str) -> list[Op]:
    """The HBM traffic of the overlapped collectives ``overlap``, one HBM-pass operator per phase they run in:
    ``NCCL_HBM_PASSES`` x their link bytes (each collective's times its count), charged to the layer compute they
    overlap."""
    per_phase: dict = {}
    for op in overlap:
        # bytes one GPU sends over the links (nccl-tests bus-bandwidth convention)
        nbytes = NCCL_HBM_PASSES * busbw_factor_one(op.kind, float(op.features[1])) * op.bytes * op.count
        if nbytes > 0:
            per_phase[op.phase] = per_phase.get(op.phase, 0.0) + nbytes
    return [hbm_pass(f"{CONTENTION}{phase.value}", phase, nbytes, dtype) for phase, nbytes in per_phase.items()]
