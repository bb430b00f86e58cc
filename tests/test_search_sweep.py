"""The (PP, EP) sweep of MoE studies (planner.search.sweep): basin turns and the sweep's feasible variant."""

from types import SimpleNamespace

from planner.search.space import Candidate
from planner.search.sweep import BASINS, basin_turns, sweep_variant

CHOICES = {"tp": [1, 2, 4, 8], "cp": [1, 2], "mbs": [1, 2, 4], "recompute": ["none", "selective", "full"],
           "zero": [1, 3], "sequence_parallel": [True], "ep": [1, 8, 256], "etp": [0, 1]}


class _Ev:
    """Feasible when ``rule(candidate)`` holds."""

    def __init__(self, rule):
        self.rule = rule

    def feasible(self, c):
        return self.rule(c)


def _c(**kw):
    base = dict(target=0, tp=1, pp=1, cp=1, vpp=1, mbs=1, recompute="full", sequence_parallel=False, zero=3,
                dtype="bf16", framework="megatron", ep=8, etp=0)
    return Candidate(**{**base, **kw})


def test_variant_lowest_zero_and_recompute_first_then_tp_with_sequence_parallel():
    # fits only with TP >= 4, and (as Megatron) EP with TP > 1 only with sequence parallelism
    ev = _Ev(lambda c: c.tp >= 4 and (c.tp == 1 or c.sequence_parallel))
    v = sweep_variant(_c(tp=2, cp=2, sequence_parallel=True), CHOICES, ev)
    assert (v.tp, v.cp, v.zero, v.recompute, v.etp) == (4, 1, 1, "none", 1)
    # from TP 1 (no sequence parallelism) a raised TP takes it, else no variant is valid
    v = sweep_variant(_c(), CHOICES, ev)
    assert v is not None and v.tp == 4 and v.sequence_parallel


def test_variant_none_when_nothing_fits():
    assert sweep_variant(_c(), CHOICES, _Ev(lambda c: False)) is None


def test_basin_turns_rotates_the_best_plans_of_the_best_basins():
    trials = [SimpleNamespace(pp=p, ep=e, v=v) for p, e, v in
              [(16, 8, 1.0), (16, 8, 1.1), (1, 256, 1.2), (2, 256, 1.3), (4, 32, 1.4), (1, 256, 1.5)]]

    def cand(t):
        return t

    heads = [trials[0], trials[2], trials[3]][:BASINS]
    for turn in range(2 * BASINS):
        out = basin_turns(trials, cand, turn)
        k = turn % len(heads)
        assert out[:len(heads)] == heads[k:] + heads[:k]
        assert sorted(map(id, out)) == sorted(map(id, trials))  # a reordering, nothing lost
