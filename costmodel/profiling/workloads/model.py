"""GPT/Llama-style decoder (pre-norm, causal attention with GQA, GELU or SwiGLU MLP) as a pipeline stage.

One :class:`DecoderStage` holds the layers [first_layer, first_layer + n) of the model; the first stage
also holds the token (and learned position) embedding, the last the final norm, LM head and loss.
With tp = pp = 1 it is the plain, unsharded model. No biases, no dropout, untied embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from costmodel.profiling.workloads.config import WorkloadConfig
from costmodel.profiling.workloads.tensor_parallel import (
    ColumnParallelLinear,
    ParallelState,
    RowParallelLinear,
    VocabParallelEmbedding,
    full_weight,
    shard_rows,
    vocab_parallel_cross_entropy,
)

ROPE_BASE = 10000.0
"""RoPE frequency base theta (Su et al. 2021, RoFormer, arXiv 2104.09864 eq. 15)."""


def _norm(cfg: WorkloadConfig) -> nn.Module:
    return nn.LayerNorm(cfg.hidden) if cfg.norm == "layernorm" else nn.RMSNorm(cfg.hidden)


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [seq_len, head_dim] in the rotate-half layout (GPT-NeoX / Llama)."""
    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, s, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn_out(attn(qkv(norm(x)))), then x + down(act(up(norm(x))))."""

    def __init__(self, cfg: WorkloadConfig, state: ParallelState, index: int):
        super().__init__()
        h, d = cfg.hidden, cfg.hidden // cfg.n_heads
        s, name = cfg.seed, f"layer{index}"
        self.cfg, self.state = cfg, state
        self.heads, self.kv_heads, self.head_dim = cfg.n_heads // state.tp, cfg.n_kv_heads // state.tp, d
        self.attn_norm, self.mlp_norm = _norm(cfg), _norm(cfg)
        wq = full_weight(s, name + ".wq", (cfg.n_heads * d, h))
        wk = full_weight(s, name + ".wk", (cfg.n_kv_heads * d, h))
        wv = full_weight(s, name + ".wv", (cfg.n_kv_heads * d, h))
        self.qkv = ColumnParallelLinear(shard_rows([wq, wk, wv], state), state)
        self.attn_out = RowParallelLinear(full_weight(s, name + ".wo", (h, cfg.n_heads * d)), state)
        ups = [full_weight(s, name + ".w_up", (cfg.ffn_hidden, h))]
        if cfg.activation == "swiglu":
            ups.insert(0, full_weight(s, name + ".w_gate", (cfg.ffn_hidden, h)))
        self.mlp_up = ColumnParallelLinear(shard_rows(ups, state), state)
        self.mlp_down = RowParallelLinear(full_weight(s, name + ".w_down", (h, cfg.ffn_hidden)), state)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.attn_norm(x))
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        up = self.mlp_up(self.mlp_norm(x))
        if self.cfg.activation == "swiglu":
            gate, up = up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(up)
        return x + self.mlp_down(act)


class DecoderStage(nn.Module):
    """Layers of one pipeline stage (plus embedding on the first, final norm + LM head + loss on the last)."""

    def __init__(self, cfg: WorkloadConfig, state: ParallelState):
        super().__init__()
        self.cfg, self.state = cfg, state
        per_stage = cfg.n_layers // state.pp
        first_layer = state.pp_rank * per_stage
        self.layers = nn.ModuleList(DecoderLayer(cfg, state, first_layer + i) for i in range(per_stage))
        self.first, self.last = state.first_stage, state.last_stage
        if self.first:
            self.embedding = VocabParallelEmbedding(full_weight(cfg.seed, "embedding", (cfg.vocab, cfg.hidden)), state)
            if cfg.position == "learned":
                self.pos = nn.Parameter(full_weight(cfg.seed, "pos_embedding", (cfg.seq_len, cfg.hidden)))
        if self.last:
            self.final_norm = _norm(cfg)
            head = full_weight(cfg.seed, "lm_head", (cfg.vocab, cfg.hidden))
            self.lm_head = ColumnParallelLinear(shard_rows([head], state), state)
            self.vocab_start = state.tp_rank * (cfg.vocab // state.tp)
        if cfg.position == "rope":
            cos, sin = rope_tables(cfg.seq_len, cfg.hidden // cfg.n_heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, inp: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """First stage: inp = tokens [b, s]; else hidden [b, s, h]. Returns the mean loss on the last stage."""
        x = self.embedding(inp) if self.first else inp
        if self.first and self.cfg.position == "learned":
            x = x + self.pos
        rope = (self.rope_cos, self.rope_sin) if self.cfg.position == "rope" else None
        for layer in self.layers:
            x = layer(x, rope)
        if not self.last:
            return x
        logits = self.lm_head(self.final_norm(x))
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.state).mean()
