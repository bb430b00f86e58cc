"""Mixture-of-experts rows of a run file (``shared/validation/moe_runs.csv``, its MOE_README.md defines them).

The MoE run file has the published-runs header plus ``etp``, ``num_experts``, ``top_k``, ``shared_experts`` and
``expert_ffn_hidden``. ``ffn_hidden`` is the width of the *dense* layers' MLP and empty when every layer is MoE;
MLA ranks (DeepSeek-V3, Kimi K2) and head widths are only in ``arch_notes``, which this module parses (no preset
is looked up: the row states the architecture it ran). :func:`moe_refusals` lists why a row cannot be predicted,
:func:`moe_model` builds its ModelSpec and :func:`moe_plan_fields` the expert-parallel fields of its plan
(EP, ETP, dispatcher, routing imbalance, EP-communication overlap). :func:`megatron_flops` counts a step's FLOPs
the way the Megatron-Core TFLOP/s counters of the published sources do, so a ``tflops_per_gpu`` row is compared
in its own convention (rules ``tflops_mcore_full_attention`` / ``tflops_mcore_causal`` of
``search_spaces/validation/published_sources.toml``).

Rows are duck-typed (``values``, ``text``, ``model_name``, ``measured_metric``, ``rule()``) so this module does
not import :mod:`planner.validation.runs` (which imports it).
"""

from __future__ import annotations

import re

from costmodel.core.errors import PlannerError
from costmodel.core.specs.model import ModelSpec

MOE_INT_COLUMNS = ("etp", "num_experts", "top_k", "shared_experts", "expert_ffn_hidden")
"""Integer columns of moe_runs.csv beyond the published-runs header (MOE_README.md)."""

TFLOPS_RULES = ("tflops_mcore_full_attention", "tflops_mcore_causal")
"""Source rules naming the Megatron-Core FLOPs formula behind a source's TFLOP/s (see :func:`megatron_flops`)."""

GPU_HOURS_METRIC = "gpu_hours_per_trillion_tokens"
"""MOE_README.md: GPU-hours per 10^12 training tokens (DeepSeek-V3 report); tokens/s/GPU = 1e12 / (3600 x it)."""


def is_moe_row(row) -> bool:
    """The row describes a mixture-of-experts run (routed experts > 1 or an EP degree)."""
    return (row.values.get("num_experts") or 0) > 1 or (row.values.get("ep") or 0) > 1


def gpu_hours_to_tokens_per_s(gpu_hours_per_trillion: float) -> float:
    """GPU-hours per 10^12 tokens -> tokens/s/GPU (MOE_README.md: 180000 is about 1543 tok/s/GPU)."""
    return 1e12 / (gpu_hours_per_trillion * 3600.0)


# ------------------------------------------------------------------------------------------ refusals
BLOCK_FP8_WORDS = ("mxfp8", "blockwise", "block-wise", "fine-grained", "1x128", "128x128")
"""Precision texts of block-scaled FP8 runs (MOE_README.md: MXFP8 rows, ModelZoo's 'blockwise e4m3')."""


def block_scaled_fp8(text: str) -> bool:
    """The precision text names block-scaled FP8 (MXFP8 or blockwise / 1x128 tiles): planner dtype fp8-block
    (costmodel/cost/fp8_block.py; MXFP8's 1x32 scales approximated by the measured 1x128 / 128x128 UE8M0 blocks)."""
    t = text.lower()
    return "fp8" in t and any(w in t for w in BLOCK_FP8_WORDS)


RECOMPUTE_WORDS = {"norm": "layernorm", "layernorm": "layernorm", "rmsnorm": "layernorm", "act": "moe_act",
                   "moe_act": "moe_act", "shared_expert": "shared_experts", "shared_experts": "shared_experts",
                   "moe": "moe", "mlp": "mlp", "up_proj": "mla_up_proj", "mla_up_proj": "mla_up_proj",
                   "core_attn": "core_attn"}
"""Words of the run files' recompute column -> Megatron-Core --recompute-modules names
(costmodel.core.specs.plan.RECOMPUTE_MODULES): the ModelZoo rows write 'norm, act' for layernorm and moe_act, and
'up_proj' for mla_up_proj; other words ('all', 'and', 'dense-layer') name no module."""


