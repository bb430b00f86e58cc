"""How the cost of one collective depends on the compute phase before it (issue #4 finding).

    .venv/bin/python benchmarks/collective_gap.py [--bytes 524288] [--gaps 0,2,5,10,20] [--nproc 2]

Launches itself under ``torch.distributed.run`` (gloo, one thread per process). For each gap, every
repeat passes a barrier, runs about ``gap`` ms of GEMMs on every rank, then times one all-reduce; the
printed time is the mean over ranks and over the repeats after the first three. `planner profile`
samples collectives after ``compute_between_s`` (2 ms in the cpu-workload plan); a training step's
collectives follow whatever compute its graph puts before them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def worker(nbytes: int, gaps: list[float], repeats: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    x = torch.randn(max(1, nbytes // 4))
    a, w = torch.randn(256, 512), torch.randn(512, 512)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    t = time.perf_counter()
    for _ in range(20):
        torch.nn.functional.linear(a, w)
    one = (time.perf_counter() - t) / 20
    for gap in gaps:
        reps = round(gap / 1e3 / one)
        ts = []
        for _ in range(repeats + 3):
            dist.barrier()
            for _ in range(reps):
                torch.nn.functional.linear(a, w)
            t = time.perf_counter()
            dist.all_reduce(x)
            ts.append(time.perf_counter() - t)
        mean = torch.tensor([sum(ts[3:]) / repeats], dtype=torch.float64)
        dist.all_reduce(mean)
        if dist.get_rank() == 0:
            print(f"compute before {gap:5.1f} ms ({reps} GEMMs): all-reduce of {nbytes} B "
                  f"{1e3 * float(mean) / dist.get_world_size():.2f} ms (mean over ranks and {repeats} calls)",
                  flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=524288)
    ap.add_argument("--gaps", default="0,2,5,10,20", help="compute before each call, ms (comma-separated)")
    ap.add_argument("--repeats", type=int, default=37)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    gaps = [float(g) for g in a.gaps.split(",") if g.strip()]
    if a.worker:
        from costmodel.profiling.torchrun import exit_worker

        worker(a.bytes, gaps, a.repeats)
        exit_worker(0)  # skip interpreter teardown (see exit_worker)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.nproc}",
           os.path.abspath(__file__), "--worker", "--bytes", str(a.bytes), "--gaps", a.gaps,
           "--repeats", str(a.repeats)]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
