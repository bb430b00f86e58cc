"""Quad-GH200 NVLink node types (JUPITER Booster, CSCS Alps, Isambard-AI) and the H800, for
scripts/build_catalogue.py (merged into its tables by :func:`merge_gh200`).

Most GH200 systems are not TACC Vista's one-GPU nodes: the HPE Cray EX254n and Eviden BullSequana XH3515 blades
put four GH200 in one node, each GPU joined to the other three by NVLink 4 and each with its own network card.
JSC documents the links: "NVLink 4 GPU-to-GPU links, 300 GB/s between pairs of GPUs (150 GB/s per direction)",
"Network: 4x InfiniBand NDR200" (jsc_jupiter). The intra-node figure used is per GPU and per direction over its
three peers, 3 x 150 = 450 GB/s (DERIVED; the same convention as Perlmutter's 4-GPU NVLink mesh, whose NCCL rings
use every link). CSCS documents "four Grace-Hopper modules and four corresponding network interface cards (NICs)"
per Alps node (cscs_alps_hardware) and Isambard-AI's EX254n nodes carry 4x GH200 and 4x Slingshot-11 200G NICs
(glennklockwood_isambard_ai); their NVLink figures are not printed and are COMPARABLE to JUPITER's (the same
quad-GH200 design), flagged UNCERTAIN. NIC: NDR200 and Slingshot-11 both run 200 Gb/s per GPU = 25 GB/s
(DERIVED 200/8; Slingshot-11 at 200 Gb/s: stas00_net's 'HPE Slingshot 4x200 = 100 GBps' per Perlmutter node).
Intra-node latency: no quad-GH200 NCCL measurement; COMPARABLE aiconfigurator H100 SXM 4-GPU (same NVLink 4).

H800 SXM: "built on the Hopper architecture, similar to the H100 GPU. However, it features reduced FP64
computational performance and NVLink bandwidth ... reduced from 900 GB/s to 400 GB/s ... each node is equipped
with eight 400G Infiniband (IB) CX7 NICs" (deepseek_isca_h800). Dense bf16/fp16/fp8/tf32 peaks, HBM and power are
the H100 SXM's (DERIVED: the same GH100 with the same tensor cores and HBM, not printed for the H800); NVLink 400 /
2 = 200 GB/s per direction.
"""

from __future__ import annotations

