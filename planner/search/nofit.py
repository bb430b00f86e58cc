"""When no plan is found: the smallest GPU count at which some plan of the space fits in memory (memory model
only), and the one-line message `planner search`/`compare` print."""

from __future__ import annotations

from dataclasses import replace

from planner.batch import tokens_text
from planner.search.engine import SearchResult
from planner.search.objective import batch_cap_problem
from planner.search.space import (
    Candidate,
    SearchProblem,
    candidate_plan,
    enumerate_candidates,
    factorization_problem,
    make_target,
    offloaded_fit,
)


def _first_fit(problem: SearchProblem) -> Candidate | None:
    """A valid candidate that fits in memory (memory model only), or None."""
    for c in enumerate_candidates(problem):
        target = problem.targets[c.target]
        plan = candidate_plan(problem, c)
        if batch_cap_problem(problem, c) or plan.problems(problem.model):
            continue
        gpu = target.hardware.gpu
        if problem.fits(plan, gpu) or offloaded_fit(problem, plan, gpu) is not None:
            return c
    return None


def min_gpus_to_fit(problem: SearchProblem, gbs_given: bool = False,
                    limit: int = 1 << 20) -> tuple[int, Candidate] | None:
    """Smallest GPU count (whole nodes of the first target's node type) at which some plan of the space
    fits in memory, found with the memory model only: doubling from the problem's count, then the node
    counts in between. The batch is the problem's (a fixed GBS, or each plan's own from its range). None = none up
    to limit."""
    hw = problem.targets[0].hardware
    gpn = hw.gpus_per_node

    def at(world: int):
        p = replace(problem, targets=(make_target(hw, world),))
        c = _first_fit(p)
        return c

    world = max(gpn, -(-problem.targets[0].gpus // gpn) * gpn)
    lo = world
    hit = at(world)
    while hit is None:
        lo, world = world, world * 2
        if world > limit:
            return None
        hit = at(world)
    if world == lo:
        return world, hit
    step = max(gpn, (world - lo) // 32 // gpn * gpn)
    for w in range(lo + step, world, step):
        c = at(w)
        if c is not None:
            return w, c
    return world, hit


def no_fit_message(result: SearchResult, gbs_given: bool = False) -> str:
    """One line explaining why no plan was found, with the GPU count the memory model says is needed."""
    p = result.problem
    mem = result.counts.get("memory", 0)
    if mem == 0:
        reason = result.reasons[0][0] if result.reasons else \
            factorization_problem(p.model, p.targets[0], p.space)
        fix = ("Change the space (--dtype, --framework, --recompute, --zero) or drop that memory flag."
               if any(key in reason for key, _ in p.space.plan_settings)
               else "Widen --tp/--pp/--mbs or change --gbs/--gpus.")
        return (f"no valid plan in the space for {p.model.name} on {p.targets[0].label()}; most common reason: "
                f"{reason}. {fix}")
    gpu = p.targets[0].hardware.gpu
    found = min_gpus_to_fit(p, gbs_given)
    if found is None:
        set_ = dict(p.space.plan_settings)
        features = [flag for key, flag in (("main_grads_dtype", "--main-grads-dtype bf16"),
                                           ("offload_modules", "--offload-modules auto"))
                    if key not in set_ and not (key == "offload_modules" and p.space.offload_auto)]
        more = f", or memory features every plan takes ({', '.join(features)})" if features else ""
        return (f"no plan fits: {p.model.name} does not fit in {gpu.hbm_gb:g} GB GPUs at seq {p.seq_len} with any "
                f"plan of the space on up to {1 << 20} GPUs; add full recompute / ZeRO-3 to the space{more}.")
    n, c = found
    return (f"no plan fits: {p.model.name} needs >= {n} GPUs of {gpu.hbm_gb:g} GB at seq {p.seq_len} with "
            f"{c.recompute} recompute (e.g. TP={c.tp} PP={c.pp} CP={c.cp} MBS={c.mbs} ZeRO={c.zero}"
            f"{f' EP={c.ep} ETP={c.etp or c.tp}' if c.ep > 1 else ''}); "
            f"{mem} of {result.evaluated} candidates exceed memory.")


BUBBLE_NOTE = 0.10
"""Pipeline-bubble share of the best plan's iteration above which a search says the batch limits the pipeline
(a reporting threshold, not a model constant)."""


def search_notes(result: SearchResult) -> list[str]:
    """What a search's answer depends on besides the plans: the batch when it limits scaling (plans refused
    because the batch caps DP; the best plan's pipeline bubble and the batch that shrinks it), a node type that
    --gpus-per-node resized, and the goodput model when time and cost to train are expected values."""
    p, out, b = result.problem, [], result.best
    capped = sum(n for reason, n in result.reasons if reason.startswith("the batch caps DP"))
    if capped and p.batch is not None and b is not None and b.num_microbatches <= 2:
        out.append(f"the batch limits scaling: the best plan fills the batch with {b.num_microbatches} micro-batch(es) "
                   f"per DP rank and {capped} candidates with more DP were refused (the batch range "
                   f"{p.batch.text()} tokens caps DP); a larger --tokens-per-batch admits them")
    if b is not None and b.pp > 1 and b.bubble_fraction >= BUBBLE_NOTE:
        # interleaved 1F1B bubble fraction (PP - 1) / (VPP x m) (Narayanan et al. 2021, sec. 2.2): at most 10 %
        m = -(-10 * (b.pp - 1) // b.vpp)
        out.append(f"the batch limits the pipeline of the best plan: {b.num_microbatches} micro-batches per pipeline "
                   f"of {b.pp} stages, {100 * b.bubble_fraction:.0f} % of the iteration is bubble; {m} micro-batches "
                   f"(a batch of {tokens_text(m * b.mbs * b.dp * b.seq_len)} tokens) bring (PP-1)/(VPP m) to 10 % "
                   "(Narayanan et al. 2021)")
    for resized in dict.fromkeys(t.hardware.cluster.resized for t in p.targets if t.hardware.cluster.resized):
        out.append(resized)
    if p.failures is not None:
        out.append("time and cost to train are expected values, divided by the goodput of the allocation "
                   f"(costmodel.schedule.goodput): {p.failures.describe()}")
    return out
