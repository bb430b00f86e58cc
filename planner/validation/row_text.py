"""What a validation row's free text states about its model, node and kernels (arch_notes, notes, framework, gpu,
interconnect columns): stated head width, padded vocabulary, bias and tying, fused loss, CUDA graphs, the quad-GH200
node type and the NVLink domain planner predict would place the job in."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue

if TYPE_CHECKING:  # runs.py imports this module
    from planner.validation.runs import RunRow

def _stated_bias_and_tying(text: str, gpt: bool, notes: list[str]) -> tuple[bool, bool]:
    """(biased linears, tied embeddings): as the arch_notes state them ('no bias', 'bias=False', 'untied', 'tied
    embeddings'), else the GPT family's Megatron defaults (both, for GPT-family rows; neither otherwise)."""
    no_bias = "no bias" in text or "bias=false" in text
    untied = "untied" in text
    tied = re.search(r"(?<!un)tied (input/output )?embeddings|embeddings tied", text) is not None
    bias = gpt and not no_bias
    tying = (gpt or tied) and not untied
    if gpt and (bias or tying):
        what = " and ".join(w for w, on in (("biased linears", bias), ("tied input/output embeddings", tying)) if on)
        notes.append(f"GPT family: {what} assumed (Megatron GPT defaults)" if not (no_bias or tied or untied)
                     else f"GPT family: {what} (as stated or Megatron GPT defaults)")
    return bias, tying


def _stated_head_dim(row: RunRow, h: int, a: int, notes: list[str]) -> int:
    """The per-head width the row's arch_notes state (``kv_channels 128``, ``kv_channels=128``, ``head_dim 128``,
    ``32 heads x 128``; Qwen3 sets kv_channels 128 whatever hidden / heads is), else 0 (= hidden / heads)."""
    m = re.search(r"kv_channels\s*=?\s*(\d+)|head_dim\s*=?\s*(\d+)|heads x (\d+)", row.text["arch_notes"])
    if m is None:
        return 0
    d = int(next(g for g in m.groups() if g))
    if d != h // a:
        notes.append(f"head width {d} as the arch_notes state (not hidden/heads = {h // a})")
    return d


def _padded_vocab(row: RunRow, vocab: int, tp: int, notes: list[str]) -> int:
    """The vocabulary the run computed with, when its arch_notes say the stack padded it: Megatron's
    make-vocab-size-divisible-by (``pads to a multiple of 128*TP``), llm.c's ``pads vocab to N``; else as stated."""
    text = row.text["arch_notes"]
    m = re.search(r"pads vocab to (\d+)", text)
    if m:
        padded = max(vocab, int(m.group(1)))
    elif re.search(r"pads to a multiple of 128\s*\*\s*TP", text):
        padded = -(-vocab // (128 * tp)) * 128 * tp
    else:
        return vocab
    if padded != vocab:
        notes.append(f"vocab {vocab} padded to {padded} as the arch_notes state")
    return padded


CUDA_GRAPHS_ON = re.compile(r"(?<!no )(?<!partial )cuda graphs\b|cuda_graphs 1|"
                            r"cuda_graph_impl (local|transformer_engine|full_iteration)|reduce-overhead|"
                            r"captured as one cuda graph")
"""Row text that states the run's layers replayed from CUDA graphs (negations and partial capture excluded)."""


LOSS_FUSION = re.compile(r"cross[- _]entropy[- _](loss[- _])?fusion|fused [^;,.]*cross[- _]entropy|fused classifier")
"""Row text that states a fused loss (OELLM 'cross-entropy fusion', TinyLlama's 'fused ... cross-entropy')."""
SINGLE_KERNEL_IMPL = re.compile(r"cross[-_ ]entropy[-_ ]fusion[-_ ]impl[ =:]*te\b")
"""Row text that names Megatron-Core's single-kernel loss (--cross-entropy-fusion-impl te)."""


def _loss_fusion(row: RunRow, notes: list[str]) -> bool | None:
    """True when the row's loss ran as one fused kernel: the source rule cross_entropy_fusion (Megatron-Core
    --cross-entropy-fusion-impl te), llm.c (its fused_classifier kernel, karpathy/llm.c train_gpt2.cu) or a non-Megatron
    stack that says it fused the loss (TinyLlama: flash-attn's cross-entropy kernel). A Megatron / NeMo row's
    --cross-entropy-loss-fusion (said in the text, or NeMo's GPT default) is the native impl, Megatron's fp32 chain
    under jit_fuser (costmodel.graph.kernel_basis.MEGATRON_LOSS_BYTES): None, the framework's default, with a note."""
    text = " ".join((row.text["arch_notes"], row.text["notes"])).lower()
    fw = row.text["framework"].lower()
    megatron = any(w in fw for w in ("megatron", "nemo")) and "automodel" not in fw
    rule = row.rule("cross_entropy_fusion")
    if rule is not None or SINGLE_KERNEL_IMPL.search(text):
        notes.append(rule.assumption if rule is not None else "single-kernel loss (--cross-entropy-fusion-impl te)")
        return True
    said = LOSS_FUSION.search(text) is not None
    if megatron and (said or fw.startswith("nemo")):
        notes.append("Megatron's fused loss (" + ("the row says so" if said else "NeMo's default") + ") with the "
                     "native impl: the fp32 vocab-parallel chain, costed as the unfused one")
        return None
    if said or "llm.c" in fw:
        notes.append("fused cross-entropy kernel (" + ("the row says so" if said else "llm.c's fused classifier")
                     + ")")
        return True
    return None


def _cuda_graphs(row: RunRow, notes: list[str]) -> bool:
    """Whether the row's framework / notes text says its kernels replayed from CUDA graphs (Megatron
    cuda_graph_impl local, 'CUDA graphs (local, full scope)', torch.compile mode=reduce-overhead, a captured step);
    'cuda_graph_impl none', 'No CUDA graphs' or nothing said: not."""
    text = " ".join((row.text["framework"], row.text["notes"])).lower()
    if CUDA_GRAPHS_ON.search(text) is None:
        return False
    notes.append("CUDA graphs (the row says so): no per-kernel CPU dispatch")
    return True


NO_DP_OVERLAP = re.compile(r"no (grad(ient)?[-/ _]?(reduce)?[-/ _]?(and |/)?param(eter)?[-/ _]?(gather)? )?overlap")
"""Row text that says the DP gradient reduction and parameter gather were not overlapped ('No grad/param overlap')."""
GRAD_OVERLAP = re.compile(r"overlap[-_ ]grad[-_ ]reduce|overlap grad-reduce")
PARAM_OVERLAP = re.compile(r"overlap[-_ ]param[-_ ]gather|grad-reduce/param-gather")
MEGATRON_LM_ARGPARSE = re.compile(r"^megatron-lm\b")
"""Framework text of a run launched through Megatron-LM's own entry point (pretrain_gpt.py and its argparse
defaults), as opposed to NeMo or a Megatron-Core recipe."""


def _dp_overlap(row: RunRow, notes: list[str]) -> tuple[bool | None, bool | None]:
    """(overlap_grad_reduce, overlap_param_gather) a Megatron row states; None = the framework's default.

    The source rule dp_overlap (its configuration turns both on): on. Stated in the optimizer column or the notes
    ('+ overlap grad-reduce/param-gather', 'No grad/param overlap'):
    as stated. A distributed-optimizer run launched through Megatron-LM's pretrain_gpt.py that names no overlap
    ran with Megatron-LM's argparse defaults, --overlap-grad-reduce and --overlap-param-gather off
    (NVIDIA/Megatron-LM megatron/training/arguments.py: both action='store_true'; the Megatron-Core recipes and
    NeMo turn them on, the framework default here)."""
    dist = row.text["dist_optimizer_or_zero"].lower()
    text = dist + " " + row.text["notes"].lower()
    rule = row.rule("dp_overlap")
    if rule is not None:
        notes.append(rule.assumption)
        return True, True
    if NO_DP_OVERLAP.search(text):
        notes.append("DP gradient reduction and parameter gather not overlapped (the row says so)")
        return False, False
    grad, param = GRAD_OVERLAP.search(text) is not None, PARAM_OVERLAP.search(text) is not None
    if grad or param:
        return (True if grad else None), (True if param else None)
    if "distributed optimizer" in dist and MEGATRON_LM_ARGPARSE.search(row.text["framework"].lower()):
        notes.append("Megatron-LM launch naming no --overlap-grad-reduce / --overlap-param-gather: both off "
                     "(Megatron-LM's argparse defaults)")
        return False, False
    return None, None


TP_OVERLAP = re.compile(r"tp[-_ ]comm[-_ ]overlap(?![-_ :=]*(false|off|0\b))")
"""Row text that states Transformer Engine's TP communication overlap on (Megatron --tp-comm-overlap,
'tp_comm_overlap true', '+ tp_comm_overlap'); 'tp_comm_overlap: false' does not match."""


def _tp_overlap(row: RunRow, notes: list[str]) -> bool:
    """Whether the row's TP all-gathers / reduce-scatters overlapped the GEMMs: the source rule tp_comm_overlap, or
    the row's text saying so."""
    rule = row.rule("tp_comm_overlap")
    said = TP_OVERLAP.search(" ".join((row.text["framework"], row.text["notes"])).lower()) is not None
    if rule is None and not said:
        return False
    notes.append(rule.assumption if rule is not None else "TP communication overlapped with the GEMMs (the row "
                                                            "says tp_comm_overlap)")
    return True


QUAD_NODE_TYPES = {"gh200": (("jupiter", "jupiter-booster"), ("alps", "alps-gh200"), ("cscs", "alps-gh200"),
                             ("isambard", "isambard-ai"))}
"""4-GPU-per-node GPUs -> (word of the row's gpu / interconnect text, catalogue node type): the quad-GH200 NVLink
nodes of JUPITER, CSCS Alps and Isambard-AI (scripts/catalogue_gh200.py); GH200_SMALL_BLACKWELL_README.md: 'JUPITER
and Alps GH200 nodes hold 4 GH200 connected by NVLink'."""


def _quad_node_type(row: RunRow, gpu_key: str, gpn: int, notes: list[str]) -> str:
    """The catalogue node type a 4-GPU-per-node row ran on ('' = the GPU's default node type)."""
    if gpn != 4 or gpu_key not in QUAD_NODE_TYPES:
        return ""
    text = (row.text["gpu"] + " " + row.text.get("interconnect", "")).lower()
    found = next((node for word, node in QUAD_NODE_TYPES[gpu_key] if word in text), "")
    if found:
        notes.append(f"4 {gpu_key} per node: catalogue node type {found}")
    return found


def _row_domain(gpu_key: str, cluster: str, gpn: int, n: int) -> int:
    """GPUs per NVLink domain as planner predict places the job (PlanRequest.resolve; 0 = the node): a GB200 NVL72
    rack spans 18 4-GPU trays, so TP, PP and FSDP groups across trays stay on NVLink."""
    try:
        return load_catalogue().resolve(gpu_key, cluster or None, gpn).domain_for(n)
    except PlannerError:  # a GPU the catalogue does not know (the CPU rows): the node is the domain
        return 0


OTHER_STACKS = (
    ("llmc", ("llm.c",), "hand-written fused CUDA kernels (layernorm, GELU, fused classifier), cuBLASLt GEMMs and "
     "cuDNN flash attention (karpathy/llm.c train_gpt2.cu): framework llmc"),
    ("fsdp", ("lit-gpt", "lightning", "nanogpt", "pytorch"), "a PyTorch-native stack (DDP or FSDP, "
     "scaled_dot_product_attention / flash-attn): framework fsdp"),
)
"""Stacks of the small-model rows (shared/validation/GH200_SMALL_BLACKWELL_README.md) mapped to the framework whose
kernels they run; matched after the named frameworks, so a 'Megatron-Core ... PyTorch 24.04 container' row stays
megatron."""
