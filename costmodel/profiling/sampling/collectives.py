"""Collective micro-benchmarks, run under ``torchrun`` (one process per device / CPU rank).

Launch (what ``planner profile`` does; ``python -m`` so that this environment's Python is used)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m costmodel.profiling.sampling.collectives \\
        --plan cpu-small --out profiles/cpu

The backend is gloo on CPU and NCCL on CUDA. For each collective, group size and message size of the
plan's ``[collectives]`` table, every rank: runs ``warmup`` untimed calls; then ``repeats`` times:
world barrier, (CUDA sync), start clock, ``inner`` calls, (CUDA sync), stop clock; the per-call time is
all-reduced with MAX over the ranks (the collective is as slow as its slowest rank). The recorded time is
the median of those maxima, the spread p90 - p10, ``repeats`` their count. ``inner`` is chosen from the
warm-up so a timed region lasts about ``target_region_s``. Rank 0 writes the journal and the datasets.

Bytes follow the nccl-tests convention (costmodel/graph/ops.py): all_reduce and all_to_all = the buffer;
all_gather = the full *output* buffer (each rank contributes bytes / ranks); reduce_scatter = the full
*input* buffer (each rank keeps bytes / ranks); send_recv = the message. send_recv is a ping-pong between
rank 0 and a partner on the same node and (if any) on another node; the time is half a round trip.

Features: (bytes, ranks, nodes, ranks_per_node), nodes = distinct hosts among the group's ranks (from
the hostnames all ranks report), ranks_per_node = the most ranks of the group on one host.

``[collectives]`` keys: ``ops`` (kinds), ``bytes`` (a list, or ``{min, max, factor}`` for a geometric
series), ``group_sizes`` (ints and/or ``"world"``; groups are ranks 0..g-1), ``warmup``, ``repeats``,
``target_region_s``, ``dtype`` (default fp32 on gloo, bf16 on NCCL), ``compute_between_s`` (default 0),
``barrier_between`` (default false), ``skew_segments_s`` / ``skew_seconds`` (costmodel/profiling/sampling/skew.py),
``corun_seconds`` / ``corun_shapes`` (costmodel/profiling/sampling/corun.py).

``compute_between_s`` > 0 measures each call as a training step issues it, after a compute phase rather
than back to back: every repeat, all ranks run an untimed GEMM burst of about that many seconds, then
time one call each, with no barrier between repeats (as in a step; ``barrier_between = true`` puts one
before every burst); the per-repeat time is the *mean* over the group's ranks (with
arrival skew s the early rank waits s + latency and the late one the latency, and the mean s/2 + latency
is what the slower rank adds to the step), and the recorded time is the mean over repeats (not the
median: the times are bimodal, and a step pays the sum of its calls). On this 2-core VM, gloo all-reduces
of 1 KB-256 KB took
0.44-0.50 ms back to back but 1.3-2.8 ms after 1-3 ms of GEMM compute, and 1.4-2.0 ms inside the TP
training workload (perf_counter around every dist.all_reduce).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodel.core.errors import PlannerError
from costmodel.core.fileio import atomic_write_text
from costmodel.core.kinds import COLLECTIVE_KINDS
from costmodel.fitting.datasets.schema import Dataset, save_dataset
from costmodel.profiling.sampling import corun, require_torch, skew
from costmodel.profiling.sampling.fingerprint import fingerprint, host_hash, identity
from costmodel.profiling.sampling.journal import Journal
from costmodel.profiling.sampling.operators import torch_dtype
from costmodel.profiling.sampling.plan import expand, load_plan, message_sizes, op_timing, resolve_group_sizes
from costmodel.profiling.sampling.runner import JOURNAL_DIR, check_device, progress_bar
from costmodel.profiling.torchrun import exit_worker, failure_reason

ORDER = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def topology(ranks: list[int], hosts: list[str]) -> tuple[int, int]:
    """(nodes, ranks_per_node) of a group of global ranks, given each rank's host id."""
    counts = collections.Counter(hosts[r] for r in ranks)
    return len(counts), max(counts.values())


