"""GPU variants and node types of published runs that shared/data/hardware does not list, for
scripts/build_catalogue.py (merged into its tables by :func:`merge_variants`).

h100-sxm-500w / grand-teton: the H100 of torchtitan's Dec-2024 benchmarks (Meta Grand Teton hosts), "96GB HBM2e
with 2.4 TB/sec" at a 500 W power limit, "between SXM and NVL in peak". Its peaks are DERIVED from the H100
SXM datasheet peaks (gpus.yaml h100_sxm_80gb) x (500/700)^(1/3): the CMOS dynamic power P = C V^2 f with the
voltage following the clock under DVFS (P ~ f^3) at the power cap (Hennessy & Patterson, Computer
Architecture, sec. 1.5). 989.4 x 0.894 = 884.6 TFLOP/s bf16 lies between NVL (835) and SXM (989), as the source
says. Its operators are costed from h100-sxm's measurements scaled per operator (costmodel/cost/basis.py).
"""

from __future__ import annotations

POWER_CAP_SCALE = (500.0 / 700.0) ** (1.0 / 3.0)
"""Clock (and peak) ratio of an H100 SXM capped at 500 W to its 700 W TDP under P ~ f^3."""
_H100_SXM_PEAKS = {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}
"""gpus.toml h100-sxm peak_tflops (nv_hopper_whitepaper_v104), the base of the derived peaks."""
_TT = "torchtitan_h100_benchmarks"

VARIANT_GPUS = {
    "h100-sxm-500w": (
        dict(peak_tflops={d: round(v * POWER_CAP_SCALE, 1) for d, v in _H100_SXM_PEAKS.items()}, hbm_gb=96.0,
             hbm_bw_gbs=2400.0, nvlink_bw_gbs=450.0, tdp_w=500.0),
        {**{f"peak_tflops.{d}": ["nv_hopper_whitepaper_v104", _TT] for d in _H100_SXM_PEAKS},
         "hbm_gb": [_TT], "hbm_bw_gbs": [_TT, "pytorch_ao_roofline"], "nvlink_bw_gbs": ["nv_h100_product_page"],
         "tdp_w": [_TT]},
        "not in gpus.yaml; the H100 of torchtitan's Dec-2024 benchmarks (Meta Grand Teton), 96 GB HBM2e at 2.4 TB/s, "
        "500 W power limit. peak_tflops: DERIVED, H100 SXM datasheet peaks x (500/700)^(1/3) = 0.894 (P ~ f^3 at "
        "the power cap, scripts/catalogue_variants.py); 884.6 TF bf16 lies between NVL (835) and SXM (989) as the "
        "source says. nvlink_bw_gbs: the H100 SXM figure (same NVSwitch baseboard generation, COMPARABLE)."),
}
VARIANT_DISPLAY = {"h100-sxm-500w": "NVIDIA H100 SXM5 96GB HBM2e at a 500 W power cap (Meta Grand Teton)"}
VARIANT_DEFAULT_CLUSTER = {"h100-sxm-500w": "grand-teton"}
VARIANT_UNFITTED = {"h100-sxm-500w": "measured_data: false: operators are costed from h100-sxm's measurements "
                                     "scaled per operator by the roofline ratio (costmodel/cost/basis.py)."}
VARIANT_CLUSTERS = {
    "grand-teton": dict(
        src_gpn=[_TT], yaml_id=None, display_name="Meta Grand Teton (8x H100 96GB HBM2e at 500 W, NVSwitch)",
        gpu="h100-sxm-500w", intra=None, inter=None, lat=("h100_sxm", 8, True),
        network="400 Gb/s RDMA per GPU (torchtitan benchmarks)", src_intra=["nv_hgx_h100_blog"], src_inter=[_TT],
        notes="torchtitan benchmarks: 8 H100 per host over NVLink, 400 Gb/s RDMA per GPU (inter_node_bw_gbs DERIVED "
              "400/8). intra_node_bw_gbs: COMPARABLE dgx-h100 (the same NVSwitch H100 baseboard generation)."),
}
VARIANT_GIVEN = {"grand-teton": dict(gpus_per_node=8, nvlink_domain=8, intra=450.0, inter=50.0)}
VARIANT_SOURCES = {
    _TT: {
        "what": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit b5bcd76c): Grand Teton hosts, "
                "8x H100 '96GB HBM2e with 2.4 TB/sec', 500 W power limit, 'between SXM and NVL in peak', 400 Gb/s "
                "RDMA per GPU (also quoted in shared/data/torchtitan-e2e/PROVENANCE.md)",
        "url": "https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/benchmarks/"
               "llama3_h100_202412_torchtitan.md",
    },
}


def merge_variants(ns: dict) -> None:
    """Add the variants to build_catalogue's tables (its module namespace ``ns``)."""
    ns["EXTRA_GPUS"].update(VARIANT_GPUS)
    ns["DISPLAY_NAMES"].update(VARIANT_DISPLAY)
    ns["DEFAULT_CLUSTER"].update(VARIANT_DEFAULT_CLUSTER)
    ns["CLUSTERS"].update(VARIANT_CLUSTERS)
    ns["GIVEN_FIGURES"].update(VARIANT_GIVEN)
    ns["EXTRA_SOURCES"].update(VARIANT_SOURCES)
    from catalogue_gh200 import merge_gh200  # deferred: a sibling script, importable once build_catalogue set sys.path
    merge_gh200(ns)  # quad-GH200 node types and the H800
