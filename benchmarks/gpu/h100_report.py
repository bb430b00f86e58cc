"""Tables and the validation-run file of reports/gpu-runs/h100-2026-11-27 from its raw measurement files.

    PLANNER_DATA_DIR=../shared/data .venv/bin/python benchmarks/gpu/h100_report.py \
        [--report reports/gpu-runs/h100-2026-11-27]

Reads ``<report>/raw/run1`` and ``raw/run2`` (written by benchmarks/gpu/measure_h100.py on the GPU) and, for the
comparisons, the public operator data under ``$PLANNER_DATA_DIR`` (aiconfigurator H100 GEMM / context-attention
tables, estimate-train-time A100 / GH200 samples). Writes

- ``<report>/h100_small_llama_runs.csv``: one row per measured training-step configuration in the schema of
  ``shared/validation/published_runs.csv`` (read it with ``planner validate --runs``);
- ``<report>/tables.md``: the tables ANALYSIS.md quotes (planner's predictions come from ``planner validate
  --runs <that file> --cv none --calibration default --format csv``, i.e. ``planner predict`` with its
  default calibration, run here as a subprocess).
Nothing here is fitted; every number is a measured value, a ratio of two measured values, or planner's output.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repository's costmodel package
from costmodel.core.fileio import atomic_write_text  # noqa: E402

SOURCE = ("planner GPU helper measurement: benchmarks/gpu/measure_h100.py on one NVIDIA H100 80GB HBM3 (SXM, 700 W), "
          "2026-11-27, reports/gpu-runs/h100-2026-11-27")
RUN_COLUMNS = ["id", "source", "model_name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab",
               "seq_len", "arch_notes", "gpu", "n_gpus", "gpus_per_node", "interconnect", "tp", "pp", "dp", "cp", "ep",
               "vp", "mbs", "gbs", "recompute", "seq_parallel", "dist_optimizer_or_zero", "precision", "framework",
               "measured_metric", "measured_value", "notes"]
ARCH = ("Llama arch (RMSNorm, RoPE, SwiGLU, {attn}), untied input/output embeddings; torchtitan models/llama3-style "
        "code (separate wq/wk/wv and w1/w3 linears, F.scaled_dot_product_attention causal) in "
        "benchmarks/gpu/h100_model.py")
PRECISION = "bf16 autocast (torch.autocast), fp32 master weights and fp32 AdamW states"
FRAMEWORKS = {
    "eager": "PyTorch 2.11 eager, torchtitan llama3-style model code, single GPU (no data parallelism)",
    "compile": "PyTorch 2.11 torch.compile per transformer block (torchtitan apply_compile style), torchtitan "
               "llama3-style model code, single GPU",
    "compile_reduce_overhead": "PyTorch 2.11 torch.compile(mode=reduce-overhead) of the whole model (inductor "
                               "kernels replayed as CUDA graphs), torchtitan llama3-style model code, single GPU",
    "graph": "PyTorch 2.11 eager kernels of the torchtitan llama3-style model captured as one CUDA graph per step "
             "(torch.cuda.graph), single GPU",
}


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x: str) -> float:
    return float(x) if x not in ("", None) else float("nan")


def run_rows(raw: Path) -> list[dict]:
    """The validation rows: run 1's eager grid and compiled rows, run 2's compiled rows and CUDA-graph steps."""
    steps = [(r, "run1") for r in read(raw / "run1" / "train_steps.csv")]
    steps += [(r, "run2") for r in read(raw / "run2" / "train_steps.csv")]
    models = {r["model"]: r for r, _ in steps if r["status"] == "ok"}
    out = []
    for r, run in steps:
        if r["status"] != "ok":
            continue
        out.append(_row(models[r["model"]], r["mode"], int(r["seq_len"]), int(r["mbs"]),
                        num(r["step_ms_median"]) / 1e3, _step_notes(r, run)))
    for g in read(raw / "run2" / "graph_steps.csv"):
        if g["status"] != "ok":
            continue
        notes = (f"TIER=C; not expressible in planner today (no CUDA-graph plan property): the same eager kernels as "
                 f"the eager rows, captured once (fwd+bwd+AdamW fused capturable, autocast cache off) and replayed; "
                 f"median of {g['n_timed']} replays (CUDA events) after 2; the eager step of the same configuration "
                 f"on the same machine took {num(g['eager_step_ms']):.2f} ms (CPU issue "
                 f"{num(g['eager_step_cpu_ms']):.2f} ms); peak {num(g['peak_mem_gib']):.1f} GiB; raw/run2/"
                 f"graph_steps.csv")
        out.append(_row(models[g["model"]], "graph", int(g["seq_len"]), int(g["mbs"]),
                        num(g["graph_step_ms"]) / 1e3, notes))
    for i, row in enumerate(out, 1):
        row["id"] = f"H100-PLANNER-2611-{i:03d}"
    return out


def _step_notes(r: dict, run: str) -> str:
    mode = r["mode"]
    tier = "TIER=A" if mode in ("eager", "compile") else "TIER=C"
    what = {"eager": "eager PyTorch (no torch.compile)",
            "compile": "torch.compile of each transformer block (default mode); embedding, final norm, output "
                       "layer, loss and AdamW uncompiled",
            "compile_reduce_overhead": "not expressible in planner today (no CUDA-graph plan property): "
                                       "whole-model torch.compile mode=reduce-overhead; loss and AdamW "
                                       "uncompiled"}[mode]
    text = (f"{tier}; {what}; step = forward + backward + AdamW(fused=True).step + zero_grad(set_to_none); "
            f"median of {r['n_timed']} steps after {r['n_warmup']} warm-ups, wall clock with a synchronize around "
            f"each step (min {num(r['step_ms_min']):.2f}, max {num(r['step_ms_max']):.2f} ms); CPU issue time "
            f"{num(r['step_cpu_ms_median']):.2f} ms of it; fwd+bwd alone {num(r['fwdbwd_ms_median']):.2f} ms; "
            f"AdamW step alone {num(r['opt_step_ms_median']):.2f} ms; peak allocated {num(r['peak_mem_gib']):.1f} "
            f"GiB; gbs = mbs (one micro-batch per step, no gradient accumulation); raw/{run}/train_steps.csv")
    if mode.startswith("compile") and r["compile_s"]:
        text += f"; compile time (first step minus a median step) {num(r['compile_s']):.1f} s"
    return text


def _row(m: dict, mode: str, seq: int, mbs: int, step_s: float, notes: str) -> dict:
    kv, heads = int(m["n_kv_heads"]), int(m["n_heads"])
    attn = f"GQA {kv} KV heads" if kv != heads else "MHA"
    return dict(source=SOURCE, model_name=m["model"], n_layers=m["n_layers"], hidden=m["hidden"], n_heads=heads,
                n_kv_heads=kv, ffn_hidden=m["ffn_hidden"], vocab=m["vocab"], seq_len=seq, arch_notes=ARCH.format(
                    attn=attn), gpu="H100 80GB HBM3 SXM", n_gpus=1, gpus_per_node=1,
                interconnect="none (one GPU)", tp=1, pp=1, dp=1, cp=1, ep="", vp="", mbs=mbs, gbs=mbs,
                recompute="none", seq_parallel="n", dist_optimizer_or_zero="none", precision=PRECISION,
                framework=FRAMEWORKS[mode], measured_metric="iteration_time_s", measured_value=f"{step_s:.6g}",
                notes=notes)


def write_runs(rows: list[dict], path: Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RUN_COLUMNS)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def planner_predictions(runs: Path) -> dict[str, dict]:
    """``planner validate --runs RUNS --cv none --calibration default --format csv`` (what ``planner predict``
    gives for each row), by run id."""
    exe = Path(sys.executable).parent / "planner"
    proc = subprocess.run([str(exe), "validate", "--runs", str(runs), "--cv", "none", "--calibration", "default",
                           "--format", "csv"],
                          capture_output=True, text=True, check=True)
    return {r["id"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}


def md(header: list[str], rows: list[list]) -> str:
    def cell(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def train_tables(raw: Path, runs: list[dict], preds: dict[str, dict]) -> str:
    by_key = {(r["model_name"], r["seq_len"], r["mbs"], _mode(r["framework"])): r for r in runs}
    out = ["## Training steps (eager grid, run 1; compiled rows, runs 1-2)\n",
           "step = fwd + bwd + AdamW(fused) step + zero_grad, median wall ms; CPU = time until the CPU had issued "
           "the whole step; planner = `planner predict` (default calibration, framework torchtitan-eager for eager "
           "rows, torchtitan for compiled rows), error = (planner - measured) / measured.\n"]
    rows = []
    steps = [(r, "run1") for r in read(raw / "run1" / "train_steps.csv")]
    steps += [(r, "run2") for r in read(raw / "run2" / "train_steps.csv")]
    for r, run in steps:
        if r["status"] != "ok":
            rows.append([run, r["model"], r["mode"], r["seq_len"], r["mbs"], r["status"], "", "", "", "", "", "", "",
                         ""])
            continue
        run_row = by_key[(r["model"], int(r["seq_len"]), int(r["mbs"]), r["mode"])]
        p = preds.get(run_row["id"], {})
        pred_ms = num(p.get("predicted [unit]", "")) * 1e3
        rows.append([run, r["model"], r["mode"], r["seq_len"], r["mbs"], num(r["step_ms_median"]),
                     num(r["step_cpu_ms_median"]), num(r["fwdbwd_ms_median"]), num(r["opt_step_ms_median"]),
                     round(num(r["tokens_per_s"])), num(r["mfu_pct_989"]), num(r["peak_mem_gib"]), pred_ms,
                     f"{num(p.get('error [%]', '')):+.0f} %"])
    out.append(md(["run", "model", "mode", "seq", "mbs", "step ms", "CPU ms", "fwd+bwd ms", "AdamW ms", "tokens/s",
                   "MFU % (989)", "peak GiB", "planner ms", "planner error"], rows))
    grows = []
    for g in read(raw / "run2" / "graph_steps.csv"):
        if g["status"] != "ok":
            continue
        run_row = by_key[(g["model"], int(g["seq_len"]), int(g["mbs"]), "graph")]
        p = preds.get(run_row["id"], {})
        grows.append([g["model"], g["seq_len"], g["mbs"], num(g["eager_step_ms"]), num(g["eager_step_cpu_ms"]),
                      num(g["graph_step_ms"]), num(g["eager_over_graph"]), num(p.get("predicted [unit]", "")) * 1e3,
                      f"{num(p.get('error [%]', '')):+.0f} %"])
    out.append("\n## The same eager step as one CUDA graph (run 2)\n\nplanner error is against the graph time.\n")
    out.append(md(["model", "seq", "mbs", "eager ms", "eager CPU ms", "graph ms", "eager/graph", "planner ms",
                   "planner error"], grows))
    return "\n".join(out)


def _mode(framework: str) -> str:
    return next(k for k, v in FRAMEWORKS.items() if v == framework)


def overhead_table(raw: Path) -> str:
    r1 = {r["item"]: r for r in read(raw / "run1" / "overheads.csv")}
    r2 = {r["item"]: r for r in read(raw / "run2" / "overheads.csv")}
    rows = [[k, num(r1.get(k, {}).get("per_kernel_us", "")), num(r2[k]["per_kernel_us"]), r2[k]["notes"]]
            for k in r2]
    return "## Per-kernel overheads (us)\n\n" + md(["item", "run 1", "run 2", "what"], rows)


def elementwise_tables(raw: Path) -> str:
    ew = [r for r in read(raw / "run1" / "elementwise.csv") if not r["op"].startswith("ett_")]
    t: dict[tuple, float] = {}
    for r in ew:
        t[(r["op"], r["impl"], int(r["T"]), int(r["h"]), r["pass"])] = num(r["gpu_ms"])
    pairs = [("rmsnorm", "eager_torchtitan", "compiled"), ("rmsnorm", "eager_ett_neox", "compiled"),
             ("rmsnorm", "F.rms_norm", "compiled"), ("swiglu", "eager", "compiled"),
             ("rope", "eager_rotate_half", "compiled_rotate_half"),
             ("rope", "eager_complex_torchtitan", "compiled_rotate_half"),
             ("cross_entropy", "eager_float_torchtitan", "compiled"), ("cross_entropy", "eager_bf16", "compiled")]
    rows = []
    for op, eager, fused in pairs:
        for ps in ("fwd", "bwd"):
            ratios = [t[(o, i, T, h, p)] / t[(o, fused, T, h, p)] for (o, i, T, h, p) in t
                      if o == op and i == eager and p == ps and (o, fused, T, h, p) in t]
            if ratios:
                rows.append([op, eager, fused, ps, len(ratios), statistics.median(ratios), min(ratios), max(ratios)])
    gb = {}
    for r in ew:
        if r["gpu_GBps"]:
            gb.setdefault((r["op"], r["impl"], r["pass"]), []).append(num(r["gpu_GBps"]))
    grows = [[o, i, p, len(v), statistics.median(v), min(v), max(v)] for (o, i, p), v in sorted(gb.items())]
    return ("## Element-wise: eager / fused GPU-time ratio (same shapes; gpu_ms, launch gaps hidden)\n\n"
            + md(["op", "eager impl", "fused impl", "pass", "shapes", "median ratio", "min", "max"], rows)
            + "\n## Element-wise: achieved GB/s (minimum bytes read + written / gpu_ms), over shapes\n\n"
            + md(["op", "impl", "pass", "shapes", "median GB/s", "min", "max"], grows))


def ett_table(raw: Path, data: Path) -> str:
    ett = data / "estimate-train-time"
    files = {"ett_RMSlayernorm": ("RMSlayernorm", ["b", "l", "dim"]),
             "ett_RoPE": ("RoPE", ["mp", "b", "h", "l", "dim"]), "ett_res_add": ("res_add", ["b", "l", "dim"]),
             "ett_gelu": ("gelu", ["mp", "b", "l", "dim"]), "ett_layernorm": ("layernorm", ["b", "l", "dim"])}
    rows = []
    for r in read(raw / "run1" / "elementwise.csv"):
        if not r["op"].startswith("ett_"):
            continue
        name, cols = files[r["op"]]
        key = tuple(int(kv.split("=")[1]) for kv in r["source_shape"].split(","))
        ref = {}
        for gpu, folder, prefix in (("A100", "Perlmutter", "NVIDIAA100-SXM4-80GB"),
                                    ("GH200", "Vista", "NVIDIAGH200120GB")):
            for s in read(ett / folder / "operator" / f"{prefix}_{name}_fp16.csv"):
                if tuple(int(float(s[c])) for c in cols) == key:
                    ref[gpu] = num(s["F_dur(us)"] if r["pass"] == "fwd" else s["B_dur(us)"]) / 1e3
        h100 = num(r["gpu_ms"])
        rows.append([name, r["source_shape"], r["pass"], h100, ref.get("GH200", float("nan")),
                     ref.get("A100", float("nan")), ref.get("GH200", float("nan")) / h100,
                     ref.get("A100", float("nan")) / h100])
    return ("## estimate-train-time's own fp16 programs on H100 vs its GH200 (Vista) and A100 (Perlmutter) samples\n\n"
            "ms; H100 = gpu_ms (kernel span, launch gaps hidden), the samples are profiler kernel spans. res_add "
            "samples have B = F (a copy, PROVENANCE).\n\n"
            + md(["op", "shape", "pass", "H100 ms", "GH200 ms", "A100 ms", "GH200/H100", "A100/H100"], rows))


def gemm_table(raw: Path, data: Path) -> str:
    aic = data / "aiconfigurator" / "gemm"
    ref = {}
    for dt, f in (("bf16", "h100_sxm_bf16_gemm__trtllm-1.3.0rc20.csv"),
                  ("fp8_e4m3_per_tensor", "h100_sxm_fp8_gemm__trtllm-1.3.0rc20.csv")):
        for s in read(aic / f):
            ref[(dt, int(s["m"]), int(s["n"]), int(s["k"]))] = num(s["latency_ms"])
    rows = []
    for r in read(raw / "run1" / "gemm.csv"):
        if not r["graph_ms"]:
            continue
        key = (r["dtype"], int(r["m"]), int(r["n"]), int(r["k"]))
        a = ref.get(key, float("nan"))
        g, e = num(r["graph_ms"]), num(r["eager_ms"])
        rows.append([r["dtype"], *key[1:], g * 1e3, e * 1e3, a * 1e3, g / a, e / a, num(r["graph_tflops"])])
    return ("## GEMM y = x W^T vs aiconfigurator H100 (TRT-LLM 1.3.0rc20, CUDA-graph replay), same (m, n, k)\n\n"
            "us per GEMM; graph = CUDA-graph replay with weights cycled (aiconfigurator's method), eager = "
            "back-to-back F.linear calls. aiconfigurator's fp8 includes the dynamic activation quantization; ours "
            "does not (static per-tensor scales).\n\n"
            + md(["dtype", "m", "n", "k", "graph us", "eager us", "aiconfigurator us", "graph/aic", "eager/aic",
                  "graph TFLOP/s"], rows))


def attention_table(raw: Path, data: Path) -> str:
    ref = {}
    for s in read(data / "aiconfigurator" / "context_attention" / "h100_sxm_bf16_context_attention__sglang-0.5.14.csv"):
        if s["kernel_source"] == "fa3":
            ref[tuple(int(s[c]) for c in ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"))] = \
                num(s["latency_ms"])
    att = read(raw / "run1" / "attention.csv")
    by = {(r["backend"], r["batch"], r["seq"], r["heads"], r["kv_heads"], r["head_dim"]): r for r in att
          if r["status"] == "ok"}
    rows = []
    for (be, b, s, h, kv, d), r in by.items():
        if be != "default":
            continue
        key = tuple(int(x) for x in (b, s, h, kv, d))
        fl = by.get(("flash", b, s, h, kv, d), {})
        a = ref.get(key, float("nan"))
        fwd, fb = num(r["fwd_ms"]), num(r["fwdbwd_ms"])
        rows.append([*key, fwd, num(fl.get("fwd_ms", "")), a, fwd / a, num(fl.get("fwd_ms", "")) / a, fb, fb / fwd,
                     num(r["fwd_tflops_causal"])])
    return ("## Causal attention forward vs aiconfigurator H100 (SGLang 0.5.14 fa3, prefill), same shapes\n\n"
            "ms; default = F.scaled_dot_product_attention's default backend (cuDNN on this H100, see "
            "raw/run1/attention.csv notes), flash = SDPBackend.FLASH_ATTENTION (FlashAttention-2).\n\n"
            + md(["batch", "seq", "heads", "kv", "head_dim", "default fwd", "flash fwd", "aic fa3 fwd",
                  "default/aic", "flash/aic", "default fwd+bwd", "(fwd+bwd)/fwd", "default fwd TFLOP/s"], rows))


def optimizer_table(raw: Path) -> str:
    rows = [[r["model"], r["params"], r["param_tensors"], r["impl"], num(r["step_ms_median"]),
             num(r["GBps_28B_per_param"])] for r in read(raw / "run1" / "optimizer.csv")]
    return "## AdamW step (fp32 params, grads, states)\n\n" + md(
        ["model", "params", "tensors", "impl", "ms", "GB/s at 28 B/param"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", type=Path, default=ROOT / "reports" / "gpu-runs" / "h100-2026-11-27")
    a = ap.parse_args()
    data = Path(os.environ.get("PLANNER_DATA_DIR", ROOT.parent / "shared" / "data"))
    raw = a.report / "raw"
    runs = run_rows(raw)
    runs_path = a.report / "h100_small_llama_runs.csv"
    write_runs(runs, runs_path)
    preds = planner_predictions(runs_path)
    parts = ["# Tables of reports/gpu-runs/h100-2026-11-27 (generated by benchmarks/gpu/h100_report.py)\n",
             train_tables(raw, runs, preds), overhead_table(raw), elementwise_tables(raw), ett_table(raw, data),
             gemm_table(raw, data), attention_table(raw, data), optimizer_table(raw)]
    atomic_write_text(a.report / "tables.md", "\n\n".join(parts))
    print(f"wrote {runs_path} ({len(runs)} runs) and {a.report / 'tables.md'}")


if __name__ == "__main__":
    main()
