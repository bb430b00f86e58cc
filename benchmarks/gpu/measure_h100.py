"""Measure the kernel bases and small-model training steps that planner's cost model needs, on one CUDA GPU.

What it measures (bf16 unless stated), in the order it runs them; every section writes its CSV rows as soon as
they are measured, so a run stopped at its time limit still leaves what it measured:

1. ``overheads.csv``   per-launch cost of a trivial kernel in eager PyTorch (CPU dispatch + launch), the same
                       kernels captured in one CUDA graph and replayed, graph-launch cost, synchronize round trip.
2. ``train_steps.csv`` ground truth: full training steps (forward + backward + AdamW(fused=True) step +
                       zero_grad) of Llama-architecture decoders (~125M, ~370M, TinyLlama-1.1B) at sequence
                       lengths 1024/2048/4096 and micro-batches 1/2/4/8 in eager PyTorch (OOM recorded), the
                       forward+backward alone, and the optimizer step alone; then torch.compile (per-block, as
                       torchtitan does) for a few configurations, with the compile time separately.
                       The model follows torchtitan's models/llama3 code (separate wq/wk/wv and w1/w3 linears,
                       RMSNorm x.float()-pow-mean-rsqrt-type_as-weight, complex RoPE, repeat_kv GQA,
                       F.scaled_dot_product_attention causal, untied output, cross_entropy(pred.float())).
                       Precision: fp32 parameters (= master weights) and fp32 AdamW states, forward and loss under
                       torch.autocast(bfloat16) (GEMMs in bf16, the residual stream stays fp32 because the fp32
                       embedding output starts it), which is what torchtitan runs on one GPU without FSDP.
3. ``gemm.csv``        F.linear (y = x W^T, x [m,k], W [n,k]) bf16, and fp8 e4m3 through torch._scaled_mm with
                       per-tensor scales, at shapes of aiconfigurator's H100 GEMM grid; each timed as CUDA-graph
                       replay with the weights cycled so they do not sit in L2 (aiconfigurator's method) and as
                       back-to-back eager calls.
4. ``attention.csv``   F.scaled_dot_product_attention causal forward and forward+backward for each SDPA backend
                       (flash, cuDNN, efficient; default), at shapes of aiconfigurator's H100 context-attention
                       grid, and the kernel names the default backend launches.
5. ``optimizer.csv``   AdamW step over the parameter shapes of the 125M and 1.1B models: fused, foreach, for-loop.
6. ``elementwise.csv`` element-wise operators eager vs fused at training shapes (tokens x hidden): RMSNorm
                       (estimate-train-time's GPT-NeoX implementation, torchtitan's eager one, F.rms_norm,
                       torch.compile), SwiGLU, RoPE (rotate-half, complex, compiled), residual add, cross-entropy;
                       forward and backward separately, time and achieved GB/s; plus estimate-train-time's own
                       fp16 implementations at shapes present in its A100 / GH200 sample files.
   Every element-wise row has ``gpu_ms`` (a long sleep kernel is queued first so the CPU has launched every
   kernel before the GPU reaches them: kernel span without launch gaps, comparable to estimate-train-time's
   profiler spans) and ``eager_ms`` (no such prefill: what eager code pays when the CPU is the bottleneck).
7. ``graph_steps.csv`` the eager training step of a few configurations timed as eager code and as one captured CUDA
                       graph (torch.cuda.graph over forward + backward + AdamW(fused, capturable)): the same kernels
                       without the CPU's dispatch and launch time (section ``graphstep``).
8. ``train_steps.csv`` rows of mode ``compile`` at another configuration and ``compile_reduce_overhead``
                       (whole-model torch.compile(mode="reduce-overhead"): inductor kernels replayed as CUDA graphs)
                       (section ``compile2``).
``env.json`` records the GPU, SM count, L2, memory, clocks, driver, host CPU (lscpu), torch/CUDA/cuDNN/Triton
versions and the two ceilings (device-to-device copy GB/s, 8192^3 bf16 matmul TFLOP/s). ``log.txt`` is the log.
The code is split over this file and its sibling modules ``h100_*.py`` (shared helpers, model, training sections,
kernel sections, element-wise section); run this file.

Run (one GPU; the default budget runs every section in ~6 minutes on an H100; sections 7-8 need ~3.5 more):
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu/measure_h100.py --out OUTDIR --budget-s 330
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu/measure_h100.py --out OUTDIR2 --budget-s 230 \
        --only overheads,graphstep,compile2
(the two commands of reports/gpu-runs/h100-2026-11-27, whose PROVENANCE.md gives the machine and versions).
``--budget-s`` is the wall-clock budget of the whole script: each section starts only if its reserve is left and
stops early when the budget is spent, in priority order (training steps first). ``--smoke`` runs every section at
tiny sizes (on the CPU when there is no GPU; CUDA-only parts are skipped) to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
from h100_common import (
    T0,
    Rows,
    S,
    atomic_write_text,
    calibrate_sleep,
    cuda,
    env_info,
    free,
    left,
    log,
    nvidia_smi,
    peak_checks,
)
from h100_elementwise import EW_COLS, section_elementwise
from h100_kernels import section_attention, section_gemm, section_optimizer, section_overheads
from h100_model import (
    TRAIN_COLS,
)
from h100_train import section_compile2, section_graphstep, section_train_compiled, section_train_eager


# --------------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget of the whole script, seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check of the script)")
    ap.add_argument("--only", default="", help="comma list of sections to run (default all): "
                    "overheads,train,gemm,attention,optimizer,elementwise,compile,ewcompile,graphstep,compile2")
    S.args = ap.parse_args()
    os.makedirs(S.args.out, exist_ok=True)
    S.log = os.path.join(S.args.out, "log.txt")
    S.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    only = set(filter(None, S.args.only.split(",")))

    def want(s):
        return not only or s in only

    info = env_info()
    log("device", S.dev, info.get("gpu_name", ""), "torch", torch.__version__, "cuda", torch.version.cuda)
    if cuda():
        info["sleep_cycles_per_ms"] = calibrate_sleep()
        peak_checks(info)
        log(f"ceilings: copy {info['d2d_copy_GBps_read_plus_write']:.0f} GB/s, "
            f"bf16 matmul 8192^3 {info['matmul_8192_bf16_tflops']:.0f} TFLOP/s")
    atomic_write_text(os.path.join(S.args.out, "env.json"), json.dumps(info, indent=1))
    train_rows = Rows(os.path.join(S.args.out, "train_steps.csv"), TRAIN_COLS)
    ew_rows = Rows(os.path.join(S.args.out, "elementwise.csv"), EW_COLS)
    sections = [("overheads", lambda: section_overheads(S.args.out)),
                ("train", lambda: section_train_eager(S.args.out, train_rows)),
                ("gemm", lambda: section_gemm(S.args.out)),
                ("attention", lambda: section_attention(S.args.out)),
                ("optimizer", lambda: section_optimizer(S.args.out)),
                ("elementwise", lambda: section_elementwise(S.args.out, ew_rows, "eager")),
                ("compile", lambda: section_train_compiled(S.args.out, train_rows)),
                ("ewcompile", lambda: section_elementwise(S.args.out, ew_rows, "compiled")),
                ("graphstep", lambda: section_graphstep(S.args.out)),
                ("compile2", lambda: section_compile2(S.args.out, train_rows))]
    status = {}
    for name, fn in sections:
        if not want(name):
            continue
        t = time.time()
        try:
            fn()
            status[name] = f"ok {time.time() - t:.1f}s"
        except Exception as e:  # noqa: BLE001
            status[name] = f"failed after {time.time() - t:.1f}s: {e!r}"[:400]
            log(f"section {name} FAILED: {e!r}")
            traceback.print_exc()
        free()
        log(f"section {name}: {status[name]} ({left():.0f}s of budget left)")
    info["sections"] = status
    if cuda():
        info["nvidia_smi_end"] = nvidia_smi()
        info["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    info["wall_s"] = time.time() - T0
    atomic_write_text(os.path.join(S.args.out, "env.json"), json.dumps(info, indent=1))
    log("done", json.dumps(status))


if __name__ == "__main__":
    main()
