"""Model architecture spec (`ModelSpec`).

Loading from Hugging Face ``config.json`` and the shipped presets lives in
:mod:`costmodel.core.specs.hf_config` and :mod:`costmodel.core.specs.presets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.core.errors import PlannerError

ACTIVATIONS = ("gelu", "swiglu", "squared_relu", "relu")
NORMS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")
# Activations whose MLP has a gate: the up projection produces 2 * ffn_hidden_size outputs.
GATED_ACTIVATIONS = ("swiglu",)


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer (MoE fields are parsed and kept, not modelled)."""

    name: str
    """Display name, e.g. ``llama-13b``."""
    num_layers: int
    """Number of transformer blocks."""
    hidden_size: int
    """Model width h (residual stream)."""
    num_heads: int
    """Query attention heads a."""
    num_kv_heads: int
    """Key/value heads (== num_heads for MHA, 1 for MQA, in between for GQA)."""
    ffn_hidden_size: int
    """MLP inner width F (per gate branch for gated activations)."""
    vocab_size: int
    """Vocabulary size V (unpadded)."""
    head_dim: int = 0
    """Per-head width; 0 means hidden_size // num_heads."""
    activation: str = "gelu"
    """One of gelu, swiglu (gated SiLU), squared_relu, relu."""
    norm: str = "layernorm"
    """One of layernorm, rmsnorm."""
    tied_embeddings: bool = False
    """Input embedding and LM head share weights."""
    position_embedding: str = "rope"
    """One of rope, learned, alibi, none."""
    max_seq_len: int = 2048
    """Longest sequence the model was trained for (default plan sequence length)."""
    linear_bias: bool = False
    """Linear layers carry a bias vector (GPT-2/NeoX/BLOOM yes; Llama no)."""
    dropout: bool = False
    """Hidden/attention dropout is active in training (adds 1-byte masks to activations)."""
    num_experts: int = 0
    """MoE experts per layer (0 = dense). Parsed and kept; the engine refuses MoE models."""
    experts_per_token: int = 0
    """MoE top-k routing. Parsed and kept."""
    rope_theta: float | None = None
    """RoPE base frequency where stated."""
    source: str = ""
    """Where the numbers come from (config file, paper table)."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    """Fields parsed from the source but not used by the engine (kept for reference)."""

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        problems = []
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                     "vocab_size", "head_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name}={value!r} must be a positive integer")
        if not problems and self.num_heads % self.num_kv_heads != 0:
            problems.append(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation={self.activation!r} must be one of {', '.join(ACTIVATIONS)}")
        if self.norm not in NORMS:
            problems.append(f"norm={self.norm!r} must be one of {', '.join(NORMS)}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            problems.append(
                f"position_embedding={self.position_embedding!r} must be one of {', '.join(POSITION_EMBEDDINGS)}")
        if problems:
            raise PlannerError(f"model {self.name!r} is invalid: " + "; ".join(problems) + ".")

    def require_dense(self) -> None:
        """Raise a clear error for MoE models, which the engine does not model yet."""
        if self.num_experts > 1:
            raise PlannerError(
                f"model {self.name!r} is a mixture-of-experts model ({self.num_experts} experts, "
                f"top-{self.experts_per_token}); planner models dense transformers only so far - "
                "use a dense model or a dense preset (see `planner models`).")

    # ---------------------------------------------------------- derived sizes
    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def q_dim(self) -> int:
        """Width of the query projection output: a * d_head."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V: a_kv * d_head."""
        return self.num_kv_heads * self.head_dim

    def params_per_layer(self) -> int:
        """Weights of one transformer block (attention + MLP + 2 norms)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        experts = max(self.num_experts, 1)
        # MoE: every expert holds a full MLP, plus an h x E router
        # (Mixtral, Jiang et al. 2024, arXiv 2401.04088 Sec. 2.1).
        mlp = h * f * (3 if self.gated else 2) * experts + (h * experts if experts > 1 else 0)
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        bias = 0
        if self.linear_bias:
            bias = (self.q_dim + 2 * self.kv_dim) + h + ((2 * f if self.gated else f) + h) * experts
        return attn + mlp + norms + bias

    def embedding_params(self) -> int:
        """Input embedding (plus learned position table)."""
        pos = self.max_seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """LM head (0 when tied) plus the final norm."""
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + final_norm

    def total_params(self) -> int:
        return self.num_layers * self.params_per_layer() + self.embedding_params() + self.head_params()

    def non_embedding_params(self) -> int:
        return self.num_layers * self.params_per_layer()
