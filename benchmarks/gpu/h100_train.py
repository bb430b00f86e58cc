"""Training-step sections of measure_h100.py: eager grid, torch.compile, whole-step CUDA graph."""
from __future__ import annotations

import os
import time
import traceback

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
from h100_common import (
    Rows,
    S,
    Timeout,
    cuda,
    free,
    left,
    log,
    med,
    sync,
    time_limit,
    time_region,
)
from h100_model import (
    MODELS,
    SMOKE_MODELS,
    build,
    make_step,
    n_params,
    oom_row,
    opt_alone_ms,
    run_config,
    time_steps,
)


def section_train_eager(out, rows):
    models = SMOKE_MODELS if S.args.smoke else MODELS
    seqs = (32, 64) if S.args.smoke else (1024, 2048, 4096)
    mbss = (1, 2) if S.args.smoke else (1, 2, 4, 8)
    reserve = S.args.budget_s * 0.45  # keep time for the other sections
    for name, cfg in models.items():
        if left() < reserve:
            log(f"train eager: budget reserve reached, skipping {name}")
            for seq in seqs:
                for mbs in mbss:
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_budget", "")
            continue
        model, opt = build(cfg, max(seqs))
        opt_ms = opt_alone_ms(model, opt)
        log(f"train {name}: {n_params(model) / 1e6:.1f} M params, AdamW(fused) step alone {opt_ms:.2f} ms")
        failed = set()  # (seq, mbs) that ran out of memory: larger ones are skipped
        for seq in seqs:
            for mbs in mbss:
                if any(s <= seq and m <= mbs for s, m in failed):
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_oom",
                            "a smaller seq x mbs ran out of memory")
                    continue
                if left() < reserve:
                    oom_row(rows, name, cfg, seq, mbs, "eager", "skipped_budget", "")
                    continue
                err = None
                try:
                    run_config(rows, name, cfg, model, opt, seq, mbs, "eager", opt_ms)
                except torch.cuda.OutOfMemoryError as e:  # noqa: PERF203
                    err = "oom: " + str(e).split("\n")[0][:200]
                except Exception as e:  # noqa: BLE001
                    err = "error: " + repr(e)[:300]
                if err:
                    opt.zero_grad(set_to_none=True)
                    free()
                    failed.add((seq, mbs))
                    oom_row(rows, name, cfg, seq, mbs, "eager", "oom" if err.startswith("oom") else "error", err)
                    log(f"train {name} s={seq} mbs={mbs}: {err[:120]}")
                free()
        del model, opt
        free()


def section_train_compiled(out, rows):
    for attr in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    models = SMOKE_MODELS if S.args.smoke else MODELS
    plan = [("tiny-a", 64, 2)] if S.args.smoke else [("llama-125m", 2048, 4), ("tinyllama-1.1b", 2048, 4),
                                                   ("llama-370m", 2048, 4)]
    for name, seq, mbs in plan:
        cfg = models[name]
        need = 25 if S.args.smoke else 75
        if left() < need:
            log(f"train compile {name}: {left():.0f}s left < {need}s, skipped")
            oom_row(rows, name, cfg, seq, mbs, "compile", "skipped_budget", "")
            continue
        err = None
        try:
            with time_limit(left() - 10):
                model, opt = build(cfg, seq)
                for i, layer in enumerate(model.layers):  # torchtitan apply_compile: each block on its own
                    model.layers.register_module(str(i), torch.compile(layer, fullgraph=True))
                opt_ms = opt_alone_ms(model, opt)
                t = time.perf_counter()
                tokens = torch.randint(0, cfg[5], (mbs, seq), device=S.dev)
                make_step(model, opt, tokens, tokens, True)()
                sync()
                first = (time.perf_counter() - t) * 1e3
                run_config(rows, name, cfg, model, opt, seq, mbs, "compile", opt_ms, compile_first=first)
        except Timeout as e:
            err = "timeout: " + str(e)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            oom_row(rows, name, cfg, seq, mbs, "compile", err.split(":")[0], err)
            log(f"train compile {name}: {err[:200]}")
        model = opt = None
        free()


GRAPH_COLS = ["model", "params", "seq_len", "mbs", "tokens_per_step", "status", "eager_step_ms", "eager_step_cpu_ms",
              "graph_step_ms", "graph_capture_s", "eager_minus_graph_ms", "eager_over_graph", "peak_mem_gib",
              "n_timed", "notes"]
GRAPH_PLAN = [("llama-125m", 1024, 1), ("llama-125m", 2048, 4), ("llama-125m", 4096, 8), ("llama-370m", 1024, 1),
              ("llama-370m", 2048, 4), ("tinyllama-1.1b", 1024, 1), ("tinyllama-1.1b", 2048, 4),
              ("tinyllama-1.1b", 4096, 2)]


