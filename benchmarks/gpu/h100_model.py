"""The Llama-architecture model (torchtitan models/llama3 style) and the training-step timing of measure_h100.py."""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from h100_common import (
    S,
    cuda,
    log,
    med,
    sync,
    time_region,
)


# --------------------------------------------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    """torchtitan models/norms.py RMSNorm (eager): x.float(), pow, mean, rsqrt, mul, type_as, mul weight."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """torchtitan models/llama3 apply_rotary_emb: complex multiply in fp32, type_as back."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * fc).flatten(3)
    xk_out = torch.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, s, _ = x.shape
        xq = self.wq(x).view(bs, s, self.n_heads, self.hd)
        xk = self.wk(x).view(bs, s, self.n_kv, self.hd)
        xv = self.wv(x).view(bs, s, self.n_kv, self.hd)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        rep = self.n_heads // self.n_kv
        xk, xv = repeat_kv(xk, rep), repeat_kv(xv, rep)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(bs, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv, ffn):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, L, dim, n_heads, n_kv, ffn, vocab, max_seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, n_heads, n_kv, ffn) for _ in range(L)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(dim // n_heads, max_seq), persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


MODELS = {  # name: (layers, hidden, heads, kv_heads, ffn, vocab)
    "llama-125m": (12, 768, 12, 12, 2048, 32000),
    "llama-370m": (24, 1024, 16, 16, 2816, 32000),
    "tinyllama-1.1b": (22, 2048, 32, 4, 5632, 32000),
}
SMOKE_MODELS = {"tiny-a": (2, 64, 4, 4, 128, 512), "tiny-b": (2, 64, 4, 2, 128, 512)}


def model_flops(cfg, seq, mbs):
    """(6 x non-embedding matmul params x tokens, causal attention score/context FLOPs x 3) per step."""
    L, h, nh, nkv, ffn, V = cfg
    hd = h // nh
    per_layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * ffn
    dense = 6 * (L * per_layer + h * V) * seq * mbs
    attn = 3 * L * 2 * 2 * mbs * seq * seq * nh * hd * 0.5
    return dense, attn


def n_params(model):
    return sum(p.numel() for p in model.parameters())


TRAIN_COLS = ["model", "params", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len",
              "mbs", "tokens_per_step", "mode", "status", "step_ms_median", "step_ms_min", "step_ms_max",
              "step_event_ms_median", "step_cpu_ms_median",
              "fwdbwd_ms_median", "fwdbwd_cpu_ms_median", "opt_step_ms_median", "tokens_per_s", "model_tflops",
              "attn_tflops_causal", "achieved_tflops", "mfu_pct_989", "peak_mem_gib", "compile_s", "n_warmup",
              "n_timed", "step_ms_all", "notes"]


def autocast():
    return torch.autocast(S.dev.type, dtype=torch.bfloat16)


def make_step(model, opt, tokens, labels, with_opt=True):
    def step(_=None):
        with autocast():
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        if with_opt:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def time_steps(fn, warm, reps):
    """Wall ms per step (synchronize before and after each) and CUDA-event ms, after ``warm`` untimed steps."""
    wall, ev, cpu, first = [], [], [], None
    for i in range(warm + reps):
        sync()
        t = time.perf_counter()
        if cuda():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            tc = time.perf_counter()
            sync()
            evm = e0.elapsed_time(e1)
        else:
            fn()
            tc = time.perf_counter()
            evm = float("nan")
        ms = (time.perf_counter() - t) * 1e3
        if i == 0:
            first = ms
        if i >= warm:
            wall.append(ms)
            ev.append(evm)
            cpu.append((tc - t) * 1e3)
    return wall, ev, cpu, first


def run_config(rows, name, cfg, model, opt, seq, mbs, mode, opt_ms, compile_first=None):
    L, h, nh, nkv, ffn, V = cfg
    tokens = torch.randint(0, V, (mbs, seq), device=S.dev)
    labels = torch.randint(0, V, (mbs, seq), device=S.dev)
    if cuda():
        torch.cuda.reset_peak_memory_stats()
    warm, reps = (3, 5) if not S.args.smoke else (1, 2)
    wall, ev, cpu, first = time_steps(make_step(model, opt, tokens, labels, True), warm, reps)
    fb_wall, _, fb_cpu, _ = time_steps(make_step(model, opt, tokens, labels, False), 1, reps)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda() else float("nan")
    dense, attn = model_flops(cfg, seq, mbs)
    step_s = med(wall) / 1e3
    compile_s = ""
    if mode.startswith("compile"):
        compile_s = (compile_first if compile_first is not None else first) / 1e3 - step_s
    rows.add(model=name, params=n_params(model), n_layers=L, hidden=h, n_heads=nh, n_kv_heads=nkv, ffn_hidden=ffn,
             vocab=V, seq_len=seq, mbs=mbs, tokens_per_step=seq * mbs, mode=mode, status="ok",
             step_ms_median=med(wall), step_ms_min=min(wall), step_ms_max=max(wall), step_event_ms_median=med(ev),
             step_cpu_ms_median=med(cpu), fwdbwd_ms_median=med(fb_wall), fwdbwd_cpu_ms_median=med(fb_cpu),
             opt_step_ms_median=opt_ms, tokens_per_s=seq * mbs / step_s,
             model_tflops=dense / 1e12, attn_tflops_causal=attn / 1e12,
             achieved_tflops=(dense + attn) / step_s / 1e12, mfu_pct_989=(dense + attn) / step_s / 989e12 * 100,
             peak_mem_gib=peak, compile_s=compile_s, n_warmup=warm, n_timed=reps,
             step_ms_all=";".join(f"{x:.3f}" for x in wall),
             notes="fp32 params + fused AdamW, autocast bf16; step = fwd+bwd+opt.step+zero_grad(set_to_none)")
    log(f"train {name} {mode} s={seq} mbs={mbs}: step {med(wall):.2f} ms, fwd+bwd {med(fb_wall):.2f} ms, "
        f"{seq * mbs / step_s:,.0f} tok/s, peak {peak:.1f} GiB")


def build(cfg, max_seq):
    L, h, nh, nkv, ffn, V = cfg
    torch.manual_seed(0)
    model = Llama(L, h, nh, nkv, ffn, V, max_seq).to(S.dev)
    kw = dict(fused=True) if cuda() else dict(foreach=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, **kw)
    return model, opt


def opt_alone_ms(model, opt):
    """Optimizer step alone (gradients present, random), median of 5 after 2 warm-ups, wall with synchronize."""
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    ts = time_region(lambda s: opt.step(), reps=5, warm=2)
    opt.zero_grad(set_to_none=True)
    return med(ts)


def oom_row(rows, name, cfg, seq, mbs, mode, status, notes):
    L, h, nh, nkv, ffn, V = cfg
    rows.add(model=name, n_layers=L, hidden=h, n_heads=nh, n_kv_heads=nkv, ffn_hidden=ffn, vocab=V, seq_len=seq,
             mbs=mbs, tokens_per_step=seq * mbs, mode=mode, status=status, notes=notes)
