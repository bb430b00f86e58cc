"""vidur (vidur/PROVENANCE.md): inference-layer compute profiles (TP-sharded) and DGX collectives."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets.importers.builder import Builder
from costmodel.fitting.datasets.importers.registry import register, source_root
from costmodel.fitting.datasets.importers.table import read_table
from costmodel.fitting.datasets.schema import Dataset
from costmodel.graph.kernel_basis import elementwise_role

VIDUR_COMPUTE_GPU = {"a100": "a100-80gb", "h100": "h100-sxm"}
VIDUR_NETWORK_GPU = {"a100_dgx": "a100-80gb", "h100_dgx": "h100-sxm"}
VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
VIDUR_STATS = ("min", "max", "mean", "median", "std")
VIDUR_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers")


def _vidur_header(ops: Sequence[str]) -> list[str]:
    return [f"time_stats.{op}.{s}" for op in ops for s in VIDUR_STATS] + list(VIDUR_SHAPE)


VIDUR_MLP_HEADERS = (_vidur_header(VIDUR_OPS),
                     _vidur_header([o for o in VIDUR_OPS if o != "post_attention_layernorm"]))
"""Sequential blocks (Llama-style) and parallel attention+MLP blocks (phi-2: no post-attention norm)."""


def _vidur_compute(b: Builder, data: Path, path: Path, gpu: str, fp: dict) -> None:
    t = read_table(data, path, VIDUR_MLP_HEADERS)
    gated_txt = t.text("use_gated_mlp")
    bad = ~np.isin(gated_txt, ("True", "False"))
    if bad.any():
        raise PlannerError(f"source file {t.rel} line {int(np.argmax(bad)) + 2}, column 'use_gated_mlp': "
                           f"{gated_txt[np.argmax(bad)]!r} is not True/False")
    gated = (gated_txt == "True").astype(float)
    tok, tp, emb = t.num("num_tokens"), t.num("num_tensor_parallel_workers"), t.num("n_embd")
    nh, nkv, ff = t.num("n_head"), t.num("n_kv_head"), t.num("n_expanded_embd")
    hd = emb / nh
    up = (1 + gated) * ff / tp
    # vidur's GPTBlock (profiling/mlp/mlp_impl.py) builds a post-attention norm only for norm = "rms_norm"
    # (RMSNorm: the Llama-family configs of vidur/config/model_config.py); blocks without one are phi-2's
    # parallel blocks with norm = "layer_norm" (torch.nn.LayerNorm).
    rms = 1 if "time_stats.post_attention_layernorm.median" in t else 0
    # per-GPU (TP-sharded) shapes as built by vidur/profiling/mlp/mlp_impl.py (ColumnParallel / RowParallel)
    mapping = {
        "emb": ("embedding", {"tokens": tok, "hidden": emb, "vocab": t.num("vocab_size") / tp}),
        "input_layernorm": ("norm", {"tokens": tok, "hidden": emb, "rms": rms}),
        "attn_pre_proj": ("gemm", {"m": tok, "n": (nh + 2 * nkv) * hd / tp, "k": emb}),
        "attn_rope": ("rope", {"tokens": tok, "heads": (nh + nkv) / tp, "head_dim": hd}),
        "attn_post_proj": ("gemm", {"m": tok, "n": emb, "k": nh * hd / tp}),
        "post_attention_layernorm": ("norm", {"tokens": tok, "hidden": emb, "rms": rms}),
        "mlp_up_proj": ("gemm", {"m": tok, "n": up, "k": emb}),
        "mlp_act": ("activation", {"tokens": tok, "width": up, "gated": gated}),
        "mlp_down_proj": ("gemm", {"m": tok, "n": emb, "k": ff / tp}),
        "add": ("residual_add", {"elements": tok * emb}),
    }
    sequential = "time_stats.post_attention_layernorm.median" in t
    for op, (kind, feats) in mapping.items():
        if f"time_stats.{op}.median" not in t:
            continue
        if op == "add" and not sequential:
            b.note([("residual_add", gpu)], f"{t.rel} 'add' not imported: parallel attention+MLP block, the "
                                            "timed add sums three tensors (mlp_impl.py)")
            continue
        role, why = elementwise_role(kind, "vidur")
        if why:
            b.note([(kind, gpu)], f"vidur {op} imported with role {role} (costmodel/graph/kernel_basis.py): {why}")
        b.add(t, kind, gpu, "fwd", "fp16", feats, t.num(f"time_stats.{op}.median") * 1e-3,
              spread_s=t.num(f"time_stats.{op}.std") * 1e-3, column=f"time_stats.{op}.median", fingerprint=fp,
              role=role)


def _vidur_network(b: Builder, data: Path, path: Path, gpu: str, fp: dict) -> None:
    op = path.stem
    t = read_table(data, path, ("", *(f"time_stats.{op}.{s}" for s in VIDUR_STATS), "rank", "num_workers", "size",
                                "collective", "devices_per_node", "max_devices_per_node"))
    coll = t.text("collective")
    if t.n and not np.all(coll == op):
        raise PlannerError(f"source file {t.rel}, column 'collective': {coll[np.argmax(coll != op)]!r} in a file "
                           f"named {op}.csv")
    ranks, rpn = t.num("num_workers"), t.num("devices_per_node")
    b.add(t, op, gpu, "fwd", "fp16", {"bytes": t.num("size"), "ranks": ranks, "nodes": ranks / rpn,
                                      "ranks_per_node": rpn},
          t.num(f"time_stats.{op}.median") * 1e-3, spread_s=t.num(f"time_stats.{op}.std") * 1e-3, repeats=3,
          column=f"time_stats.{op}.median", fingerprint=fp)
    if (t.num("num_workers") > t.num("devices_per_node")).any():
        b.note([(op, gpu)], f"{t.rel}: rows with nodes > 1 are kept, but PROVENANCE finds the inter-node "
                            "bandwidth low (~6 GB/s busbw, 2-node all-reduce) and the NIC setup unknown")


@register("vidur")
def import_vidur(data: Path) -> list[Dataset]:
    """vidur's inference-layer compute profiles (TP-sharded GEMMs, norms, ...) and DGX collectives."""
    b = Builder("vidur")
    root = source_root(data, "vidur")
    src = "github.com/microsoft/vidur @ 7d475133 (PROVENANCE.md)"
    for folder in sorted(p for p in (root / "compute").iterdir() if p.is_dir()):
        gpu = VIDUR_COMPUTE_GPU.get(folder.name)
        if gpu is None:
            continue
        fp = {"device": f"not stated (vidur folder '{folder.name}'; docs/profiling.md names "
                        + ("80GB A100 DGX and Azure NC96ads_A100_v4 PCIe" if folder.name == "a100"
                           else "H100 DGX and 80GB H100 NVL") + ")",
              "framework": "sarathi-serve layers, model.eval(), fp16, forward only",
              "timing": "CudaTimer (record_function), 2 warm-up + 20 active steps; median and std of the steps",
              "source": src}
        for path in sorted(folder.glob("*/*/mlp.csv")):
            _vidur_compute(b, data, path, gpu, fp)
        b.note([k for k in b.parts if k[1] == gpu],
               f"vidur compute/{folder.name} -> {gpu}: the exact SKU is not stated (PROVENANCE); shapes are per GPU "
               "(TP-sharded); every row is kept: the same per-GPU shape recurs across models and num_tokens values "
               "repeat within a file (duplicate_shape_rows), so fits must group by shape")
    skipped = []
    for folder in sorted(p for p in (root / "network").iterdir() if p.is_dir()):
        gpu = VIDUR_NETWORK_GPU.get(folder.name)
        if gpu is None:
            reason = ("4-GPU box with pairwise NVLink (PCIe A100 / H100 NVL), not a catalogue node"
                      if "pairwise_nvlink" in folder.name else "unknown topology")
            if folder.name == "h100_pairwise_nvlink":
                reason += "; its send_recv.csv is a byte-identical copy of the A100 file (PROVENANCE)"
            skipped.append(f"network/{folder.name} ({reason})")
            continue
        fp = {"device": ("A100 DGX, 8x A100 80GB" if folder.name == "a100_dgx" else "H100 DGX, 8x H100")
              + " (docs/profiling.md)",
              "timing": "torch Kineto profiler on kernels named nccl*: median over 11 launches, then min/max/mean/"
                        "median/std over 3 repeats; rank 0 only",
              "nccl_version": "not stated", "inter_node": "not described (PROVENANCE)", "source": src}
        for op in ("all_reduce", "send_recv"):
            path = folder / f"{op}.csv"
            if path.is_file():
                _vidur_network(b, data, path, gpu, fp)
    if skipped:
        b.note([k for k in b.parts if k[0] in ("all_reduce", "send_recv")],
               "vidur files not imported: " + "; ".join(skipped))
    return b.datasets()


