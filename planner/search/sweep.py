"""The (PP, EP) sweep of a study's local search (planner.search.engine._polish).

Memory ties pipeline and expert parallelism (fewer experts per GPU leave room for fewer stages), so an MoE
space falls into (PP, EP) basins that the local moves of the polish cannot cross: the sweep carries the
best plan found to every (PP, EP) pair first. Dense spaces with a choice of PP are swept over PP (EP 1): their
optimum can sit in another PP basin than the plan Optuna found first (llama-13b on 128 A100-80GB, roofline
costs: PP2 / VPP4 / ZeRO-1 is the optimum and PP1 / ZeRO-3 a local optimum 1.7 % slower, where 3 of 6 seeds
ended without the sweep, none with it over 10 seeds).
"""

from __future__ import annotations

from planner.search.objective import Evaluator
from planner.search.space import Candidate, candidate_params


def sweep_variant(c: Candidate, choices: dict, ev: Evaluator) -> Candidate | None:
    """``c`` at the lowest ZeRO stage and recomputation of the space, made feasible by the fewest steps of
    micro-batch (down), TP (up, CP down to keep TP x CP), recomputation (up) and ZeRO stage (up) (memory checks
    only), else None; on a tie more TP before more recomputation (DeepSeek-V3 on 2,048 H100: TP4 CP1 selective
    at PP1 / EP256 is the optimum, TP2 CP2 full recompute 39 % slower). The lowest stages first, not the best
    plan's: ZeRO-3 gathers the weights again for every micro-batch, which pipeline parallelism multiplies (a
    ZeRO-3 plan carried from PP1 to PP16 is many times slower than the ZeRO-1 plan there), and the memory that
    forced full recomputation at one (PP, EP) is often free at another (DeepSeek-V3 / 1,024 H100: full
    recompute carried from PP1 / EP256 to PP16 / EP4 and EP8 ended 38 % off the optimum, selective there).
    ETP is set to the space's smallest explicit degree (1 by default: experts not split by TP, the choice of
    Megatron-LM's Mixtral and DeepSeek recipes, SearchSpace.etp): ETP = TP carried with a larger TP was the
    other cause of that 38 % miss."""
    mbs = [m for m in choices["mbs"] if m <= c.mbs][::-1]
    rcs = list(choices["recompute"])
    c = c._replace(etp=min([e for e in choices.get("etp", []) if e > 0] or [c.etp]))
    tps = [t for t in choices["tp"] if t >= c.tp]
    best = None
    for zi, z in enumerate(choices["zero"]):
        for rc in rcs:
            for ti, tp in enumerate(tps):
                # more TP with CP lowered as far as it goes (TP x CP kept where the space allows)
                cp = max([x for x in choices["cp"] if x * tp <= c.cp * c.tp] or [min(choices["cp"])])
                for m in mbs:
                    # a TP raised from 1 takes sequence parallelism (Megatron: EP with TP needs it)
                    seqp = c.sequence_parallel or (tp > c.tp and True in choices["sequence_parallel"])
                    n = c._replace(tp=tp, cp=cp, mbs=m, recompute=rc, zero=z, sequence_parallel=seqp)
                    d = 10 * zi + rcs.index(rc) + ti + mbs.index(m)
                    if (best is None or d < best[0]) and ev.feasible(n):
                        best = (d, n)
    return best[1] if best else None


def group_sweep(study, obj, choices: dict, budget: int, tick, ev: Evaluator, cand) -> int:
    """The best feasible trial moved to every (PP, EP) pair (EP 1 for dense spaces; VPP
    kept where that PP allows it), made feasible by :func:`sweep_variant`, enqueued and evaluated. Memory
    ties PP and EP (fewer experts per GPU leave room for fewer stages), so the search space falls into
    (PP, EP) basins far apart in the local moves of :func:`planner.search.engine._polish`: DeepSeek-V3 on
    1,024 H100 has its optimum at PP16 / EP8 and a local optimum 29 % slower at PP1 / EP256 (exhaustive search).
    Returns the unspent budget."""
    import optuna  # deferred: Optuna takes about half a second to import

    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ok = sorted((t for t in trials if t.user_attrs.get("status") == "ok"), key=lambda t: t.value)
    if not ok:
        return budget
    seen = {cand(t) for t in trials}
    best = cand(ok[0])
    todo: list[Candidate] = []
    for pp in choices["pp"]:
        vpps = choices.get(f"vpp@pp{pp}", [1]) if pp > 1 else [1]
        for ep in choices.get("ep", [best.ep]):
            c = best._replace(pp=pp, ep=ep, vpp=best.vpp if best.vpp in vpps else 1)
            r = sweep_variant(c, choices, ev)
            if r is not None and r.canonical() not in seen and r.canonical() not in todo:
                todo.append(r.canonical())
    batch = todo[:budget]
    for n in batch:
        study.enqueue_trial(candidate_params(n, choices))
    if batch:
        study.optimize(obj, n_trials=len(batch), callbacks=[tick], gc_after_trial=False)
    return budget - len(batch)


BASINS = 3
"""(PP, EP) basins whose best plans the local search of an MoE study improves in turn. DeepSeek-V3 on 2,048
H100 (default space) has its optimum at PP1 / EP256 and a local optimum 7.5 % slower at PP16 / EP8; after the
sweep PP1 / EP256 ranked second or third, behind PP16 / EP8 and PP2 / EP256, and with the best basin alone
(1) or the best two (2) the search ended 7.5 % off for 4 and 1 of 6 seeds, with 3 for none (exhaustive
search as reference; DeepSeek-V3 / 1,024 and Qwen3-235B-A22B / 256 H100: 6 of 6 with 2 and 3)."""


def basin_turns(ok: list, cand, turn: int) -> list:
    """Feasible trials ``ok`` (best first) reordered for round ``turn`` of the local search: the best trial of
    each of the BASINS best (PP, EP) pairs in turn first, then the others as before."""
    heads: dict[tuple, object] = {}
    for t in ok:
        c = cand(t)
        heads.setdefault((c.pp, c.ep), t)
        if len(heads) == BASINS:
            break
    firsts = list(heads.values())
    if not firsts:
        return ok
    k = turn % len(firsts)
    order = firsts[k:] + firsts[:k]
    ids = {id(t) for t in order}
    return order + [t for t in ok if id(t) not in ids]