# ------------------------------------------------------------------------------------------- launcher
def launch(plan: str | Path, out_dir: str | Path, nproc: int = 2, device: str = "cpu", gpu_name: str | None = None,
           resume: bool = True, progress: bool = True, ops: list[str] | None = None,
           timeout_s: float | None = None) -> list[Path]:
    """Run the collective sweep of ``plan`` with ``nproc`` local processes via torchrun; returns dataset paths."""
    torch = require_torch()
    p = load_plan(plan)
    kinds = _kinds(p.collectives, ops)
    if nproc < 2:
        raise PlannerError(f"--nproc must be >= 2 for collectives, got {nproc}")
    if device == "cuda" and torch.cuda.device_count() < nproc:
        raise PlannerError(f"--nproc {nproc} needs {nproc} GPUs but {torch.cuda.device_count()} are visible; lower "
                           "--nproc or use --no-collectives (multi-node: scripts/slurm/collective_sweep.sbatch)")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "costmodel.profiling.sampling.collectives", "--plan", str(p.path), "--out", str(out_dir),
           "--device", device, "--ops", ",".join(kinds)]
    if gpu_name:
        cmd += ["--gpu-name", gpu_name]
    if not resume:
        cmd.append("--no-resume")
    if not progress:
        cmd.append("--no-progress")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    try:
        res = subprocess.run(cmd, env=env, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PlannerError(f"collective sweep did not finish in {timeout_s:.0f} s; use a smaller plan") from None
    if res.returncode != 0:
        raise PlannerError(f"collective sweep failed (torchrun exit {res.returncode}): {failure_reason(res.stderr)}")
    out = Path(out_dir)
    return [out / f"{k}.csv" for k in kinds if (out / f"{k}.csv").is_file()]


def _kinds(spec: dict, ops: list[str] | None) -> list[str]:
    kinds = list(spec.get("ops", []))
    if not kinds:
        raise PlannerError("the plan has no [collectives] ops; add a [collectives] table or use --no-collectives")
    if ops is not None:
        bad = [k for k in ops if k not in COLLECTIVE_KINDS]
        if bad:
            raise PlannerError(f"unknown collective(s) {', '.join(bad)}; choose from {', '.join(ORDER)}")
        kinds = [k for k in kinds if k in ops]
    return kinds


# --------------------------------------------------------------------------------------------- worker
class _Ctx:
    """Per-process state of the worker."""

    def __init__(self, device: str, dtype: str) -> None:
        import torch  # deferred: torch is optional (planner[profile]); the worker runs under torchrun
        import torch.distributed as dist  # deferred: as torch

        self.torch, self.dist = torch, dist
        self.device = device
        self.cuda = device == "cuda"
        if self.cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if self.cuda else "gloo")
        self.backend = dist.get_backend()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dev = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        hosts: list = [None] * self.world
        dist.all_gather_object(hosts, host_hash())
        self.hosts = hosts
        self.dtype_name = dtype
        self.dtype = torch_dtype(dtype)
        self.esize = ELEMENT_BYTES[dtype]

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def barrier(self) -> None:
        if self.cuda:
            self.dist.barrier(device_ids=[self.dev.index])
        else:
            self.dist.barrier()

    def sum_over_ranks(self, x: float) -> float:
        t = self.torch.tensor([x], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t)
        return float(t.item())

    def mean_over_ranks(self, x: float) -> float:
        return self.sum_over_ranks(x) / self.world

    def max_over_ranks(self, x: float) -> float:
        t = self.torch.tensor([x], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def min_over_ranks(self, x: float) -> float:
        return -self.max_over_ranks(-x)


def _op(ctx: _Ctx, kind: str, nbytes: int, ranks: list[int], group, impl: dict):
    """(statement, exact bytes) for one collective; ``impl[kind]`` records the API used."""
    torch, dist = ctx.torch, ctx.dist
    g = len(ranks)
    n = max(g, nbytes // ctx.esize // g * g)  # elements: a multiple of the group size
    exact = n * ctx.esize
    full = torch.randn(n, device=ctx.dev).to(ctx.dtype)
    part = full[: n // g].clone()
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(full, group=group)), exact
    api = impl.get(kind) or tensor_form(dist, kind)
    if kind == "all_gather":
        if api in TENSOR_FORMS[kind]:
            return (lambda: getattr(dist, api)(full, part, group=group)), exact
        outs = list(full.chunk(g))
        return (lambda: dist.all_gather(outs, part, group=group)), exact
    if kind == "reduce_scatter":
        if api in TENSOR_FORMS[kind]:
            return (lambda: getattr(dist, api)(part, full, group=group)), exact
        ins = list(full.chunk(g))
        return (lambda: dist.reduce_scatter(part, ins, group=group)), exact
    if kind == "all_to_all":
        out = torch.empty_like(full)
        if api in TENSOR_FORMS[kind]:
            return (lambda: dist.all_to_all_single(out, full, group=group)), exact
        ins, outs = list(full.chunk(g)), list(out.chunk(g))
        return (lambda: dist.all_to_all(outs, ins, group=group)), exact
    if kind == "send_recv":
        a, b = ranks
        n = max(1, nbytes // ctx.esize)
        msg = torch.randn(n, device=ctx.dev).to(ctx.dtype)

        def pingpong():  # two one-way transfers; the caller halves the time
            if ctx.rank == a:
                dist.send(msg, b)
                dist.recv(msg, b)
            elif ctx.rank == b:
                dist.recv(msg, a)
                dist.send(msg, a)
        return pingpong, n * ctx.esize
    raise PlannerError(f"unknown collective {kind!r}")


# Single-tensor APIs, newest first (torch 2.13 deprecates *_into_tensor / *_tensor for *_single), and the
# list-of-tensors fallback used when a backend lacks the single-tensor form.
TENSOR_FORMS = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
                "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
                "all_to_all": ("all_to_all_single",)}
FALLBACK = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all"}


def tensor_form(dist, kind: str) -> str | None:
    """The newest single-tensor API this torch has for ``kind`` (None for all_reduce / send_recv)."""
    return next((n for n in TENSOR_FORMS.get(kind, ()) if hasattr(dist, n)), None)


def _compute_burst(ctx: _Ctx, seconds: float):
    """An untimed GEMM workload of about ``seconds`` on this rank (calibrated once, on warm calls: timing the
    first calls would count their cold start and make a "2 ms" burst one 0.9 ms GEMM on the CPU), the same
    number of GEMMs on every rank (the mean calibration over the ranks);
    ``burst.reps`` is that number."""
    torch = ctx.torch
    a = torch.randn(256, 512, device=ctx.dev)
    w = torch.randn(512, 512, device=ctx.dev)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(10):
        torch.nn.functional.linear(a, w)
    ctx.sync()
    one = max((time.perf_counter() - t0) / 10, 1e-6)
    if getattr(ctx, "world", 1) > 1:
        # every rank runs the same number of GEMMs, as every rank of a step runs the same layers: calibrated
        # per rank, a hiccup during one rank's calibration gave the ranks bursts of different lengths, which
        # the skew measurement then read as a systematic 16-32 % speed difference at one segment length
        # (2 of 3 profiles on 2026-11-25, while the other lengths agreed on ~2 %)
        one = ctx.mean_over_ranks(one)
    reps = max(1, round(seconds / one))

    def burst():
        for _ in range(reps):
            torch.nn.functional.linear(a, w)
    burst.reps = reps  # type: ignore[attr-defined]  # the GEMM count, read by the skew measurement
    return burst


def _time_after_compute(ctx: _Ctx, fn, member: bool, per_call: float, group_size: int, spec: dict) -> list:
    """Per-repeat times of single calls issued after a compute burst (module docstring), mean over ranks.

    The repeats run as a training step issues its collectives: compute, collective, compute, ... with no
    barrier in between (``barrier_between = true`` in the plan restores one before every repeat). A
    barrier lines the ranks up before each burst; a step has none, so each call starts with the skew the
    previous call left (a ring all-reduce releases its ranks one message apart). On the 2-core VM a
    512 KiB gloo all-reduce after 5 ms of GEMMs took 1.98 / 2.23 / 2.61 ms with a barrier before each
    burst and 2.27 / 2.69 / 3.17 ms without (three interleaved rounds), against 2.58-2.62 ms per call
    inside the TP training step of the 4-layer validation model (perf_counter around every all-reduce).
    The per-rank times are summed over the ranks once, after the loop."""
    burst = _compute_burst(ctx, float(spec["compute_between_s"]))
    aligned = bool(spec.get("barrier_between", False))
    local = []
    ctx.barrier()
    for _ in range(int(spec.get("repeats", 10))):
        if aligned:
            ctx.barrier()
        burst()
        ctx.sync()
        t0 = time.perf_counter()
        if member:
            fn()
        ctx.sync()
        local.append((time.perf_counter() - t0) / per_call if member else 0.0)
    t = ctx.torch.tensor(local, dtype=ctx.torch.float64, device=ctx.dev)
    ctx.dist.all_reduce(t)
    return (t / group_size).tolist()


def _time(ctx: _Ctx, kind: str, nbytes: int, ranks: list[int], group, spec: dict, impl: dict) -> tuple:
    """(per-repeat times per call -- max over ranks, or the mean after compute --, exact bytes);
    every rank calls this."""
    member = ctx.rank in ranks
    fn, exact = _op(ctx, kind, nbytes, ranks, group, impl)
    per_call = 2.0 if kind == "send_recv" else 1.0  # a ping-pong is two one-way transfers
    if float(spec.get("compute_between_s", 0) or 0) > 0:
        for _ in range(max(1, int(spec.get("warmup", 3)))):
            if member:
                fn()
        return _time_after_compute(ctx, fn, member, per_call, len(ranks), spec), exact
    warmup = max(1, int(spec.get("warmup", 3)))
    ctx.barrier()
    t0 = time.perf_counter()
    if member:
        for _ in range(warmup):
            fn()
    ctx.sync()
    est = ctx.max_over_ranks((time.perf_counter() - t0) / warmup)
    inner = int(min(1000, max(1, math.ceil(float(spec.get("target_region_s", 0.005)) / max(est, 1e-7)))))
    times = []
    for _ in range(int(spec.get("repeats", 10))):
        ctx.barrier()
        ctx.sync()
        t0 = time.perf_counter()
        if member:
            for _ in range(inner):
                fn()
        ctx.sync()
        dt = (time.perf_counter() - t0) / inner / per_call if member else 0.0
        times.append(ctx.max_over_ranks(dt))
    return times, exact


def _probe_impl(ctx: _Ctx, kinds: list[str]) -> tuple[dict, dict]:
    """Which API each collective uses on this backend: the tensor form, else the list form, else skipped."""
    impl, unsupported = {}, {}
    world = list(range(ctx.world))
    err = "failed on another rank"
    for kind in kinds:
        if kind not in FALLBACK:
            continue
        for form in (tensor_form(ctx.dist, kind), FALLBACK[kind]):
            if form is None:
                continue
            trial = {kind: form}
            ok = 1.0
            try:
                fn, _ = _op(ctx, kind, 64 * ctx.world, world, None, trial)
                fn()
                ctx.sync()
            except (RuntimeError, AttributeError, NotImplementedError, ValueError) as exc:
                ok = 0.0
                err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            if ctx.min_over_ranks(ok) > 0:  # supported everywhere
                impl[kind] = form
                break
        else:
            unsupported[kind] = f"{ctx.backend} supports neither form ({err})"
    return impl, unsupported


def _needs_measuring(ctx: _Ctx, path: Path, ident: dict, resume: bool) -> bool:
    """Whether a per-machine measurement file must be (re)made: not when resuming and ``path`` holds one of
    this machine (same identity) on as many ranks. Rank 0 decides, every rank gets the answer."""
    flag = [True]
    if ctx.rank == 0 and resume and path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            flag = [not (isinstance(old, dict) and old.get("identity") == ident and old.get("ranks") == ctx.world)]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            flag = [True]
    ctx.dist.broadcast_object_list(flag, src=0)
    return bool(flag[0])


def _write_measurement(ctx: _Ctx, path: Path, result: dict, ident: dict, fp: dict) -> None:
    if ctx.rank == 0:
        result.update(identity=ident, fingerprint=fp)
        atomic_write_text(path, json.dumps(result, indent=1) + "\n")


def _sync_skew(ctx: _Ctx, spec: dict, out: Path, ident: dict, fp: dict, resume: bool) -> None:
    """Measure the ranks' speed skew (costmodel/profiling/sampling/skew.py) when the plan asks for it; rank 0 writes
    ``sync_skew.json``. Skipped when a file of this machine (same identity) is there and resuming."""
    segments = spec.get("skew_segments_s")
    if not segments or not _needs_measuring(ctx, out / skew.SKEW_FILE, ident, resume):
        return
    result = skew.measure(ctx, list(segments), float(spec.get("skew_seconds", 40)),
                          lambda seconds: _compute_burst(ctx, seconds))
    _write_measurement(ctx, out / skew.SKEW_FILE, result, ident, fp)


def _corun(ctx: _Ctx, plan, spec: dict, out: Path, ident: dict, fp: dict, resume: bool) -> None:
    """Measure the co-run slowdown of the plan's compute operators (costmodel/profiling/sampling/corun.py) when the
    plan asks for it; rank 0 writes ``corun.json``. Skipped like the skew file."""
    seconds = float(spec.get("corun_seconds", 0) or 0)
    if seconds <= 0 or not plan.ops or not _needs_measuring(ctx, out / corun.CORUN_FILE, ident, resume):
        return
    result = corun.measure(ctx, expand(plan), seconds, int(spec.get("corun_shapes", 4)), ctx.device,
                           flush_mb=lambda kind: op_timing(plan, kind).flush_mb)
    _write_measurement(ctx, out / corun.CORUN_FILE, result, ident, fp)


def worker(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m costmodel.profiling.sampling.collectives")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gpu-name", default=None)
    ap.add_argument("--ops", default=None)
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    try:
        return _worker(a)
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


@dataclass
class _Sweep:
    """What every rank samples: the same list of (kind, bytes, ranks, group) on every rank."""

    ctx: _Ctx
    kinds: list[str]
    dtype: str
    impl: dict
    """Collective kind -> the torch.distributed API that runs it (:func:`_probe_impl`)."""
    unsupported: dict
    """Collective kind -> why this backend cannot run it."""
    samples: list[tuple]

    def key(self, kind: str, b: int, ranks: list[int]) -> str:
        nodes, rpn = topology(ranks, self.ctx.hosts)
        return f"{kind}|fwd|{self.dtype}|{self.impl.get(kind, kind)}|{b}|{len(ranks)}|{nodes}|{rpn}"


def _group_pairs(ctx: _Ctx, spec: dict) -> tuple[list[int], dict, list[int]]:
    """(group sizes sampled, size -> process group (None = the world), send_recv partners of rank 0: one on its
    host and one on another, where there are)."""
    group_sizes, too_big = resolve_group_sizes(spec.get("group_sizes", ["world"]), ctx.world)
    if too_big and ctx.rank == 0:
        print(f"note: group sizes {too_big} exceed the {ctx.world} launched ranks and are not sampled "
              f"(launch with --nproc {max(too_big)} to sample them)", file=sys.stderr, flush=True)
    groups = {g: (None if g == ctx.world else ctx.dist.new_group(list(range(g)))) for g in group_sizes}
    same = [r for r in range(1, ctx.world) if ctx.hosts[r] == ctx.hosts[0]]
    other = [r for r in range(1, ctx.world) if ctx.hosts[r] != ctx.hosts[0]]
    return group_sizes, groups, [p[0] for p in (same, other) if p]


def _sweep(ctx: _Ctx, spec: dict, kinds: list[str], dtype: str) -> _Sweep:
    sizes = message_sizes(spec.get("bytes", [1 << 20]))
    group_sizes, groups, partners = _group_pairs(ctx, spec)
    impl, unsupported = _probe_impl(ctx, kinds)
    samples = []
    for kind in kinds:
        if kind in unsupported:
            continue
        pairs = [([0, p], None) for p in partners] if kind == "send_recv" else \
            [(list(range(g)), groups[g]) for g in group_sizes]
        for ranks, group in pairs:
            for b in sizes:
                samples.append((kind, b, ranks, group))
    return _Sweep(ctx, kinds, dtype, impl, unsupported, samples)


def _open_journals(sw: _Sweep, out: Path, ident: dict, resume: bool) -> tuple[dict[str, Journal], list[tuple]]:
    """(rank 0's journal per kind, the samples no journal holds yet: the same list on every rank)."""
    journals: dict[str, Journal] = {}
    todo_flags: list = [None]
    if sw.ctx.rank == 0:
        journals = {k: Journal(out / JOURNAL_DIR / f"{k}.jsonl", k, ident, resume) for k in sw.kinds}
        todo_flags = [[sw.key(k, b, r) not in journals[k] for k, b, r, _ in sw.samples]]
    sw.ctx.dist.broadcast_object_list(todo_flags, src=0)
    return journals, [s for s, flag in zip(sw.samples, todo_flags[0]) if flag]


def _measure(sw: _Sweep, todo: list[tuple], journals: dict[str, Journal], spec: dict, progress: bool) -> None:
    """Time every sample of ``todo``; rank 0 journals each as it finishes."""
    ctx = sw.ctx
    bar = progress_bar(ctx.rank == 0 and progress)
    after_compute = float(spec.get("compute_between_s", 0) or 0) > 0
    with bar:
        task = bar.add_task("collectives", total=len(sw.samples), completed=len(sw.samples) - len(todo))
        for kind, b, ranks, group in todo:
            bar.update(task, description=f"{kind} {len(ranks)} ranks {b} B")
            times, exact = _time(ctx, kind, b, ranks, group, spec, sw.impl)
            if ctx.rank == 0:
                arr = np.asarray(times)
                p10, p50, p90 = np.percentile(arr, [10, 50, 90])
                # after compute the per-call times are bimodal (prompt or late wake-up of a rank); a
                # step pays their sum, so the expected (mean) time is recorded, else the median
                center = float(arr.mean()) if after_compute else float(p50)
                nodes, rpn = topology(ranks, ctx.hosts)
                journals[kind].append({"key": sw.key(kind, b, ranks), "status": "ok", "features":
                                       [exact, len(ranks), nodes, rpn], "time_s": center,
                                       "spread_s": float(p90 - p10), "repeats": len(times), "dtype": sw.dtype,
                                       "direction": "fwd", "impl": sw.impl.get(kind, kind),
                                       "unix_time": round(time.time(), 3)})
            bar.advance(task)


def _save_datasets(sw: _Sweep, journals: dict[str, Journal], plan, spec: dict, gpu, device: str, fp: dict,
                   out: Path) -> None:
    """Rank 0: one dataset per kind from its journal (in sample order), then close the journals."""
    ctx = sw.ctx
    for kind in sw.kinds:
        found = [journals[kind].records.get(sw.key(k, b, r)) for k, b, r, _ in sw.samples if k == kind]
        recs = [r for r in found if r is not None]
        journals[kind].close()
        if not recs:
            continue
        impl = sw.impl.get(kind, kind)
        meta = {"fingerprint": fp,
                "sources": [{"path": f"harness:{plan.path.name}", "sha256": plan.sha256,
                             "rows_in": len(recs), "rows_kept": len(recs), "filters": [],
                             "journal": f"{kind}.jsonl"}],
                "notes": (f"Measured by costmodel.profiling.sampling.collectives over torch.distributed "
                          f"({ctx.backend}, "
                          f"{impl}): median over repeats of the per-call time maxed over "
                          "ranks; bytes in the nccl-tests convention." +
                          (" send_recv = half a ping-pong round trip." if kind == "send_recv" else "")),
                "sampling": {"plan": plan.name, "device": device, "backend": ctx.backend,
                             "impl": impl, "unsupported": sw.unsupported,
                             "collectives": {k: v for k, v in spec.items() if k != "ops"}}}
        ds = Dataset(kind, gpu, np.array([r["features"] for r in recs], dtype=float),
                     np.array(["fwd"] * len(recs), dtype=object), np.array([sw.dtype] * len(recs), dtype=object),
                     np.array([r["time_s"] for r in recs]), np.array([r["spread_s"] for r in recs]),
                     np.array([r["repeats"] for r in recs], dtype=float), np.arange(len(recs)), meta)
        save_dataset(ds, out / f"{kind}.csv")
    if sw.unsupported:
        print("collectives not supported here: " + "; ".join(f"{k}: {v}" for k, v in sw.unsupported.items()),
              file=sys.stderr, flush=True)


def _worker(a) -> int:
    plan = load_plan(a.plan)
    spec = plan.collectives
    kinds = _kinds(spec, a.ops.split(",") if a.ops else None)
    gpu = check_device(a.device, a.gpu_name)
    dtype = spec.get("dtype", "bf16" if a.device == "cuda" else "fp32")
    ctx = _Ctx(a.device, dtype)
    sw = _sweep(ctx, spec, kinds, dtype)
    fp = fingerprint(a.device, ctx.torch.get_num_threads())
    fp.update(backend=ctx.backend, world_size=ctx.world, nodes=len(set(ctx.hosts)))
    ident = {**identity(fp), "backend": ctx.backend}
    out = Path(a.out)
    journals, todo = _open_journals(sw, out, ident, not a.no_resume)
    _measure(sw, todo, journals, spec, not a.no_progress)
    _sync_skew(ctx, spec, out, ident, fp, not a.no_resume)
    _corun(ctx, plan, spec, out, ident, fp, not a.no_resume)
    if ctx.rank == 0:
        _save_datasets(sw, journals, plan, spec, gpu, a.device, fp, out)
    ctx.dist.barrier()
    ctx.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_worker(worker())  # results written, group destroyed: skip interpreter teardown (see exit_worker)
