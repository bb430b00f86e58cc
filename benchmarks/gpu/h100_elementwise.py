"""Element-wise basis section of measure_h100.py (eager vs fused; estimate-train-time replicas)."""
from __future__ import annotations

import time

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
from h100_common import (
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


# ------------------------------------------------------------------------------------------------ 6. element-wise
class NeoXRMSNorm(nn.Module):
    """estimate-train-time Kernel_sampling/megatron/norms.py RMSNorm (GPT-NeoX): fp32 ``scale`` parameter (the
    sampler never casts it), x.norm(2) / sqrt(d), x / (rms + eps), scale * x_normed."""

    def __init__(self, dim, eps=1e-8):
        super().__init__()
        self.eps, self.d = eps, dim
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm_x = x.norm(2, dim=-1, keepdim=True)
        rms_x = norm_x * self.d ** (-1.0 / 2)
        return self.scale * (x / (rms_x + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=x1.ndim - 1)


def rope_rotate_half(q, k, cos, sin):
    """estimate-train-time RoPE.py apply_rotary_pos_emb_torch (the GPT-NeoX / HF Llama rotate-half form)."""
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rope_complex(q, k, fc):
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    k_ = torch.view_as_complex(k.float().reshape(*k.shape[:-1], -1, 2))
    return torch.view_as_real(q_ * fc).flatten(-2).type_as(q), torch.view_as_real(k_ * fc).flatten(-2).type_as(k)


def tt_rmsnorm(x, w, eps=1e-5):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def swiglu(a, b):
    return F.silu(a) * b


def ce_tt(logits, labels):
    return F.cross_entropy(logits.float(), labels)


def ce_bf16(logits, labels):
    return F.cross_entropy(logits, labels)


EW_COLS = ["op", "impl", "dtype", "T", "h", "shape", "pass", "gpu_ms", "eager_ms", "min_bytes", "gpu_GBps",
           "compile_s", "source_shape", "notes"]


def measure_op(rows, op, impl, dtype, T, h, shape, fwd, inputs, grads_for, fb_bytes, source_shape="", notes="",
               compile_s="", do_bwd=True, reps=10):
    """Forward and backward rows for ``fwd(*inputs)``; backward = autograd.grad of the output w.r.t. ``grads_for``
    with a random output gradient (fresh forward, untimed, before each timed backward)."""
    fb, bb = fb_bytes
    tf = time_region(lambda s: fwd(*inputs), reps=reps, warm=2, prefill_ms=3)
    te = time_region(lambda s: fwd(*inputs), reps=reps, warm=2)
    rows.add(op=op, impl=impl, dtype=dtype, T=T, h=h, shape=shape, **{"pass": "fwd"}, gpu_ms=med(tf),
             eager_ms=med(te), min_bytes=fb, gpu_GBps=fb / med(tf) / 1e6, compile_s=compile_s,
             source_shape=source_shape, notes=notes)
    if do_bwd:
        out = fwd(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        go = tuple(torch.randn_like(o) for o in outs)
        del out, outs

        def setup():
            o = fwd(*inputs)
            return o if isinstance(o, tuple) else (o,)

        def bwd(o):
            torch.autograd.grad(o, grads_for, go)
        tb = time_region(bwd, setup=setup, reps=reps, warm=2, prefill_ms=3)
        tbe = time_region(bwd, setup=setup, reps=reps, warm=2)
        rows.add(op=op, impl=impl, dtype=dtype, T=T, h=h, shape=shape, **{"pass": "bwd"}, gpu_ms=med(tb),
                 eager_ms=med(tbe), min_bytes=bb, gpu_GBps=bb / med(tb) / 1e6, compile_s="",
                 source_shape=source_shape, notes=notes)
        del go
    return med(tf)


def compiled(fn):
    return torch.compile(fn, dynamic=False)


def first_call_s(fn, inputs, grads_for):
    """Wall seconds of the first forward+backward (= compile time for a torch.compile'd function)."""
    sync()
    t = time.perf_counter()
    o = fn(*inputs)
    outs = o if isinstance(o, tuple) else (o,)
    torch.autograd.grad(outs, grads_for, tuple(torch.ones_like(x) for x in outs))
    sync()
    return time.perf_counter() - t


def ew_basis_shape(rows, T, h, with_compiled, cfns):
    bf = torch.bfloat16
    dt = "bf16"
    E = T * h
    x = torch.randn(T, h, device=S.dev, dtype=bf, requires_grad=True)
    w = torch.ones(h, device=S.dev, dtype=bf, requires_grad=True)
    shape = f"[{T},{h}]"
    rms_bytes = (4 * E, 6 * E)
    measure_op(rows, "rmsnorm", "eager_torchtitan", dt, T, h, shape, tt_rmsnorm, (x, w), (x, w), rms_bytes,
               notes="(x.float()*rsqrt(x.float().pow(2).mean(-1)+eps)).type_as(x)*w")
    neox = NeoXRMSNorm(h).to(S.dev)
    measure_op(rows, "rmsnorm", "eager_ett_neox", dt, T, h, shape, neox, (x,), (x, neox.scale), (6 * E, 8 * E),
               notes="estimate-train-time's GPT-NeoX RMSNorm, fp32 scale: fp32 output (6/8 B per element)")
    if hasattr(F, "rms_norm"):
        measure_op(rows, "rmsnorm", "F.rms_norm", dt, T, h, shape, lambda a, b: F.rms_norm(a, (h,), b, 1e-5),
                   (x, w), (x, w), rms_bytes)
    if with_compiled:
        cs = first_call_s(cfns["rms"], (x, w), (x, w))
        measure_op(rows, "rmsnorm", "compiled", dt, T, h, shape, cfns["rms"], (x, w), (x, w), rms_bytes,
                   compile_s=cs, notes="torch.compile(torchtitan eager RMSNorm), dynamic=False")
    del neox
    a = torch.randn(T, h, device=S.dev, dtype=bf, requires_grad=True)
    b = torch.randn(T, h, device=S.dev, dtype=bf, requires_grad=True)
    measure_op(rows, "swiglu", "eager", dt, T, h, shape, swiglu, (a, b), (a, b), (6 * E, 10 * E),
               notes="F.silu(a)*b")
    if with_compiled:
        cs = first_call_s(cfns["swiglu"], (a, b), (a, b))
        measure_op(rows, "swiglu", "compiled", dt, T, h, shape, cfns["swiglu"], (a, b), (a, b), (6 * E, 10 * E),
                   compile_s=cs)
    measure_op(rows, "residual_add", "eager", dt, T, h, shape, torch.add, (a, b), (a, b), (6 * E, 0),
               do_bwd=False, notes="a+b; its backward launches no kernel (gradient passes through)")
    del a, b
    hd = 128 if h >= 128 else h // 2
    nh = h // hd
    q = torch.randn(T, nh, hd, device=S.dev, dtype=bf, requires_grad=True)
    k = torch.randn(T, nh, hd, device=S.dev, dtype=bf, requires_grad=True)
    ang = torch.arange(T, device=S.dev, dtype=torch.float32)[:, None] * torch.rand(hd // 2, device=S.dev)[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, None, :].to(bf), emb.sin()[:, None, :].to(bf)
    fc = torch.polar(torch.ones_like(ang), ang)[:, None, :]
    rshape = f"q,k [{T},{nh},{hd}]"
    measure_op(rows, "rope", "eager_rotate_half", dt, T, h, rshape, rope_rotate_half, (q, k, cos, sin), (q, k),
               (8 * E, 8 * E), notes="q*cos+rotate_half(q)*sin for q and k, bf16 cos/sin")
    measure_op(rows, "rope", "eager_complex_torchtitan", dt, T, h, rshape, rope_complex, (q, k, fc), (q, k),
               (8 * E, 8 * E), notes="view_as_complex(x.float()) * freqs_cis, type_as")
    if with_compiled:
        cs = first_call_s(cfns["rope"], (q, k, cos, sin), (q, k))
        measure_op(rows, "rope", "compiled_rotate_half", dt, T, h, rshape, cfns["rope"], (q, k, cos, sin), (q, k),
                   (8 * E, 8 * E), compile_s=cs)
    del q, k, cos, sin, fc, x, w
    free()


def ew_ce(rows, T, V, with_compiled, cfns):
    logits = torch.randn(T, V, device=S.dev, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (T,), device=S.dev)
    E = T * V
    shape = f"[{T},{V}]"
    measure_op(rows, "cross_entropy", "eager_float_torchtitan", "bf16", T, V, shape, ce_tt, (logits, labels),
               (logits,), (2 * E, 4 * E), notes="F.cross_entropy(logits.float(), labels); h column = vocab",
               reps=5)
    measure_op(rows, "cross_entropy", "eager_bf16", "bf16", T, V, shape, ce_bf16, (logits, labels), (logits,),
               (2 * E, 4 * E), notes="F.cross_entropy on bf16 logits; h column = vocab", reps=5)
    if with_compiled:
        cs = first_call_s(cfns["ce"], (logits, labels), (logits,))
        measure_op(rows, "cross_entropy", "compiled", "bf16", T, V, shape, cfns["ce"], (logits, labels),
                   (logits,), (2 * E, 4 * E), compile_s=cs, notes="torch.compile(ce_tt); h column = vocab", reps=5)
    del logits, labels
    free()


# shapes present in both estimate-train-time sample files (A100 Perlmutter and GH200 Vista), fp16
ETT_RMS = [(8, 5120, 8192), (8, 2560, 2560), (2, 5120, 5120), (2, 1024, 2048)]
ETT_ROPE = [(16, 8, 64, 5120, 8192), (4, 4, 56, 1536, 7168), (1, 4, 16, 1024, 2048)]
ETT_RESADD = [(8, 5120, 8192), (2, 5120, 5120), (2, 1024, 2048)]
ETT_GELU = [(16, 8, 5120, 8192), (1, 2, 1024, 2048)]
ETT_LN = [(8, 5120, 8192), (2, 5120, 5120)]


def section_ett(rows):
    """estimate-train-time's own fp16 operator programs at shapes in its sample files (direct H100 comparison)."""
    f16 = torch.float16
    smoke = S.args.smoke
    for b, sl, dim in ([(2, 16, 64)] if smoke else ETT_RMS):
        x = torch.rand(sl, b, dim, device=S.dev, dtype=f16, requires_grad=True)
        m = NeoXRMSNorm(dim).to(S.dev)
        E = sl * b * dim
        measure_op(rows, "ett_RMSlayernorm", "eager_ett_neox", "fp16", sl * b, dim, f"[{sl},{b},{dim}]", m, (x,),
                   (x, m.scale), (6 * E, 8 * E), source_shape=f"b={b},l={sl},dim={dim}")
        del x, m
    try:
        jit_rope = torch.jit.script(rope_rotate_half) if cuda() else rope_rotate_half
        jit_note = "torch.jit.script (the fp16 path of estimate-train-time)"
    except Exception as e:  # noqa: BLE001
        jit_rope, jit_note = rope_rotate_half, f"torch.jit.script failed ({e!r:.80}); plain eager"
    for mp, b, h, sl, dim in ([(1, 2, 4, 16, 64)] if smoke else ETT_ROPE):
        hd = dim // h
        q = torch.rand(sl, b, h // mp, hd, device=S.dev, dtype=f16, requires_grad=True)
        k = torch.rand(sl, b, h // mp, hd, device=S.dev, dtype=f16, requires_grad=True)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=S.dev, dtype=f16) / hd))
        t = torch.arange(sl, device=S.dev).type_as(inv)
        emb = torch.cat((torch.einsum("i,j->ij", t, inv),) * 2, dim=-1)
        cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]
        E = q.numel()
        measure_op(rows, "ett_RoPE", "eager_rotate_half_jit", "fp16", sl * b, dim // mp,
                   f"q,k [{sl},{b},{h // mp},{hd}]", jit_rope, (q, k, cos, sin), (q, k), (8 * E, 8 * E),
                   source_shape=f"mp={mp},b={b},h={h},l={sl},dim={dim}", notes=jit_note)
        del q, k
    for b, sl, dim in ([(2, 16, 64)] if smoke else ETT_RESADD):
        a = torch.rand(sl, b, dim, device=S.dev, dtype=f16, requires_grad=True)
        c = torch.rand(sl, b, dim, device=S.dev, dtype=f16, requires_grad=True)
        E = a.numel()
        measure_op(rows, "ett_res_add", "eager", "fp16", sl * b, dim, f"[{sl},{b},{dim}]", torch.add, (a, c), (a, c),
                   (6 * E, 0), do_bwd=False, source_shape=f"b={b},l={sl},dim={dim}")
        del a, c
    for mp, b, sl, dim in ([(1, 2, 16, 64)] if smoke else ETT_GELU):
        a = torch.rand(sl, b, dim * 4 // mp, device=S.dev, dtype=f16, requires_grad=True)
        E = a.numel()
        measure_op(rows, "ett_gelu", "eager", "fp16", sl * b, dim * 4 // mp, f"[{sl},{b},{dim * 4 // mp}]", F.gelu,
                   (a,), (a,), (4 * E, 6 * E), source_shape=f"mp={mp},b={b},l={sl},dim={dim}")
        del a
    for b, sl, dim in ([(2, 16, 64)] if smoke else ETT_LN):
        x = torch.rand(sl, b, dim, device=S.dev, dtype=f16, requires_grad=True)
        ln = nn.LayerNorm([dim]).to(S.dev).half()
        E = x.numel()
        measure_op(rows, "ett_layernorm", "eager", "fp16", sl * b, dim, f"[{sl},{b},{dim}]", ln, (x,),
                   (x, ln.weight, ln.bias), (4 * E, 6 * E), source_shape=f"b={b},l={sl},dim={dim}")
        del x, ln
    free()


EW_SHAPES = [(4096, 2048), (4096, 4096), (4096, 8192), (16384, 2048), (16384, 4096), (16384, 8192),
             (32768, 2048), (32768, 4096), (32768, 8192)]
EW_COMPILED = [(16384, 4096), (4096, 2048), (32768, 8192), (16384, 2048), (32768, 4096)]


def section_elementwise(out, rows, phase):
    smoke = S.args.smoke
    shapes = [(64, 32), (128, 64)] if smoke else EW_SHAPES
    ce = [(64, 512)] if smoke else [(4096, 32000), (8192, 32000), (4096, 128256), (8192, 128256)]
    if phase == "eager":
        for T, h in shapes:
            if left() < 25:
                log("elementwise eager: budget reached")
                return
            try:
                ew_basis_shape(rows, T, h, False, None)
                log(f"elementwise eager [{T},{h}] done")
            except torch.cuda.OutOfMemoryError as e:
                log(f"elementwise [{T},{h}] OOM {e!s:.80}")
            free()
        for T, V in ce:
            if left() < 20:
                return
            ew_ce(rows, T, V, False, None)
            log(f"cross-entropy eager [{T},{V}] done")
        if left() > 20:
            section_ett(rows)
            log("estimate-train-time fp16 replicas done")
        return
    # compiled
    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 512)
    cfns = dict(rms=compiled(tt_rmsnorm), swiglu=compiled(swiglu), rope=compiled(rope_rotate_half),
                ce=compiled(ce_tt))
    cshapes = [(64, 32)] if smoke else EW_COMPILED
    for i, (T, h) in enumerate(cshapes):
        if left() < 30:
            log("elementwise compiled: budget reached")
            break
        try:
            with time_limit(left() - 12):
                ew_basis_shape(rows, T, h, True, cfns)
                log(f"elementwise compiled [{T},{h}] done")
                if i < len(ce) and left() > 30:
                    ew_ce(rows, *ce[i], True, cfns)
                    log(f"cross-entropy compiled {ce[i]} done")
        except (Timeout, Exception) as e:  # noqa: BLE001
            log(f"elementwise compiled [{T},{h}]: {e!r}"[:200])
        free()

