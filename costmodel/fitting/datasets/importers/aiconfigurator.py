"""aiconfigurator (aiconfigurator/PROVENANCE.md): GEMM, context attention and single-node NCCL sweeps."""

from __future__ import annotations

import json
import re
from pathlib import Path

from costmodel.core.errors import PlannerError
from costmodel.fitting.datasets import filters as F
from costmodel.fitting.datasets.importers.builder import Builder
from costmodel.fitting.datasets.importers.registry import register, source_root
from costmodel.fitting.datasets.importers.table import read_table
from costmodel.fitting.datasets.schema import Dataset

AIC_GPU = {"a100_sxm": "a100-80gb", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200",
           "b300_sxm": "b300", "gb300": "gb300"}
"""aiconfigurator system -> catalogue GPU (device strings in PROVENANCE 'Measured on')."""
AIC_DEVICE = {"a100_sxm": "NVIDIA A100-SXM4-80GB", "h100_sxm": "NVIDIA H100 80GB HBM3", "h200_sxm": "NVIDIA H200",
              "b200_sxm": "NVIDIA B200", "gb200": "NVIDIA GB200", "b300_sxm": "NVIDIA B300 SXM6 AC",
              "gb300": "NVIDIA GB300"}
AIC_NOT_CATALOGUE: tuple[str, ...] = ()
"""aiconfigurator systems without a catalogue GPU (none since the Blackwell Ultra parts b300 / gb300 joined it)."""
AIC_NCCL_OPS = {"all_gather": "all_gather", "all_reduce": "all_reduce", "alltoall": "all_to_all",
                "reduce_scatter": "reduce_scatter"}
_AIC_FILE = re.compile(r"^(?P<system>[a-z0-9_]+?)_(?P<what>bf16_gemm|fp8_block_gemm|fp8_gemm|"
                       r"bf16_context_attention|nccl_fp16)__(?P<version>.+)\.csv$")
AIC_TIMING = {
    "gemm": "benchmark_with_power: CUDA-graph replay, 3 warm-ups + 6 runs, average ms per GEMM; small weights "
            "cycled so they do not sit in L2 (collector/trtllm/collect_gemm.py)",
    "context_attention": "SGLang RadixAttention layer call (KV-cache store + FMHA, no RoPE), 3 warm-ups + 20 runs",
    "nccl": "nccl-tests out-of-place time: <op>_perf -d half -w 40 -n 100|60, one process with num_gpus threads",
}


def _aic_fingerprint(data: Path, rel_in_aic: str, system: str, folder: str) -> dict:
    fp = {"device": AIC_DEVICE[system], "timing": AIC_TIMING[folder],
          "source": "github.com/ai-dynamo/aiconfigurator @ 095f58a5 (PROVENANCE.md)"}
    manifest = data / "aiconfigurator" / "manifest.json"
    if manifest.is_file():
        try:
            entries = {e["file"]: e for e in json.loads(manifest.read_text(encoding="utf-8"))}
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PlannerError(f"aiconfigurator/manifest.json is not the documented list of file entries ({exc}); "
                               "restore it from its source") from None
        cc = entries.get(rel_in_aic, {}).get("constant_columns", {})
        if cc.get("device", fp["device"]) != fp["device"]:
            raise PlannerError(f"aiconfigurator/manifest.json gives device {cc['device']!r} for {rel_in_aic}, but its "
                               f"PROVENANCE.md says {fp['device']!r}; check which GPU measured it")
        for k in ("framework", "version", "kernel_source"):
            if k in cc:
                fp[k] = cc[k]
    if folder == "nccl":
        fp["nccl_version"] = rel_in_aic.rsplit("nccl-", 1)[-1].removesuffix(".csv")
    return fp




