import math

from costmodel.core.specs.catalogue import load_catalogue
from costmodel.cost.roofline import RooflineCostModel
from costmodel.graph.conventions import inter_latency_steps
from costmodel.graph.ops import Op


def test_inter_node_latency_grows_with_group_size():
    assert inter_latency_steps("all_reduce", 2) == 1.0
    assert inter_latency_steps("all_reduce", 64) == math.log2(64)
    assert inter_latency_steps("all_gather", 64) == 63
    hw = load_catalogue().resolve("h100-sxm")
    cm = RooflineCostModel()
    small = [Op("all_gather", "x", "fwd", (1024.0, n * 8, n, 8), bytes=1024.0) for n in (2, 16, 128)]
    t = cm.predict(small, hw).time_s
    assert t[0] < t[1] < t[2]
    ar = [Op("all_reduce", "x", "fwd", (1024.0, n * 8, n, 8), bytes=1024.0) for n in (2, 128)]
    ta = cm.predict(ar, hw).time_s
    assert ta[1] / ta[0] < t[2] / t[0]   # tree (log n) grows slower than ring (n - 1)
