"""GPU-to-host figures for scripts/build_catalogue.py (``host_link_bw_gbs``, ``host_mem_bw_gbs`` in gpus.toml): what
optimizer and activation offloading move data over (costmodel.memory.offload).

Read from the shared gpus.yaml entry of each GPU: the NVLink-C2C figure of Grace superchips, else the PCIe link's
(the entry's per-direction figure where it gives one, its bidirectional figure halved, or the PCI-SIG line rate of
its generation); the host memory bandwidth where the entry gives the CPU's (``cpu_memory_bw_gbytes_s``).
"""

from __future__ import annotations

PCIE_X16_GBS = {"Gen4": 31.5, "Gen5": 63.0}
"""Per-direction bandwidth of a x16 PCIe link: 16 and 32 GT/s per lane x 16 lanes x 128b/130b encoding / 8 bits (PCI
Express Base Specification 4.0 / 5.0 line rates)."""

HOST_SOURCES = {
    "pcie_base_spec": {
        "what": "PCI-SIG, PCI Express Base Specification 4.0 (16 GT/s) and 5.0 (32 GT/s) per lane, 128b/130b "
                "encoding: a x16 link carries 31.5 / 63 GB/s per direction",
        "url": "https://pcisig.com/specifications",
    },
}


def host_figures(entry: dict, figs: dict, notes: list[str]) -> dict:
    """{"host_link_bw_gbs": ..., "host_mem_bw_gbs": ...} (where known) of a gpus.yaml ``entry``; the source ids go
    into ``figs``, how a figure was derived into ``notes``."""
    out = {}
    ids = list(entry.get("sources", []))
    if entry.get("nvlink_c2c_bw_gbytes_s_unidirectional") or entry.get("nvlink_c2c_bw_gbytes_s_bidirectional"):
        uni = entry.get("nvlink_c2c_bw_gbytes_s_unidirectional")
        out["host_link_bw_gbs"] = float(uni or entry["nvlink_c2c_bw_gbytes_s_bidirectional"] / 2)
        notes.append("host_link_bw_gbs: NVLink-C2C to the Grace CPU" + ("" if uni else ", DERIVED: bidirectional / 2")
                     + ".")
    elif entry.get("pcie_bw_gbytes_s_unidirectional") or entry.get("pcie_bw_gbytes_s_bidirectional"):
        uni = entry.get("pcie_bw_gbytes_s_unidirectional")
        out["host_link_bw_gbs"] = float(uni or entry["pcie_bw_gbytes_s_bidirectional"] / 2)
        notes.append("host_link_bw_gbs: PCIe to the host" + ("" if uni else ", DERIVED: bidirectional / 2") + ".")
    else:
        gen = next((g for g in PCIE_X16_GBS if str(entry.get("pcie", "")).startswith(f"{g} x16")), None)
        if gen:
            out["host_link_bw_gbs"] = PCIE_X16_GBS[gen]
            ids = ["pcie_base_spec"]
            notes.append(f"host_link_bw_gbs: DERIVED, the PCI-SIG line rate of its {gen} x16 host link.")
    if "host_link_bw_gbs" in out:
        figs["host_link_bw_gbs"] = ids
    if entry.get("cpu_memory_bw_gbytes_s"):
        out["host_mem_bw_gbs"] = float(entry["cpu_memory_bw_gbytes_s"])
        figs["host_mem_bw_gbs"] = list(entry.get("sources", []))
    return out