@register("aiconfigurator")
def import_aiconfigurator(data: Path) -> list[Dataset]:
    """GEMM (bf16, per-tensor fp8), context attention (causal fwd) and single-node NCCL sweeps."""
    b = Builder("aiconfigurator")
    root = source_root(data, "aiconfigurator")
    skipped: dict[str, list[str]] = {"gemm": [], "context_attention": [], "nccl": []}
    for folder in ("gemm", "context_attention", "nccl"):
        for path in sorted((root / folder).glob("*.csv")):
            m = _AIC_FILE.match(path.name)
            if m is None:
                skipped[folder].append(f"{path.name} (unrecognised name)")
                continue
            system, what = m["system"], m["what"]
            if system not in AIC_GPU:
                reason = "not a catalogue GPU" if system in AIC_NOT_CATALOGUE else "unknown system"
                skipped[folder].append(f"{path.name} ({reason})")
                continue
            if what == "fp8_block_gemm":
                skipped[folder].append(f"{path.name} (block-scaled FP8: not the per-tensor fp8 the planner models)")
                continue
            gpu = AIC_GPU[system]
            fp = _aic_fingerprint(data, f"{folder}/{path.name}", system, folder)
            if folder == "gemm":
                dtype = "bf16" if what == "bf16_gemm" else "fp8"
                t = read_table(data, path, ("m", "n", "k", "latency_ms"))
                b.add(t, "gemm", gpu, "fwd", dtype, {"m": t.num("m"), "n": t.num("n"), "k": t.num("k")},
                      t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp)
                b.note([("gemm", gpu)], "aiconfigurator GEMMs are y = x·Wᵀ (NT layout), no bias, forward only; "
                                        "training's dgrad/wgrad use other layouts (aiconfigurator PROVENANCE caveats)")
                if dtype == "fp8":
                    b.note([("gemm", gpu)], "aiconfigurator fp8 = per-tensor FP8; its latency includes the dynamic "
                                            "quantization of x inside the timed call (PROVENANCE 'Which FP8 is which')")
            elif folder == "context_attention":
                t = read_table(data, path, ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
                                            "head_dim", "latency_ms"))
                keep, dropped = F.filter_aic_default_attention_kernel(t, system)
                isl = t.num("isl")
                b.add(t, "attention_fwd", gpu, "fwd", "bf16",
                      {"batch": t.num("batch_size"), "seq_q": isl, "seq_kv": isl, "heads": t.num("num_heads"),
                       "kv_heads": t.num("num_key_value_heads"), "head_dim": t.num("head_dim"), "causal": 1},
                      t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp, repeats=20,
                      filters=[("filter_aic_default_attention_kernel", keep, dropped)])
                b.note([("attention_fwd", gpu)], "aiconfigurator attention is inference prefill: causal forward only, "
                                                 "no prefix; the timed op includes the KV-cache store (PROVENANCE)")
            else:
                t = read_table(data, path, ("op_name", "num_gpus", "message_size", "latency_ms"))
                ops = t.text("op_name")
                unknown = sorted(set(ops) - set(AIC_NCCL_OPS))
                if unknown:
                    raise PlannerError(f"source file {t.rel}, column 'op_name': unknown operation {unknown[0]!r}; "
                                       f"expected one of {', '.join(AIC_NCCL_OPS)}")
                ranks = t.num("num_gpus")
                for raw, kind in AIC_NCCL_OPS.items():
                    sel = ops == raw
                    b.add(t, kind, gpu, "fwd", "fp16",
                          {"bytes": 2 * t.num("message_size"), "ranks": ranks, "nodes": 1, "ranks_per_node": ranks},
                          t.num("latency_ms") * 1e-3, column="latency_ms", fingerprint=fp,
                          select=(f"op_name == {raw}", sel))
                    b.note([(kind, gpu)], "aiconfigurator NCCL: single node only (num_gpus 2/4/8; GB200: one 4-GPU "
                                          "tray); bytes = 2·message_size, the nccl-tests buffer (PROVENANCE nccl/)")
    for folder, names in skipped.items():
        if names:
            kinds = {"gemm": ["gemm"], "context_attention": ["attention_fwd"],
                     "nccl": list(AIC_NCCL_OPS.values())}[folder]
            b.note([(k, g) for k in kinds for g in AIC_GPU.values()],
                   f"aiconfigurator/{folder} files not imported: {'; '.join(names)}")
    b.note([(k, g) for k in AIC_NCCL_OPS.values() for g in AIC_GPU.values()],
           "aiconfigurator/multinode not imported: MoE dispatch/combine (DeepEP, TRT-LLM all-to-all) and a TRT-LLM "
           "custom all-reduce on GB300 are not NCCL collectives with our features")
    return b.datasets()


