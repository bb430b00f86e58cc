"""Filters for the broken subsets that the shared data's PROVENANCE.md files name.

Every filter takes a table (column name -> numpy array, one entry per source row; numeric columns as
floats) and returns ``(keep, dropped)``: a boolean mask of the rows to keep and how many rows it drops.
Each docstring quotes the PROVENANCE line that justifies it. The importers
(:mod:`costmodel.fitting.datasets.importers`) apply them; the efficiency fit (:mod:`costmodel.fitting.efficiency`) fits
from the imported datasets, so they apply there too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np


class Table(Protocol):
    """What a filter reads: columns by name (a mapping of arrays, or the importers' checked source table)."""

    def __getitem__(self, name: str) -> np.ndarray: ...

    def values(self) -> Iterable[np.ndarray]: ...

# SGLang's default attention backend per aiconfigurator system (aiconfigurator/PROVENANCE.md,
# context_attention/: A100 has only `flash_attention`; H100/H200 `fa3` is the default (13,703 rows) and
# `triton` (578) is pinned for particular models; Blackwell: "`trtllm_mha` = SGLang's default SM100/103 backend").
AIC_DEFAULT_ATTENTION_KERNEL = {"a100_sxm": "flash_attention", "h100_sxm": "fa3", "h200_sxm": "fa3",
                                "b200_sxm": "trtllm_mha", "gb200": "trtllm_mha", "b300_sxm": "trtllm_mha",
                                "gb300": "trtllm_mha"}


def _n(t: Table) -> int:
    return len(next(iter(t.values()))) if t else 0


def _result(keep: np.ndarray) -> tuple[np.ndarray, int]:
    keep = np.asarray(keep, dtype=bool)
    return keep, int((~keep).sum())


def filter_ett_perlmutter_inter_node(t: Table) -> tuple[np.ndarray, int]:
    """Drop Perlmutter collectives that span more than one node (column ``nodes`` > 1).

    estimate-train-time/PROVENANCE.md: "**Perlmutter inter-node collectives are ~100× below Slingshot
    line rate** (algbw ≈ 1.2 GB/s for 2 nodes × 1 GPU all-reduce; p2p 2 nodes ≈ 3 GB/s) ... This
    suggests the sampling ran without the Slingshot OFI plugin (socket transport)".
    """
    return _result(np.asarray(t["nodes"]) == 1)


def filter_ett_vista_allgather_large_4_8_nodes(t: Table) -> tuple[np.ndarray, int]:
    """Drop Vista all-gather rows at 4 and 8 nodes.

    estimate-train-time/PROVENANCE.md: "**Vista `allgather_large` at 4 and 8 nodes** has impossible
    values (algbw up to ~9,800 GB/s); treat as invalid."
    """
    return _result(~np.isin(np.asarray(t["nodes"]), (4, 8)))


def filter_ett_vista_flash_atten_backward(t: Table) -> tuple[np.ndarray, int]:
    """Drop every Vista flash-attention backward time (the whole ``B_dur(us)`` column is unusable).

    estimate-train-time/PROVENANCE.md: "**Vista (GH200) `flash_atten` B_dur is broken**: backward is
    *smaller* than forward in 97 % of rows (median B/F = 0.11, implying >7 PFLOP/s). Use only its F_dur."
    """
    return _result(np.zeros(_n(t), dtype=bool))


def filter_ett_res_add_backward(t: Table) -> tuple[np.ndarray, int]:
    """Drop every res_add backward time.

    estimate-train-time/PROVENANCE.md: "`res_add` | b,l,dim | residual add (**B_dur is just a copy of F_dur**)".
    """
    return _result(np.zeros(_n(t), dtype=bool))


def filter_aic_default_attention_kernel(t: Table, system: str) -> tuple[np.ndarray, int]:
    """Keep the default SGLang attention backend of the system (one row per shape).

    aiconfigurator/PROVENANCE.md: "**A shape can appear twice** with different `kernel_source` ...
    filter on `kernel_source` (use `trtllm_mha` for the default path)." For A100 the only kernel is
    `flash_attention`; for H100/H200 `fa3` (13,703 rows) is the default and `triton` (578) is pinned
    for particular models.
    """
    return _result(np.asarray(t["kernel_source"]) == AIC_DEFAULT_ATTENTION_KERNEL[system])


FILTERS = {f.__name__: f for f in (filter_ett_perlmutter_inter_node, filter_ett_vista_allgather_large_4_8_nodes,
                                   filter_ett_vista_flash_atten_backward, filter_ett_res_add_backward,
                                   filter_aic_default_attention_kernel)}
"""Every filter by name (the names recorded in dataset sidecars)."""