def recompute_modules(text: str) -> tuple[str, ...]:
    """The --recompute-modules of a row's recompute text, in the order stated: the list after
    '--recompute-modules' when quoted, else the words after 'selective:' up to a '+' (what follows a '+' is
    another memory feature, e.g. activation offloading) mapped by :data:`RECOMPUTE_WORDS`; () when the text is not
    selective or names no module (Megatron's default, core_attn). As in Megatron, a stated list replaces the
    default: core_attn is recomputed only when listed."""
    t = text.lower()
    if not t.startswith("selective") or ":" not in t:
        return ()
    quoted = re.search(r"--recompute-modules ([a-z_ ]+)", t)
    head = quoted.group(1) if quoted else t.split(":", 1)[1].split("+")[0]
    words = re.findall(r"[a-z_]+", re.sub(r"up-proj\w*", "up_proj", head))
    out: list[str] = []
    for w in words:
        m = RECOMPUTE_WORDS.get(w)
        if m and m not in out:
            out.append(m)
    return tuple(out)


def moe_refusals(row) -> list[str]:
    """Every MoE-specific reason the row cannot be predicted (empty when it can be mapped)."""
    out = []
    notes = (row.text["arch_notes"] + " " + row.model_name).lower()
    if "hybrid" in notes or "mamba" in notes or "deltanet" in notes:
        out.append("hybrid model (Mamba-2 or Gated DeltaNet linear-attention layers): planner models softmax-"
                   "attention transformer layers only")
    if not (row.values.get("num_experts") or 0) > 1 or not row.values.get("top_k") or \
            not row.values.get("expert_ffn_hidden"):
        return [f"mixture-of-experts run (EP={row.values.get('ep')}) without the MoE columns num_experts, top_k and "
                "expert_ffn_hidden: use the header of shared/validation/moe_runs.csv"]
    if not row.values.get("ep") and not ep_from_notes(row):
        out.append("EP not stated (the source prints '-') and the notes give no benchmark config of the same "
                   "commit that states it: the expert layout is unknown")
    if not row.values.get("gbs"):
        said = next((x.strip() for x in row.text["notes"].split(". ") if "batch size" in x.lower()), "")
        out.append("GBS not stated" + (f" ({said.rstrip('.')})" if said else "")
                   + ": the tokens each GPU processes per step, which set its throughput, are unknown")
    if "dualpipe" in row.text["framework"].lower():
        out.append("DualPipe schedule (bidirectional pipeline, forward and backward chunks of two micro-batches "
                   "overlapped with their all-to-all; DeepSeek-V3 report sec. 3.2.1) is not modelled, and its micro-"
                   "batch size and count are not published")
    if "'baseline' row of the optimization-history table" in row.text["notes"].lower():
        out.append("the write-up's unoptimised baseline, which its authors found host-bound (sec. 2: 'large gaps "
                   "between kernels', the CPU cannot launch kernels as fast as the GPU runs them) before the fusions, "
                   "CUDA graphs and HybridEP of its history table: planner costs GPU-bound kernels and has no model "
                   "of CPU launch overhead")
    if row.measured_metric == "tflops_per_gpu" and not any(row.rule(r) for r in TFLOPS_RULES):
        out.append("tflops_per_gpu of a source whose FLOPs formula is not stated (no tflops_mcore_* rule in "
                   "search_spaces/validation/published_sources.toml): give iteration_time_s or tokens_per_s_per_gpu")
    return out


def stated_pipeline_layout(row) -> str | None:
    """The pipeline layout a row's notes quote in Megatron-Core's --pipeline-model-parallel-layout syntax ("PP
    layout 'Et|(tt|)*30L'": embedding + 1 layer, 30 x 2 layers, loss), or None."""
    m = re.search(r"layout '([EtL|()*0-9,]+)'", row.text["notes"])
    return m.group(1) if m else None


def ep_from_notes(row) -> int | None:
    """EP of a row whose EP column is empty but whose notes quote the benchmark config of the table's own commit
    ('config gptoss_20b_te_deepep.yaml @e4581201 has ep_size 8'); None when not given or the config 'drifted'
    from the table."""
    notes = row.text["notes"].lower()
    m = re.search(r"has ep_size (\d+)", notes)
    return int(m.group(1)) if m and "drifted" not in notes else None