_JSC, _CSCS, _ISAMBARD, _DS = "jsc_jupiter", "cscs_alps_hardware", "glennklockwood_isambard_ai", "deepseek_isca_h800"
_H100_SXM = dict(peak_tflops={"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7}, hbm_gb=80.0,
                 hbm_bw_gbs=3350.0, tdp_w=700.0)
"""gpus.toml h100-sxm figures (nv_hopper_whitepaper_v104, nv_h100_product_page) the H800 shares."""

_QUAD_NOTE = ("intra_node_bw_gbs: per GPU and direction over its three NVLink 4 peers, 3 x 150 GB/s (DERIVED; NCCL "
              "rings use every link of the 4-GPU mesh). inter_node_bw_gbs: 200 Gb/s per GPU / 8 (DERIVED). "
              "intra_node_latency_us: COMPARABLE aiconfigurator H100 SXM 4-GPU (same NVLink 4 generation). "
              "nvlink_mesh: the four GPUs are wired pairwise (150 GB/s per direction per pair), no NVSwitch: a "
              "2-GPU group has one pair link (DERIVED).")

GH200_CLUSTERS = {
    "jupiter-booster": dict(
        src_gpn=[_JSC], yaml_id=None, display_name="JSC JUPITER Booster node (4x GH200 96 GB, NVLink 4 mesh, "
                                                   "4x NDR200)",
        gpu="gh200", intra=None, inter=None, lat=("h100_sxm", 4, True),
        network="InfiniBand NDR200 (ConnectX-7), 1 per GH200, Dragonfly+", src_intra=[_JSC], src_inter=[_JSC],
        notes="JSC JUPITER configuration page: 4x GH200 per node, 96 GB HBM3 at 4 TB/s, 680 W per superchip, NVLink "
              "4 GPU-to-GPU 150 GB/s per direction per pair, 4x InfiniBand NDR200. " + _QUAD_NOTE),
    "alps-gh200": dict(
        src_gpn=[_CSCS], yaml_id=None, display_name="CSCS Alps GH200 node (4x GH200, NVLink 4 mesh, "
                                                    "4x Slingshot-11)",
        gpu="gh200", intra=None, inter=None, lat=("h100_sxm", 4, True),
        network="HPE Slingshot-11, 4 NICs per node (1 per GH200), 200 Gb/s each", src_intra=[_JSC],
        src_inter=[_CSCS, "stas00_net"],
        notes="CSCS Alps hardware page: 2,688 nodes of four Grace-Hopper modules and four NICs (HPE Cray EX). "
              "intra_node_bw_gbs: UNCERTAIN for Alps, COMPARABLE JUPITER's quad-GH200 NVLink 4 mesh (not printed "
              "by CSCS). HBM per GPU not printed by CSCS: gh200 (96 GB) assumed, UNCERTAIN. " + _QUAD_NOTE),
    "isambard-ai": dict(
        src_gpn=[_ISAMBARD], yaml_id=None, display_name="Isambard-AI node (HPE Cray EX254n, 4x GH200, "
                                                        "4x Slingshot-11)",
        gpu="gh200", intra=None, inter=None, lat=("h100_sxm", 4, True),
        network="HPE Slingshot-11 200G, 4 NICs per node", src_intra=[_JSC], src_inter=[_ISAMBARD],
        notes="Isambard-AI: Cray EX254n blades, two nodes per blade, each 4x GH200 and 4x Slingshot-11 NICs "
              "(glennklockwood_isambard_ai, after the CUG 2024 paper). intra_node_bw_gbs: UNCERTAIN, COMPARABLE "
              "JUPITER's quad-GH200 NVLink 4 mesh. HBM per GPU not printed there: gh200 (96 GB) assumed, "
              "UNCERTAIN. " + _QUAD_NOTE),
    "hgx-h800": dict(
        src_gpn=[_DS], yaml_id=None, display_name="H800 SXM node (8x H800, NVLink 400 GB/s, 8x 400G IB)",
        gpu="h800", intra=None, inter=None, lat=("h100_sxm", 8, True),
        network="InfiniBand 400 Gb/s, 8x ConnectX-7 (1 per GPU)", src_intra=[_DS], src_inter=[_DS],
        notes="DeepSeek-AI ISCA 2025 sec. 4.1 (DeepSeek-V3's cluster): 8 H800 SXM per node over NVLink / NVSwitch at "
              "400 GB/s (200 per direction, DERIVED), eight 400G IB CX7 NICs per node (50 GB/s per GPU, DERIVED). "
              "Their V3 report measures about 160 GB/s over NVLink in practice. intra_node_latency_us: COMPARABLE "
              "aiconfigurator H100 SXM 8-GPU."),
}
GH200_GIVEN = {"jupiter-booster": dict(gpus_per_node=4, nvlink_domain=4, intra=450.0, inter=25.0, mesh=4),
               "alps-gh200": dict(gpus_per_node=4, nvlink_domain=4, intra=450.0, inter=25.0, mesh=4),
               "isambard-ai": dict(gpus_per_node=4, nvlink_domain=4, intra=450.0, inter=25.0, mesh=4),
               "hgx-h800": dict(gpus_per_node=8, nvlink_domain=8, intra=200.0, inter=50.0)}

H800 = {
    "h800": (
        dict(**_H100_SXM, nvlink_bw_gbs=200.0),
        {**{f"peak_tflops.{d}": ["nv_hopper_whitepaper_v104", _DS] for d in ("bf16", "fp16", "fp8", "tf32")},
         "hbm_gb": ["nv_h100_product_page", _DS], "hbm_bw_gbs": ["nv_h100_product_page", _DS],
         "nvlink_bw_gbs": [_DS], "tdp_w": ["nv_h100_product_page"]},
        "not in gpus.yaml. The H100 SXM's GH100 with NVLink cut to 400 GB/s bidirectional (200 per direction) and "
        "FP64 reduced (deepseek_isca_h800). peak_tflops, hbm_gb, hbm_bw_gbs, tdp_w: DERIVED, the H100 SXM's (the "
        "same tensor cores and HBM; not printed for the H800, UNCERTAIN). No fp32 figure (FP64/FP32 cut, not "
        "stated)."),
}

GH200_SOURCES = {
    _CSCS: {"what": "eth-cscs/cscs-docs docs/alps/hardware.md (commit 1690357c): Alps is an HPE Cray EX system; "
                    "2,688 GH200 nodes; 'Each node contains four Grace-Hopper modules and four corresponding network "
                    "interface cards (NICs)'",
            "url": "https://github.com/eth-cscs/cscs-docs/blob/1690357c10f4e05dab9e8654a6d4bae1466c1910/docs/alps/"
                   "hardware.md"},
    _ISAMBARD: {"what": "Glenn K. Lockwood, 'Isambard-AI' system page: Cray EX254n blades, 2 nodes per blade, each "
                        "node 4x GH200 superchips and 4x Slingshot-11 NICs; 200G Slingshot interconnect (after "
                        "McIntosh-Smith et al., CUG 2024)",
                "url": "https://glennklockwood.com/garden/systems/Isambard-AI"},
    _DS: {"what": "DeepSeek-AI, 'Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware for AI "
                  "Architectures', ISCA 2025, arXiv:2505.09343, sec. 4.1: 'the NVLink bandwidth in H800 SXM nodes is "
                  "reduced from 900 GB/s to 400 GB/s ... each node is equipped with eight 400G Infiniband (IB) CX7 "
                  "NICs'; the H800 is 'built on the Hopper architecture, similar to the H100 GPU' with reduced FP64",
          "url": "https://arxiv.org/abs/2505.09343"},
}


def merge_gh200(ns: dict) -> None:
    """Add the quad-GH200 node types and the H800 to build_catalogue's tables (its module namespace ``ns``); GH200's
    default node type becomes JUPITER's quad node (most GH200 systems are quad nodes; Vista stays a node type)."""
    ns["EXTRA_GPUS"].update(H800)
    ns["DISPLAY_NAMES"]["h800"] = "NVIDIA H800 SXM5 80GB (H100 with 400 GB/s NVLink)"
    ns["DEFAULT_CLUSTER"].update({"h800": "hgx-h800", "gh200": "jupiter-booster"})
    ns["CLUSTERS"].update(GH200_CLUSTERS)
    ns["GIVEN_FIGURES"].update(GH200_GIVEN)
    ns["EXTRA_SOURCES"].update(GH200_SOURCES)
    ns["VARIANT_UNFITTED"]["h800"] = ("measured_data: false: operators are costed from h100-sxm's measurements "
                                      "scaled per operator (costmodel/cost/basis.py); collectives on its own NVLink "
                                      "figure by the alpha-beta model.")
