"""Routing imbalance of a mixture-of-experts layer: the busiest expert-parallel rank's token copies over the mean.

Shared by :mod:`costmodel.graph.moe` (expert GEMM rows) and :mod:`costmodel.memory.moe_memory` (activations of the
busiest GPU), which both size the busiest rank's work, since every rank waits for the busiest at the combine.

Two steps:

1. Expert level. ``V`` = max over experts of routed tokens / mean - 1, the MaxVio of Wang et al. 2024
   ("Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts", arXiv 2408.15664, eq. 4):
   ``plan.moe_imbalance - 1`` where the user states it, else a published figure (:data:`AUX_LOSS_MAXVIO`,
   :data:`AUX_FREE_MAXVIO`, measured over 64 experts) carried to the model's expert count by step 2's assumption
   (:func:`default_maxvio`), capped at the model's capacity factor when it drops tokens.
2. Rank level. A rank holds n = E/EP experts and its load is their sum, so what the step time sees is the max over
   the EP ranks of those sums, not the busiest expert. Assumption (stated, not measured): the experts' loads are
   independent, normally distributed about the mean with relative spread s. The busiest of E experts then sits
   ``e(E)`` spreads above the mean, with ``e(n)`` = E[max of n independent standard normals] (order statistics:
   the integral of x n phi(x) Phi(x)^(n-1)), so s = V / e(E); a rank's sum of n experts has relative spread
   s / sqrt(n), and the busiest of EP ranks sits e(EP) of those above the mean::

       rank imbalance = 1 + V * e(EP) / (e(E) * sqrt(E / EP))

   EP = E gives 1 + V (one expert per rank); EP = 1 gives 1 (every expert local, a rank's total is the mean).
   The micro-batch's sampling noise is left out: under the same independence a rank's count of T x k routed
   copies varies by about 1 / sqrt(T k) relative (0.6 % at T = 4096 tokens and k = 8), small next to the
   routing skew; MaxVio_global (over a whole validation set) also leaves it out, so the default is a lower
   bound of the per-micro-batch imbalance the paper's MaxVio_batch measures (its Fig. 3 plots it above
   MaxVio_global; no table gives it).
"""

from __future__ import annotations

import math
from functools import lru_cache

from costmodel.core.specs.model import ModelSpec
from costmodel.core.specs.plan import ParallelPlan

AUX_LOSS_MAXVIO = 0.52
"""MaxVio of aux-loss-balanced (dropless) routing: Wang et al. 2024, arXiv 2408.15664, Table 2, 3B model
(DeepSeekMoE: 64 routed experts, top-6, 2 shared; auxiliary loss alpha = 0.001, the paper's trade-off choice),
'Loss-Controlled', MaxVio_global = 0.52 (the 1B model: 0.72), averaged over the MoE layers. Averaged over layers
is what the step time needs: each layer waits for its own busiest rank."""

AUX_FREE_MAXVIO = 0.04
"""MaxVio of auxiliary-loss-free (bias-balanced) routing: the same Table 2, 'Loss-Free', 1B and 3B models:
MaxVio_global = 0.04. Used for models whose config.json states DeepSeek-V3's router (``topk_method`` =
``noaux_tc``: the expert-bias balancing of that paper, DeepSeek-V3 report arXiv 2412.19437 sec. 2.1.2)."""

AUX_FREE_TOPK_METHODS = ("noaux_tc",)
"""``config.json`` ``topk_method`` values of the auxiliary-loss-free router (DeepSeek-V3's remote code)."""


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by the trapezoid rule on [-10, 10]."""
    if n <= 1:
        return 0.0
    steps = 8000
    dx = 20.0 / steps
    total = 0.0
    for i in range(steps + 1):
        x = -10.0 + i * dx
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2)))
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * pdf * cdf ** (n - 1)
    return total * dx


MAXVIO_EXPERTS = 64
"""Routed experts of the models the published MaxVio figures were measured on (Wang et al. 2024, arXiv 2408.15664,
sec. 4.1: DeepSeekMoE, 64 routed experts, 6 of them per token, at 1B and 3B)."""


def default_maxvio(model: ModelSpec) -> float:
    """The published MaxVio for the model's router, for its number of experts: :data:`AUX_FREE_MAXVIO` for an
    auxiliary-loss-free router, else :data:`AUX_LOSS_MAXVIO`, both measured over :data:`MAXVIO_EXPERTS` experts.
    Under the module's assumption (independent normal expert loads of relative spread s) a MaxVio V over N experts
    is s e(N), so the same router over E experts has V e(E) / e(N): 0.31 instead of 0.52 over Mixtral's 8."""
    v = AUX_FREE_MAXVIO if model.extra.get("topk_method") in AUX_FREE_TOPK_METHODS else AUX_LOSS_MAXVIO
    return v * expected_max_normal(model.num_experts) / expected_max_normal(MAXVIO_EXPERTS)


BALANCED_ROUTINGS = ("random", "round_robin")
"""ParallelPlan.moe_routing values of benchmark routers that balance the experts by construction: Megatron-Core
--moe-router-force-load-balancing (random logits: every expert equally likely; the micro-batch's sampling noise
is left out, see the module docstring) and NeMo AutoModel's fake_balanced_gate (exactly T k / E per expert)."""


def expert_imbalance(model: ModelSpec, plan: ParallelPlan) -> float:
    """Busiest expert's tokens over the mean: ``plan.moe_imbalance``, else 1 for the benchmark routers of
    :data:`BALANCED_ROUTINGS`, else 1 + :func:`default_maxvio`; capped at the model's ``capacity_factor`` when it
    drops tokens (an expert holds at most capacity_factor x the balanced share; Fedus et al. 2021, Switch
    Transformer, arXiv 2101.03961 sec. 2.2; --moe-expert-capacity-factor)."""
    if plan.moe_imbalance is not None:
        imb = float(plan.moe_imbalance)
    else:
        imb = 1.0 if plan.moe_routing in BALANCED_ROUTINGS else 1.0 + default_maxvio(model)
    if model.capacity_factor > 0:
        imb = min(imb, float(model.capacity_factor))
    return imb


def rank_imbalance(model: ModelSpec, plan: ParallelPlan) -> float:
    """Busiest EP rank's routed token copies over the mean (module docstring): 1 + V e(EP) / (e(E) sqrt(E/EP))."""
    v = expert_imbalance(model, plan) - 1.0
    E, ep = model.num_experts, plan.ep
    if v <= 0 or ep <= 1 or E <= 1:
        return 1.0
    if ep >= E:
        return 1.0 + v
    return 1.0 + v * expected_max_normal(ep) / (expected_max_normal(E) * math.sqrt(E / ep))