def check_tag_ok(row) -> bool:
    """A CHECK: tag in an MoE row that is not the README's GPU-count mismatch (TP*PP*DP*CP = GPUs holds)."""
    v = row.values
    tp, pp, dp, cp, n = (v.get("tp") or 1), (v.get("pp") or 1), v.get("dp"), (v.get("cp") or 1), v.get("n_gpus")
    return bool(dp and n and tp * pp * dp * cp == n)


# ------------------------------------------------------------------------------------------ model
def _int(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _mla(text: str, notes: list[str]) -> dict:
    """MLA ranks from arch_notes (DeepSeek-V3: 'q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128';
    Kimi K2: 'q_lora 1536, kv_lora 512, qk head 128 + rope 64, v head 128')."""
    kv = _int(r"kv_lora (\d+)", text)
    if not kv:
        return {}
    q = _int(r"q_lora (\d+)", text) or 0
    nope = _int(r"qk_nope (\d+)", text) or _int(r"qk head (\d+)", text)
    rope = _int(r"qk_rope (\d+)", text) or _int(r"\+ rope (\d+)", text)
    v = _int(r"v_head (\d+)", text) or _int(r"v head (\d+)", text)
    if not (nope and rope and v):
        raise PlannerError("MLA ranks in arch_notes incomplete (need kv_lora, qk nope, qk rope and v head widths)")
    notes.append(f"MLA from arch_notes: q_lora {q}, kv_lora {kv}, qk {nope}+{rope}, v {v}")
    return dict(q_lora_rank=q, kv_lora_rank=kv, qk_rope_head_dim=rope, v_head_dim=v, head_dim=nope + rope)


def _first_dense(text: str, row, notes: list[str]) -> int:
    if not row.values.get("ffn_hidden"):
        return 0
    n = _int(r"first (\d+) layers? dense", text)
    if n is None and re.search(r"first layer dense", text):
        n = 1
    if n is None:
        raise PlannerError("ffn_hidden given (dense layers) but arch_notes does not say which layers are dense")
    return n


def moe_model(row, seq_len: int, notes: list[str]) -> ModelSpec:
    """The row's MoE ModelSpec (architecture from its columns and arch_notes; every guess is noted)."""
    v = row.values
    L, h, a = v.get("n_layers"), v.get("hidden"), v.get("n_heads")
    if not L or not h or not a:
        raise PlannerError("n_layers, hidden or n_heads not stated")
    vocab = v.get("vocab")
    if not vocab:
        raise PlannerError("vocab not stated")
    text = row.text["arch_notes"].lower()
    if "squared-relu" in text or "squared relu" in text:
        act = "squared_relu"
    else:
        act = "swiglu"
        if "swiglu" not in text:
            notes.append("activation not stated, assumed SwiGLU (hidden_act silu in the HF configs of Mixtral, "
                         "Qwen3-MoE, DeepSeek-V3, Kimi K2 and Llama 4)")
    bias = "gpt-oss" in row.model_name.lower()
    notes.append("RMSNorm, RoPE, untied embeddings and " + ("biased linears (GPT-OSS config.json: attention_bias, "
                 "expert biases)" if bias else "no linear biases") + " assumed (HF configs of the MoE families in "
                 "moe_runs.csv)")
    mla = _mla(text, notes)
    kv = v.get("n_kv_heads") or a
    if mla:
        kv = a  # MOE_README: for MLA models n_kv_heads = n_heads
    head_dim = mla.get("head_dim") or _int(r"head dim (\d+)", text) or 0
    if head_dim and not mla and head_dim != h // a:
        notes.append(f"head dim {head_dim} from arch_notes (q width {a * head_dim} != hidden {h})")
    expert = v.get("expert_ffn_hidden") or 0
    dense_ffn = v.get("ffn_hidden") or expert
    window = _int(r"(\d+)-token sliding-window", text) or 0
    mtp = _int(r"with mtp depth (\d+)", row.model_name.lower()) or 0
    fields = dict(
        num_experts=v.get("num_experts") or 0, experts_per_token=v.get("top_k") or 0, moe_ffn_hidden_size=expert,
        num_shared_experts=v.get("shared_experts") or 0, first_dense_layers=_first_dense(text, row, notes),
        router="sigmoid" if "sigmoid" in text else "softmax", sliding_window=window,
        sliding_window_every=2 if window and "alternating" in text else (1 if window else 0),
        attention_sinks="attention sinks" in text, mtp_layers=mtp,
        **{k: x for k, x in mla.items() if k != "head_dim"})
    cap = re.search(r"capacity factor ([0-9.]+)", (row.model_name + " " + row.text["notes"]).lower())
    drop = row.rule("moe_token_drop")
    if cap:
        fields["capacity_factor"] = float(cap.group(1))
        notes.append(f"token dropping with capacity factor {cap.group(1)} (padded to capacity)")
    elif drop is not None:
        fields["capacity_factor"] = 1.0
        notes.append(drop.assumption)
    return ModelSpec(name=row.model_name, num_layers=L, hidden_size=h, num_heads=a, num_kv_heads=kv,
                     ffn_hidden_size=dense_ffn, vocab_size=vocab, max_seq_len=seq_len, head_dim=head_dim,
                     activation=act, norm="rmsnorm", position_embedding="rope", linear_bias=bias, source=row.source,
                     extra={"run_id": row.id}, **fields)


# ------------------------------------------------------------------------------------------ plan
def _dispatcher(text: str, notes: list[str]) -> str:
    """--moe-token-dispatcher-type from the framework text: DeepEP / HybridEP kernels are Megatron's flex
    dispatcher; NCCL all-to-all is alltoall."""
    t = text.lower()
    if any(w in t for w in ("deepep", "hybridep", "flex")):
        return "flex"
    if "alltoall" in t or "all-to-all" in t:
        return "alltoall"
    if "allgather" in t or "all-gather" in t:
        return "allgather"
    notes.append("token dispatcher not stated, assumed alltoall (Megatron-Core's recommended dispatcher for EP; "
                 "NeMo's MixtralConfig moe_token_dispatcher_type 'alltoall', nemo/collections/llm/gpt/model/"
                 "mixtral.py @8cfedd72)")
    return "alltoall"


def balanced_routing(row) -> bool:
    """The run forced perfectly balanced routing: --moe-router-force-load-balancing (Megatron) or AutoModel's
    'fake balanced gate' in the notes, or 'forced balanc...' in the model name; a row marked 'this row =
    dropless' is the real router even when its notes quote the forced-balance twin."""
    notes = row.text["notes"].lower()
    if "this row = dropless" in notes:
        return False
    return ("--moe-router-force-load-balancing" in notes or "fake balanced gate" in notes
            or "forced balanc" in row.model_name.lower())


def moe_plan_fields(row, tp: int, notes: list[str]) -> dict:
    """EP, ETP, dispatcher, routing imbalance and EP-comm overlap of the row's plan (ParallelPlan fields)."""
    etp = row.values.get("etp")
    from_notes = re.search(r"\betp (\d+)", row.text["notes"].lower())
    if etp is None and from_notes:
        etp = int(from_notes.group(1))
        notes.append(f"ETP {etp} from the notes (the source's recommended-config file for the same layout)")
    elif etp is None:
        notes.append(f"ETP not stated: Megatron-Core default ETP = TP = {tp}")
    ep = row.values.get("ep")
    if not ep:
        ep = ep_from_notes(row) or 1
        notes.append(f"EP {ep} from the benchmark config the notes quote (the table prints '-')")
    fields = dict(ep=ep, etp=etp, moe_dispatcher=_dispatcher(row.text["framework"], notes))
    modules = recompute_modules(row.text["recompute"])
    if modules:
        fields["recompute_modules"] = modules
        notes.append(f"recompute {row.text['recompute']!r} read as Megatron-Core --recompute-modules "
                     f"{' '.join(modules)}" + ("" if "core_attn" in modules else " (the list replaces the default "
                                                                                 "core_attn)"))
    if balanced_routing(row):
        fields["moe_imbalance"] = 1.0
        fields["moe_routing"] = "round_robin" if "fake balanced gate" in row.text["notes"].lower() else "random"
        notes.append("forced load balancing (perfectly balanced routing): routing imbalance 1.0; "
                     + ("NeMo AutoModel's fake balanced gate: token t to experts t k ... t k + k - 1 (moe_routing "
                        "round_robin)" if fields["moe_routing"] == "round_robin" else
                        "Megatron-Core's random router logits (moe_routing random)"))
    elif "capacity factor" in row.model_name.lower() or row.rule("moe_token_drop") is not None:
        fields["moe_imbalance"] = 1.0
        notes.append("experts padded to capacity: every expert runs its full capacity (imbalance 1.0)")
    else:
        notes.append("real router: planner's default routing imbalance")
    kernels = row.text["framework"].lower().partition("kernels:")[2]
    if re.search(r"\bte\b", kernels) and not any(k in kernels for k in ("flexattn", "sdpa", "flash")):
        # NeMo AutoModel lists its kernels: TE alone = Transformer Engine's fused (cuDNN) attention, not the
        # FlashAttention-2 planner gives PyTorch-native stacks; FlexAttn / TorchSDPA rows keep the framework's
        fields["attention"] = "fused"
        notes.append("attention kernel: Transformer Engine fused attention ('kernels: TE' in the framework text)")
    if "a2a_overlap=1" in row.text["framework"].lower() or "1f1b overlap" in row.text["notes"].lower():
        fields["moe_overlap_comm"] = True
        notes.append("EP all-to-all overlapped with compute (A2A_OVERLAP / --overlap-moe-expert-parallel-comm)")
    return fields


# ------------------------------------------------------------------------------------------ FLOPs
def megatron_flops(model: ModelSpec, global_batch: int, seq_len: int, causal: bool) -> float:
    """FLOPs of one step as Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py)
    counts them, for a GQA or MLA MoE model: 3 (fwd, dgrad, wgrad) x 2 FLOPs per multiply-add over the attention
    projections, the core attention, the dense layers' MLP (ffn_hidden x 3 for SwiGLU), the routed experts' MLP x
    top-k and the shared experts' MLP in every MoE layer, and the logits (h x V); no router GEMM. Multi-token
    prediction (``model.mtp_layers``, --mtp-num-layers; @d98e8a64): each depth one more layer of the last layer's
    kind, its norms (3h) and eh_proj (2h x h), and the logits once more.

    ``causal``: the 2025+ code (checked at NVIDIA/Megatron-LM @001b00c2) halves the core attention ("causal mask
    (only half of the mask is non-zero)"); the 2024 code (MCore v0.8: ``12 B s L h^2 ((1 + g/a + s/h) q/h +
    F/h k 3/2 + V/(2 L h))``) counts the full s x s matrix and one MLP width (ffn_hidden) for all layers.
    """
    h, a, s, V = model.hidden_size, model.num_heads, seq_len, model.vocab_size
    ffn_mult = 3 if model.gated else 2
    tokens = global_batch * s
    mtp = model.mtp_layers
    n_moe = model.num_moe_layers + mtp * model.is_moe_layer(model.num_layers - 1)
    n_dense = model.num_layers + mtp - n_moe
    core = 0.5 if causal else 1.0
    if model.is_mla:
        if not causal:
            raise PlannerError("the 2024 Megatron FLOPs formula has no MLA term")
        nope, rope = model.head_dim - model.qk_rope_head_dim, model.qk_rope_head_dim
        vdim = model.v_head_dim or model.head_dim
        q = (model.q_lora_rank * (h + a * (nope + rope) + 1) if model.q_lora_rank else h * a * (nope + rope))
        attn = (q + model.kv_lora_rank * (h + a * (nope + vdim) + 1) + h * rope + a * vdim * h
                + s * a * (nope + rope) * core + s * a * vdim * core)
    else:
        qd, kvd = model.q_dim, model.kv_dim
        attn = h * (qd + 2 * kvd) + qd * s * core * 2 + qd * h
    mlp = h * (model.ffn_hidden_size * ffn_mult * n_dense
               + (model.expert_ffn * model.experts_per_token + model.shared_ffn) * ffn_mult * n_moe)
    return 6.0 * tokens * (mlp + attn * (model.num_layers + mtp) + mtp * (3 * h + 2 * h * h) + h * V * (1 + mtp))
