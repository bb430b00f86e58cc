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
ROUTERS = ("softmax", "sigmoid")
# Activations whose MLP has a gate: the up projection produces 2 * ffn_hidden_size outputs.
GATED_ACTIVATIONS = ("swiglu",)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: dense, or mixture-of-experts (MoE) when ``num_experts`` > 1.

    MoE layers replace the MLP by a router over ``num_experts`` expert MLPs of width ``moe_ffn_hidden_size``, of
    which each token uses ``experts_per_token`` (top-k), plus ``num_shared_experts`` always-on experts
    (DeepSeek-MoE, Dai et al. 2024, arXiv 2401.06066 sec. 3; Mixtral, Jiang et al. 2024, arXiv 2401.04088
    sec. 2.1). Which layers are MoE: :meth:`is_moe_layer`. Multi-head latent attention (MLA, DeepSeek-V2,
    arXiv 2405.04434 sec. 2.1) when ``kv_lora_rank`` > 0."""

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
    """Routed experts per MoE layer (0 or 1 = dense model)."""
    experts_per_token: int = 0
    """Routed experts each token is sent to (top-k)."""
    moe_ffn_hidden_size: int = 0
    """FFN width of one routed expert (per gate branch for gated activations); 0 = ``ffn_hidden_size``.
    ``ffn_hidden_size`` stays the width of the dense layers' MLP (DeepSeek-V3: 18432 dense vs 2048 per expert)."""
    num_shared_experts: int = 0
    """Always-on shared experts per MoE layer (DeepSeek-MoE); every token passes through all of them."""
    shared_expert_ffn_hidden_size: int = 0
    """FFN width of one shared expert; 0 = ``moe_ffn_hidden_size`` (DeepSeek); Qwen2-MoE states its own."""
    first_dense_layers: int = 0
    """Leading layers with a dense MLP instead of MoE (DeepSeek ``first_k_dense_replace``)."""
    moe_layer_freq: int = 1
    """After the leading dense layers, layer i is MoE when (i + 1 - first_dense_layers) % moe_layer_freq == 0
    (1 = every layer; Qwen2-MoE ``decoder_sparse_step``, Llama 4 ``interleave_moe_layer_step``); the others dense."""
    router: str = "softmax"
    """Router scoring: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)."""
    capacity_factor: float = 0.0
    """Expert capacity as a multiple of the balanced share (tokens over capacity are dropped); 0 = dropless."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection (0 = queries projected directly from the hidden state)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed KV latent (0 = ordinary multi-/grouped-query attention)."""
    qk_rope_head_dim: int = 0
    """MLA: per-head width of the decoupled RoPE part of Q and K (the shared rotary key is this wide)."""
    v_head_dim: int = 0
    """MLA: per-head width of V (0 = ``head_dim``). With MLA ``head_dim`` is the Q/K width nope + rope."""
    sliding_window: int = 0
    """Sliding-window attention span in tokens on the layers that use it (0 = none)."""
    sliding_window_every: int = 0
    """Layer i uses the sliding window when i % sliding_window_every == 0 (gpt-oss alternates: 2; 1 = every
    layer; 0 = none)."""
    attention_sinks: bool = False
    """Learned per-head attention-sink logits (gpt-oss): one extra score column per head."""
    mtp_layers: int = 0
    """Multi-token-prediction depths trained with the model (DeepSeek-V3 config.json ``num_nextn_predict_layers``,
    Megatron-Core --mtp-num-layers; costmodel.memory.mtp): each adds a Transformer block like the last layer, a 2h x h
    projection and one more pass of the shared output head and loss. Not in ``total_params`` (DeepSeek-V3's 671B
    leaves the 14B MTP module out)."""
    parallel_attention: bool = False
    """Attention and MLP read the same block input and their outputs join the residual stream in one add (GPT-J,
    PaLM, Falcon ``parallel_attn``): one residual add per layer instead of two."""
    norms_per_layer: int = 2
    """Norm modules per block: 2 (before attention and before the MLP), 1 (a parallel block whose attention and MLP
    share one input norm: Falcon-7B), 4 (Gemma 2's norms before and after each sub-layer)."""
    attn_logit_softcap: float = 0.0
    """Attention scores pass through cap * tanh(score / cap) before the softmax (Gemma 2: 50.0); 0 = none."""
    final_logit_softcap: float = 0.0
    """The LM head's logits pass through cap * tanh(logit / cap) before the loss (Gemma 2: 30.0); 0 = none."""
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
        if self.num_experts > 1:
            if not 1 <= self.experts_per_token <= self.num_experts:
                problems.append(f"experts_per_token={self.experts_per_token!r} must be between 1 and "
                                f"num_experts={self.num_experts}")
            if self.moe_layer_freq < 1:
                problems.append(f"moe_layer_freq={self.moe_layer_freq!r} must be >= 1")
            if not 0 <= self.first_dense_layers < self.num_layers:
                problems.append(f"first_dense_layers={self.first_dense_layers!r} must be in [0, num_layers)")
        for name in ("moe_ffn_hidden_size", "num_shared_experts", "shared_expert_ffn_hidden_size", "q_lora_rank",
                     "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "sliding_window", "sliding_window_every",
                     "mtp_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name}={value!r} must be a non-negative integer")
        if self.router not in ROUTERS:
            problems.append(f"router={self.router!r} must be one of {', '.join(ROUTERS)}")
        if not (isinstance(self.capacity_factor, (int, float)) and self.capacity_factor >= 0):
            problems.append(f"capacity_factor={self.capacity_factor!r} must be >= 0 (0 = dropless)")
        if isinstance(self.norms_per_layer, bool) or self.norms_per_layer not in (1, 2, 4):
            problems.append(f"norms_per_layer={self.norms_per_layer!r} must be 1, 2 or 4")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                problems.append(f"{name}={value!r} must be a number >= 0 (0 = no soft-capping)")
        if problems:
            raise PlannerError(f"model {self.name!r} is invalid: " + "; ".join(problems) + ".")

    def require_dense(self) -> None:
        """Raise a clear error for MoE models where a code path does not model them yet."""
        if self.is_moe:
            raise PlannerError(
                f"model {self.name!r} is a mixture-of-experts model ({self.num_experts} experts, "
                f"top-{self.experts_per_token}); this command models dense transformers only so far - "
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

    # ------------------------------------------------------------------ MoE
    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (more than one routed expert)."""
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @property
    def expert_ffn(self) -> int:
        """FFN width of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_ffn(self) -> int:
        """Total FFN width of the shared experts of one MoE layer (0 without shared experts)."""
        return self.num_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn)

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) has an MoE block (see ``first_dense_layers`` / ``moe_layer_freq``)."""
        if not self.is_moe or i < self.first_dense_layers:
            return False
        return (i + 1 - self.first_dense_layers) % self.moe_layer_freq == 0

    def moe_layers_in(self, start: int, count: int) -> int:
        """MoE layers among layers ``start`` .. ``start + count - 1``."""
        return sum(self.is_moe_layer(i) for i in range(start, start + count))

    @property
    def num_moe_layers(self) -> int:
        return self.moe_layers_in(0, self.num_layers)

    def uses_sliding_window(self, i: int) -> bool:
        """Whether layer ``i`` attends over a sliding window of ``sliding_window`` tokens."""
        return self.sliding_window > 0 and self.sliding_window_every > 0 and i % self.sliding_window_every == 0

    # ------------------------------------------------------------ parameters
    def mlp_params(self, width: int) -> int:
        """One MLP of inner width ``width`` (gate + up + down for gated activations), with biases."""
        n = self.hidden_size * width * (3 if self.gated else 2)
        if self.linear_bias:
            n += (2 * width if self.gated else width) + self.hidden_size
        return n

    def attention_params(self) -> int:
        """Weights of one attention block: Q/K/V/output projections (MLA: the down/up projections and their
        norms, DeepSeek-V2 arXiv 2405.04434 eq. 9-19), with biases."""
        h = self.hidden_size
        if self.is_mla:
            a, rope = self.num_heads, self.qk_rope_head_dim
            nope = self.head_dim - rope
            v = self.v_head_dim or self.head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * (nope + rope)
                 if self.q_lora_rank else h * a * (nope + rope))
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank + self.kv_lora_rank * a * (nope + v)
            return q + kv + a * v * h
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.linear_bias:
            attn += (self.q_dim + 2 * self.kv_dim) + h
        if self.attention_sinks:
            attn += self.num_heads
        return attn

    def norm_params(self) -> int:
        """The norms of one block (``norms_per_layer``, each a weight, plus a bias for LayerNorm)."""
        return self.norms_per_layer * self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def router_params(self) -> int:
        """Router weights of one MoE layer: an h x E linear (Mixtral sec. 2.1)."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    def expert_params(self) -> int:
        """Weights of one routed expert."""
        return self.mlp_params(self.expert_ffn)

    def layer_params(self, i: int) -> int:
        """Weights of layer ``i``: attention, norms and its MLP (dense) or router + all experts + shared (MoE)."""
        common = self.attention_params() + self.norm_params()
        if self.is_moe_layer(i):
            shared = self.mlp_params(self.shared_ffn) if self.shared_ffn else 0
            return common + self.router_params() + self.num_experts * self.expert_params() + shared
        return common + self.mlp_params(self.ffn_hidden_size)

    def active_layer_params(self, i: int) -> int:
        """Weights one token passes through in layer ``i``: the top-k routed experts instead of all of them."""
        if not self.is_moe_layer(i):
            return self.layer_params(i)
        return (self.layer_params(i) - (self.num_experts - self.experts_per_token) * self.expert_params())

    def params_per_layer(self) -> int:
        """Weights of one dense transformer block (attention + MLP + 2 norms); for an MoE model, of one MoE
        block (:meth:`layer_params` gives any layer)."""
        if self.is_moe:
            return self.layer_params(max(i for i in range(self.num_layers) if self.is_moe_layer(i)))
        return self.layer_params(0)

    def embedding_params(self) -> int:
        """Input embedding (plus learned position table)."""
        pos = self.max_seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """LM head (0 when tied) plus the final norm."""
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        return (0 if self.tied_embeddings else self.vocab_size * self.hidden_size) + final_norm

    def total_params(self) -> int:
        return self.non_embedding_params() + self.embedding_params() + self.head_params()

    def non_embedding_params(self) -> int:
        if not self.is_moe:
            return self.num_layers * self.params_per_layer()
        return sum(self.layer_params(i) for i in range(self.num_layers))

    def active_params(self) -> int:
        """Parameters one token uses (MoE: top-k routed experts + shared; dense: all)."""
        if not self.is_moe:
            return self.total_params()
        return (sum(self.active_layer_params(i) for i in range(self.num_layers)) + self.embedding_params()
                + self.head_params())