def graph_config(rows, name, cfg, seq, mbs):
    """The eager training step, timed as eager code and as one captured CUDA graph (same kernels, no CPU)."""
    L, h, nh, nkv, ffn, V = cfg
    model, opt = build(cfg, seq)
    tokens = torch.randint(0, V, (mbs, seq), device=S.dev)
    labels = torch.randint(0, V, (mbs, seq), device=S.dev)
    warm, reps = (3, 5) if not S.args.smoke else (1, 2)
    wall, _, cpu, _ = time_steps(make_step(model, opt, tokens, labels, True), warm, reps)
    del opt
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, eps=1e-8, fused=True, capturable=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        opt.step()
    torch.cuda.reset_peak_memory_stats()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    opt.zero_grad(set_to_none=True)
    free()
    t = time.perf_counter()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    sync()
    cap = time.perf_counter() - t
    ts = time_region(lambda s_, g=g: g.replay(), reps=10 if not S.args.smoke else 2, warm=2)
    peak = torch.cuda.max_memory_allocated() / 2**30
    rows.add(model=name, params=n_params(model), seq_len=seq, mbs=mbs, tokens_per_step=seq * mbs, status="ok",
             eager_step_ms=med(wall), eager_step_cpu_ms=med(cpu), graph_step_ms=med(ts), graph_capture_s=cap,
             eager_minus_graph_ms=med(wall) - med(ts), eager_over_graph=med(wall) / med(ts), peak_mem_gib=peak,
             n_timed=len(ts), notes="same model and kernels; graph = fwd+bwd+AdamW(fused, capturable) captured "
             "once (autocast cache off), replay timed with CUDA events; eager = wall with synchronize per step")
    log(f"graphstep {name} s={seq} mbs={mbs}: eager {med(wall):.2f} ms (CPU {med(cpu):.2f}), "
        f"graph {med(ts):.2f} ms")
    del g


def section_graphstep(out):
    rows = Rows(os.path.join(out, "graph_steps.csv"), GRAPH_COLS)
    if not cuda():
        log("graphstep: CUDA only, skipped")
        return
    models = SMOKE_MODELS if S.args.smoke else MODELS
    plan = [("tiny-a", 64, 2)] if S.args.smoke else GRAPH_PLAN
    for name, seq, mbs in plan:
        if left() < 40:
            rows.add(model=name, seq_len=seq, mbs=mbs, status="skipped_budget")
            continue
        err = None
        try:
            graph_config(rows, name, models[name], seq, mbs)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            rows.add(model=name, seq_len=seq, mbs=mbs, status=err.split(":")[0], notes=err)
            log(f"graphstep {name} s={seq} mbs={mbs}: {err[:150]}")
        free()


COMPILE2_PLAN = [("llama-125m", 1024, 1, "default"), ("llama-125m", 2048, 4, "reduce-overhead"),
                 ("llama-125m", 1024, 1, "reduce-overhead"), ("tinyllama-1.1b", 2048, 4, "reduce-overhead")]


def section_compile2(out, rows):
    """torch.compile beyond the per-block default: a small configuration, and whole-model mode='reduce-overhead'
    (inductor + CUDA graphs via cudagraph trees) for forward and backward; the optimizer stays eager fused AdamW."""
    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    models = SMOKE_MODELS if S.args.smoke else MODELS
    plan = [("tiny-a", 32, 1, "default")] if S.args.smoke else COMPILE2_PLAN
    for name, seq, mbs, cmode in plan:
        cfg = models[name]
        label = "compile" if cmode == "default" else "compile_reduce_overhead"
        if cmode != "default" and not cuda():
            continue
        if left() < (25 if S.args.smoke else 70):
            oom_row(rows, name, cfg, seq, mbs, label, "skipped_budget", "")
            continue
        err = None
        try:
            with time_limit(left() - 10):
                torch._dynamo.reset()
                model, opt = build(cfg, seq)
                if cmode == "default":
                    for i, layer in enumerate(model.layers):
                        model.layers.register_module(str(i), torch.compile(layer, fullgraph=True))
                    fwd_model = model
                else:
                    fwd_model = torch.compile(model, mode="reduce-overhead")
                opt_ms = opt_alone_ms(model, opt)
                holder = _Wrap(fwd_model, cmode != "default")
                t = time.perf_counter()
                tokens = torch.randint(0, cfg[5], (mbs, seq), device=S.dev)
                make_step(holder, opt, tokens, tokens, True)()
                sync()
                first = (time.perf_counter() - t) * 1e3
                run_config(rows, name, cfg, holder, opt, seq, mbs, label, opt_ms, compile_first=first)
        except Timeout as e:
            err = "timeout: " + str(e)
        except torch.cuda.OutOfMemoryError as e:
            err = "oom: " + str(e).split("\n")[0][:200]
        except Exception as e:  # noqa: BLE001
            err = "error: " + repr(e)[:300]
            traceback.print_exc()
        if err:
            oom_row(rows, name, cfg, seq, mbs, label, err.split(":")[0], err)
            log(f"train {label} {name}: {err[:200]}")
        model = opt = fwd_model = holder = None
        free()


class _Wrap(nn.Module):
    """Calls the (compiled) model; with CUDA graphs marks a new step first (cudagraph trees)."""

    def __init__(self, m, mark):
        super().__init__()
        self.m, self.mark = m, mark

    def forward(self, tokens):
        if self.mark:
            torch.compiler.cudagraph_mark_step_begin()
        return self.m(tokens)

