"""GPU memory capacity as the driver reports it, for scripts/build_catalogue.py (``hbm_mib`` in gpus.toml).

Every figure is nvidia-smi's ``memory.total`` in MiB, cited; a GPU without a cited figure gets none and a note.
"""

from __future__ import annotations

from catalogue_host import HOST_SOURCES, host_figures  # noqa: F401  (re-exported: the GPU-to-host figures)

# Capacity as the driver reports it (nvidia-smi memory.total, MiB): what fits_in_memory compares against. The
# marketed hbm_gb is decimal and rounded ("80 GB" A100 = 80 GiB = 85.9e9 bytes; "80 GB" H100 = 81,559 MiB).
# key -> (MiB, source ids). GPUs not listed keep hbm_gb x 1e9 bytes: no cited driver figure was found for them.
HBM_MIB = {
    "a100-40gb": (40960.0, ["modal_gpu_memory_blog", "modal_client_pr_2797"]),
    "a100-80gb": (81920.0, ["modal_gpu_memory_blog", "modal_client_pr_2797"]),
    "h100-sxm": (81559.0, ["modal_gpu_memory_blog", "modal_client_pr_2797", "nccl_issue_1264"]),
    "h200": (143155.0, ["stas00_netbench_h200"]),
    "b300": (275040.0, ["aic_system_b300_sxm"]),
    "gb300": (284208.0, ["aic_system_gb300"]),
}
HBM_MIB_NOTE = {
    "h200": "hbm_mib: 143,155 MiB per GPU in stas00's 8xH200 result header; Modal's NVML table lists 143,771 MiB "
            "(modal_gpu_memory_blog): the smaller figure is used.",
}
NO_HBM_MIB_NOTE = ("hbm_mib: no cited driver-reported capacity found; memory checks use hbm_gb x 1e9 bytes "
                   "(the vendor figure, UNCERTAIN as usable capacity).")

CAPACITY_SOURCES = {
    "modal_gpu_memory_blog": {
        "what": "Modal (C. Frye / J. Walsh), 'Why does an NVIDIA H100 80GB card offer 85.52 GB?': table of memory "
                "capacity as NVML / nvidia-smi reports it: H200 143,771 MiB; H100 80 GB 81,559 MiB (79.65 GiB); "
                "A100 80GB 81,920 MiB (80 GiB); A100 40GB 40,960 MiB (40 GiB)",
        "url": "https://thundergolfer.com/blog/nvidia-gpu-memory-capacity",
    },
    "modal_client_pr_2797": {
        "what": "modal-labs/modal-client PR #2797 (2025-01-23), totals reported by nvidia-smi: H100 81559MiB, A100 "
                "80GB 81920MiB, A100 40GB 40960MiB",
        "url": "https://github.com/modal-labs/modal-client/pull/2797",
    },
    "nccl_issue_1264": {
        "what": "NVIDIA/nccl issue #1264: nvidia-smi of an 8x H100 SXM server (driver 550.54.15), 'NVIDIA H100 80GB "
                "HBM3 ... 0MiB / 81559MiB'",
        "url": "https://github.com/NVIDIA/nccl/issues/1264",
    },
}


def hbm_mib_figure(key: str, figs: dict, notes: list[str]) -> dict:
    """{"hbm_mib": MiB} for a GPU with a cited driver-reported capacity (its source ids added to ``figs``), else
    {} with a note that the vendor GB figure stands in."""
    if key not in HBM_MIB:
        notes.append(NO_HBM_MIB_NOTE)
        return {}
    mib, ids = HBM_MIB[key]
    figs["hbm_mib"] = list(ids)
    if key in HBM_MIB_NOTE:
        notes.append(HBM_MIB_NOTE[key])
    return {"hbm_mib": mib}
