"""Configuration of one measured training run (torch-free, shared by the runner and the torchrun worker)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("rope", "learned")


@dataclass(frozen=True)
class WorkloadConfig:
    """Model, parallel layout and measurement settings of one run."""

    n_layers: int = 2
    """Transformer blocks."""
    hidden: int = 64
    """Model width h."""
    n_heads: int = 4
    """Query heads."""
    n_kv_heads: int = 4
    """Key/value heads (GQA when < n_heads); must be a multiple of tp."""
    ffn_hidden: int = 256
    """MLP inner width (per gate branch for SwiGLU)."""
    vocab: int = 512
    """Vocabulary size; must be a multiple of tp (vocab-parallel embedding and LM head)."""
    seq_len: int = 32
    """Tokens per sequence."""
    activation: str = "gelu"
    """gelu or swiglu."""
    norm: str = "layernorm"
    """layernorm or rmsnorm."""
    position: str = "rope"
    """rope or learned (absolute position table on the first stage)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline stages (1F1B, non-interleaved)."""
    dp: int = 1
    """Data-parallel degree."""
    mbs: int = 1
    """Sequences per micro-batch."""
    num_microbatches: int = 1
    """Micro-batches per iteration per data-parallel rank (gbs = mbs * num_microbatches * dp)."""
    warmup: int = 2
    """Iterations run before timing starts."""
    iters: int = 5
    """Timed iterations."""
    threads: int = 1
    """torch intra-op threads per process."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    seed: int = 1234
    """Seed of the weights and of the synthetic tokens."""
    data_batches: int = 4
    """Distinct seeded global batches, cycled over the iterations."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gbs(self) -> int:
        return self.mbs * self.num_microbatches * self.dp

    def problems(self) -> list[str]:
        """Every reason the configuration cannot run (empty when valid)."""
        p = []
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len", "tp", "pp",
                     "dp", "mbs", "num_microbatches", "iters", "threads", "data_batches"):
            if getattr(self, name) <= 0:
                p.append(f"{name} must be positive")
        if self.warmup < 0:
            p.append("warmup must be >= 0")
        if self.activation not in ACTIVATIONS:
            p.append(f"activation must be one of {ACTIVATIONS}")
        if self.norm not in NORMS:
            p.append(f"norm must be one of {NORMS}")
        if self.position not in POSITIONS:
            p.append(f"position must be one of {POSITIONS}")
        if p:
            return p
        if self.hidden % self.n_heads:
            p.append("hidden must be a multiple of n_heads")
        elif self.position == "rope" and (self.hidden // self.n_heads) % 2:
            p.append("head dim must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            p.append("n_heads must be a multiple of n_kv_heads")
        for name in ("n_heads", "n_kv_heads", "ffn_hidden", "vocab"):
            if getattr(self, name) % self.tp:
                p.append(f"{name}={getattr(self, name)} must be a multiple of tp={self.tp}")
        if self.n_layers % self.pp:
            p.append(f"n_layers={self.n_layers} must be a multiple of pp={self.pp}")
        return p

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "WorkloadConfig":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
