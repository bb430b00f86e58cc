"""estimate-train-time (estimate-train-time/PROVENANCE.md): Perlmutter (A100) and Vista (GH200) operators and NCCL."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets import filters as F
from costmodel.fitting.datasets.importers.builder import Builder
from costmodel.fitting.datasets.importers.registry import register, source_root
from costmodel.fitting.datasets.importers.table import read_table
from costmodel.fitting.datasets.schema import Dataset
from costmodel.graph.kernel_basis import ett_operator_role

ETT_SYSTEMS = {"Perlmutter": ("NVIDIAA100-SXM4-80GB", "a100-80gb"), "Vista": ("NVIDIAGH200120GB", "gh200")}
"""system -> (GPU string in the file names, catalogue GPU)."""
ETT_VOCAB = 50257
"""GPT-2 vocabulary of every estimate-train-time vocab operator (PROVENANCE; target_functions.py)."""
ETT_VOCAB_DIVISIBLE_BY = 128
"""Megatron make-vocab-size-divisible-by used by the sampler: per-rank vocab = ceil(V / (128·mp))·128
(Kernel_sampling/target_functions.py: linear_final, embedding, parallel_cross_entropy_128)."""
ETT_TIMING = ("torch.profiler: GPU span from the first to the last CUDA kernel of the forward (backward) op, "
              "kernel time incl. gaps, excluding CPU overhead; wait 2, warmup 2, active 10; torch.rand fp16 inputs")
ETT_SOFTWARE = "not recorded (PROVENANCE: no driver, CUDA, PyTorch, NCCL, flash-attn or DeepSpeed versions)"
ETT_LINEAR = {  # (n, k) of the forward GEMM per PROVENANCE's operator table; m = l·b
    "linear1": (lambda mp, dim: 3 * dim / mp, lambda mp, dim: dim),
    "linear2": (lambda mp, dim: dim, lambda mp, dim: dim / mp),
    "linear3": (lambda mp, dim: 4 * dim / mp, lambda mp, dim: dim),
    "linear4": (lambda mp, dim: dim, lambda mp, dim: 4 * dim / mp),
    "linear_final": (lambda mp, dim: ett_partition_vocab(mp), lambda mp, dim: dim),
}
_ETT_UNFUSED = "unfused attention pieces (the planner models fused flash attention)"
_ETT_STAGE = ("whole pipeline-stage fwd+bwd+FusedAdam timings, not single operators (Vista's firstStage also has "
              "outliers up to ~54 s, PROVENANCE caveats)")
_ETT_NOT_MEASURED = "the authors' regressor hyper-parameters, not measurements"
ETT_SKIPPED_OPERATORS = {"baddbmm": _ETT_UNFUSED, "bmm": _ETT_UNFUSED, "fillmask": _ETT_UNFUSED,
                         "softmax": _ETT_UNFUSED, "ScaledUpperTriangMaskedSoftmax": _ETT_UNFUSED,
                         "firstStage_optimizer": _ETT_STAGE,
                         "middleStage_optimizer": _ETT_STAGE, "lastStage_optimizer": _ETT_STAGE}
_ETT_NCCL = re.compile(r"^(?P<dev>[A-Za-z0-9-]+)_(?P<op>allreduce|allreduce_large|allgather_large|p2p)_fp16_"
                       r"(?P<nodes>\d+)_(?P<gpn>\d+)\.csv$")
ETT_KINDS = {"flash_atten": ("attention_fwd", "attention_bwd"), "RMSlayernorm": ("norm",), "RoPE": ("rope",),
             "parallel_cross_entropy_128": ("cross_entropy",), "layernorm": ("norm",), "gelu": ("activation",),
             "res_add": ("residual_add",), "optimizer": ("optimizer",)}
"""Operator kinds of the estimate-train-time files whose basis costmodel.graph.kernel_basis may set aside."""
ETT_NCCL_KINDS = {"allreduce": "all_reduce", "allreduce_large": "all_reduce", "allgather_large": "all_gather",
                  "p2p": "send_recv"}


def ett_partition_vocab(mp):
    """Per-rank padded vocabulary of the estimate-train-time sampler: ceil(50257 / (128·mp))·128."""
    mp = np.asarray(mp, dtype=float)
    return np.ceil(ETT_VOCAB / (ETT_VOCAB_DIVISIBLE_BY * mp)) * ETT_VOCAB_DIVISIBLE_BY


def _ett_operator(b: Builder, data: Path, path: Path, op: str, system: str, gpu: str, fp: dict) -> None:
    fb = ("F_dur(us)", "B_dur(us)")
    us = 1e-6
    role, why = ett_operator_role(op, gpu)
    if why:
        b.note([(k, gpu) for k in ETT_KINDS.get(op, ())], f"estimate-train-time {op} imported with role {role} "
                                                          f"(costmodel/graph/kernel_basis.py): {why}")

    def both(t, kind, feats, bwd_filter=None, bwd_role="train"):
        b.add(t, kind, gpu, "fwd", "fp16", feats, t.num(fb[0]) * us, column=fb[0], fingerprint=fp, role=role)
        filters = [] if bwd_filter is None else [(bwd_filter.__name__, *bwd_filter(t))]
        b.add(t, kind, gpu, "bwd", "fp16", feats, t.num(fb[1]) * us, column=fb[1], fingerprint=fp,
              role=role if role != "train" else bwd_role, filters=filters)

    if op in ETT_LINEAR:
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        mp, dim = t.num("mp"), t.num("dim")
        n_of, k_of = ETT_LINEAR[op]
        both(t, "gemm", {"m": t.num("l") * t.num("b"), "n": n_of(mp, dim), "k": k_of(mp, dim)},
             bwd_role="composite_bwd")
    elif op == "flash_atten":
        t = read_table(data, path, ("mp", "b", "h", "l", "dim", *fb))
        heads, seq = t.num("h") / t.num("mp"), t.num("l")
        feats = {"batch": t.num("b"), "seq_q": seq, "seq_kv": seq, "heads": heads, "kv_heads": heads,
                 "head_dim": t.num("dim") / t.num("h"), "causal": 0}
        b.add(t, "attention_fwd", gpu, "fwd", "fp16", feats, t.num(fb[0]) * us, column=fb[0], fingerprint=fp,
              role=role)
        filters = ([("filter_ett_vista_flash_atten_backward", *F.filter_ett_vista_flash_atten_backward(t))]
                   if system == "Vista" else [])
        b.add(t, "attention_bwd", gpu, "bwd", "fp16", feats, t.num(fb[1]) * us, column=fb[1], fingerprint=fp,
              filters=filters, role=role)
        b.note([("attention_fwd", gpu), ("attention_bwd", gpu)],
               "estimate-train-time flash_atten: flash_attn_func(Q, K, V) non-causal, heads h/mp, head_dim dim/h")
    elif op in ("layernorm", "RMSlayernorm"):
        t = read_table(data, path, ("b", "l", "dim", *fb))
        both(t, "norm", {"tokens": t.num("b") * t.num("l"), "hidden": t.num("dim"),
                         "rms": 1 if op == "RMSlayernorm" else 0})
        b.note([("norm", gpu)], "estimate-train-time norm rows come from two kernels told apart by the rms feature: "
                                "torch LayerNorm (layernorm, rms = 0) and Megatron RMSNorm (RMSlayernorm, rms = 1)")
    elif op == "gelu":
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        both(t, "activation", {"tokens": t.num("b") * t.num("l"), "width": 4 * t.num("dim") / t.num("mp"),
                               "gated": 0})
    elif op == "res_add":
        t = read_table(data, path, ("b", "l", "dim", *fb))
        both(t, "residual_add", {"elements": t.num("b") * t.num("l") * t.num("dim")},
             bwd_filter=F.filter_ett_res_add_backward)
    elif op == "RoPE":
        t = read_table(data, path, ("mp", "b", "h", "l", "dim", *fb))
        both(t, "rope", {"tokens": t.num("b") * t.num("l"), "heads": 2 * t.num("h") / t.num("mp"),
                         "head_dim": t.num("dim") / t.num("h")})
        b.note([("rope", gpu)], "estimate-train-time RoPE rotates q and k, each h/mp heads: heads feature = 2·h/mp "
                                "(the graph's heads + kv_heads); the span includes the cos/sin table")
    elif op == "embedding":
        t = read_table(data, path, ("mp", "b", "l", "dim", *fb))
        both(t, "embedding", {"tokens": t.num("b") * t.num("l"), "hidden": t.num("dim"),
                              "vocab": ett_partition_vocab(t.num("mp"))})
    elif op == "parallel_cross_entropy_128":
        t = read_table(data, path, ("mp", "b", "l", *fb))
        both(t, "cross_entropy", {"tokens": t.num("b") * t.num("l"), "vocab": ett_partition_vocab(t.num("mp"))})
        b.note([("cross_entropy", gpu)], "estimate-train-time parallel_cross_entropy_128: Megatron vocab-parallel CE "
                                         "on fp16 logits [b, l, ceil(50257/(128·mp))·128]; '128' = the vocabulary "
                                         "padding multiple (target_functions.py)")
    elif op == "optimizer":
        t = read_table(data, path, ("num_layers", "hidden_size", "param_tensors", "params", "dur"))
        b.add(t, "optimizer", gpu, "fwd", "fp16", {"params": t.num("params")}, t.num("dur") * us, column="dur",
              fingerprint=fp, role=role)
        b.note([("optimizer", gpu)], "estimate-train-time optimizer: column 'dur' taken as µs, as PROVENANCE "
                                     "assumes; DeepSpeed FusedAdam step over 'params' parameters. Time is not "
                                     "monotone in params (it also varies with num_layers/param_tensors, not features "
                                     "here); the efficiency fit did not use this file (costmodel/data/PROVENANCE.md)")
    else:
        raise AssertionError(op)
    if op in ETT_LINEAR:
        _ett_gemm_notes(b, op, gpu)


def _ett_gemm_notes(b: Builder, op: str, gpu: str) -> None:
    b.note([("gemm", gpu)], "estimate-train-time GEMM rows: nn.Linear fp16 (linear1 with bias); a 'bwd' row is "
                            "dgrad + wgrad of the forward (m, n, k) together (role composite_bwd, or other_basis "
                            "with the forward rows): use it to check backward-as-GEMMs (fit.gemm_checks), not as "
                            "one GEMM")
    if op == "linear_final":
        b.note([("gemm", gpu)], "estimate-train-time linear_final: n = per-rank padded vocab "
                                "ceil(50257/(128·mp))·128 (target_functions.py)")


@register("estimate-train-time")
def import_estimate_train_time(data: Path) -> list[Dataset]:
    """The seed paper's Perlmutter (A100) and Vista (GH200) operator and NCCL samples."""
    b = Builder("estimate-train-time")
    root = source_root(data, "estimate-train-time")
    ops = {"linear1", "linear2", "linear3", "linear4", "linear_final", "flash_atten", "layernorm", "RMSlayernorm",
           "gelu", "res_add", "RoPE", "embedding", "parallel_cross_entropy_128", "optimizer"}
    for system, (dev, gpu) in ETT_SYSTEMS.items():
        base = {"device": dev, "system": system, "software": ETT_SOFTWARE,
                "source": "github.com/DebarghaG/estimate-train-time @ 1ac4d5e4 (PROVENANCE.md)"}
        skipped: dict[str, list[str]] = {}
        for path in sorted((root / system / "operator").glob("*.csv")):
            m = re.match(rf"^{re.escape(dev)}_(?P<op>[A-Za-z0-9_]+)_fp16\.csv$", path.name)
            if path.name == f"{dev}__best_model_config.csv":
                skipped.setdefault(_ETT_NOT_MEASURED, []).append(f"operator/{path.name}")
            elif m and m["op"] in ops:
                _ett_operator(b, data, path, m["op"], system, gpu, {**base, "timing": ETT_TIMING})
            elif m and m["op"] in ETT_SKIPPED_OPERATORS:
                skipped.setdefault(ETT_SKIPPED_OPERATORS[m["op"]], []).append(m["op"])
            else:
                skipped.setdefault("unrecognised", []).append(f"operator/{path.name}")
        for path in sorted((root / system / "nccl").glob("*.csv")):
            m = _ETT_NCCL.match(path.name)
            if path.name == f"{dev}__best_model_config.csv":
                skipped.setdefault(_ETT_NOT_MEASURED, []).append(f"nccl/{path.name}")
                continue
            if m is None or m["dev"] != dev:
                skipped.setdefault("unrecognised", []).append(f"nccl/{path.name}")
                continue
            t = read_table(data, path, ("shape", "nodes", "GPUsPerNode", "dur(us)"))
            nodes, gpn = t.num("nodes"), t.num("GPUsPerNode")
            if t.n and not (np.all(nodes == int(m["nodes"])) and np.all(gpn == int(m["gpn"]))):
                col = "nodes" if not np.all(nodes == int(m["nodes"])) else "GPUsPerNode"
                raise PlannerError(f"source file {t.rel}, column {col!r}: values differ from the file name's "
                                   f"_<nodes>_<GPUsPerNode> suffix; restore the file from its source")
            kind = ETT_NCCL_KINDS[m["op"]]
            ranks = nodes * gpn
            filters = []
            if system == "Perlmutter":
                filters.append(("filter_ett_perlmutter_inter_node", *F.filter_ett_perlmutter_inter_node(t)))
            if system == "Vista" and kind == "all_gather":
                filters.append(("filter_ett_vista_allgather_large_4_8_nodes",
                                *F.filter_ett_vista_allgather_large_4_8_nodes(t)))
            # shape = fp16 elements of the tensor passed to torch.distributed; all_gather's is the per-rank input,
            # so its nccl-tests buffer (the full output) is 2·shape·ranks bytes (PROVENANCE nccl/).
            nbytes = 2 * t.num("shape") * (ranks if kind == "all_gather" else 1)
            fp = {**base, "timing": "GPU kernel span of the c10d::<op>_ call (torch.profiler)"}
            b.add(t, kind, gpu, "fwd", "fp16", {"bytes": nbytes, "ranks": ranks, "nodes": nodes,
                                                "ranks_per_node": gpn},
                  t.num("dur(us)") * 1e-6, column="dur(us)", fingerprint=fp, filters=filters)
            b.note([(kind, gpu)], "estimate-train-time NCCL sizes start at 2M-20M elements: no small-message regime")
        for reason, names in skipped.items():
            b.note([k for k in b.parts if k[1] == gpu],
                   f"estimate-train-time/{system} not imported, {reason}: {', '.join(names)}")
    b.note(list(b.parts), "estimate-train-time/reference_predictions not imported: the authors' predictions, "
                          "not measurements")
    b.note([("all_reduce", "gh200"), ("all_gather", "gh200"), ("send_recv", "gh200")],
           "Vista (GH200): 1 GPU per node, every collective crosses InfiniBand")
    return b.datasets()


