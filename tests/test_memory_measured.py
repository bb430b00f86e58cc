"""Predicted memory against every run with a stated peak memory (within 10 %), and the published runs that must fit.

Sources (data-backed: ../shared; Korthikanti et al.'s Table 2 and Figures 1 and 7 are tests/test_memory.py):
* torchtitan-e2e (shared/data/torchtitan-e2e, PROVENANCE.md): torchtitan's benchmark tables print the peak memory the
  caching allocator reserved (torchtitan DeviceMemoryMonitor ``max_reserved``), which holds neither the CUDA context
  nor NCCL's buffers: compared with the total less ``workspace`` (the allocator's fragmentation term included).
* JUPITER (shared/validation/gh200_small_blackwell_runs.csv, row notes "93% mem (stated)"; the 70 % of the mbs-2 arm
  is in the same source file, OpenEuroLLM/oellm-autoexp@46a627d8 config/experiments/megatron_jupiter_speed/
  dense_9B_baby_tune2.yaml: "mem 70->93%"): the fraction of the GPU's memory in use, of a 96 GB (96e9-byte) GH200, the
  capacity the catalogue gives (the source does not define its "mem usages" figure further).
"""

from __future__ import annotations

import csv

import pytest

from costmodel.core.errors import PlannerError
from costmodel.core.specs.catalogue import load_catalogue
from costmodel.memory import per_gpu as mem
from planner.requests import PlanRequest
from planner.validation.runs import load_runs, row_to_inputs

GIB = 2**30
MODELS = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b", "llama3.1-405b": "llama3-405b"}
GAPS = {
    "4": "70B 2D (FSDP 32 x TP 8, MBS 16, full AC, Float8, async TP): the loss_parallel cross entropy's temporaries "
         "and torchao Float8's saved tensors are not modelled (-20 to -24 %)",
    "5": "405B 3D (PP 8): torchtitan keeps FSDP units gathered and their gradients unsharded across micro-batches "
         "under PP (reshard_after_forward 'default' = not PP), not modelled by default (-70 %)",
    "6": "405B 4D (PP 8, CP up to 8, 32k-256k tokens): as table 5 (-57 to -62 %)",
    "results": "H200 Trainy runs at torchtitan e7c0cae: the compiled loss (compile.components model+loss) does not "
               "materialise the fp32 logits that the 12-byte loss term counts (+37 %)",
}


def torchtitan_rows(data) -> list[dict]:
    with open(data / "torchtitan-e2e" / "torchtitan_training_throughput.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["memory_gib"]]


def torchtitan_prediction(r: dict) -> float:
    """GiB the caching allocator holds at the peak for a torchtitan-e2e row (FSDP2 = ZeRO-3; eager rows on the
    eager framework; 500 W H100 96 GB as PROVENANCE.md states)."""
    n, tp, pp, cp, dp = (int(r[k]) for k in ("num_gpus", "tp", "pp", "cp", "dp_shard_fsdp"))
    lbs = int(r["local_batch_size"])
    req = PlanRequest(model=MODELS[r["model"]], gpu="h200" if r["gpu"] == "H200" else "h100-sxm-500w", gpus=n,
                      tp=tp, pp=pp, cp=cp, vpp=2 if "Interleaved" in r["pp_schedule"] else 1,
                      mbs=1 if pp > 1 else lbs, gbs=lbs * dp, seq_len=int(r["seq_len"].rstrip("*")),
                      recompute="full" if r["activation_checkpointing"] == "full" else "selective", zero=3,
                      framework="torchtitan-eager" if r["torch_compile"] == "no" else "torchtitan")
    res = req.resolve()
    b = mem.memory_per_gpu(res.model, res.plan, res.hardware.gpu)
    return (b.total - b.workspace) / GIB


def _cases():
    from costmodel.core.paths import data_dir

    d = data_dir()
    if d is None:
        return [pytest.param(None, id="no-shared-data")]
    out = []
    for i, r in enumerate(torchtitan_rows(d)):
        marks = [pytest.mark.xfail(strict=True, reason=GAPS[r["table"]])] if r["table"] in GAPS else []
        out.append(pytest.param(r, id=f"t{r['table']}-{i}-{r['model']}-{r['num_gpus']}gpu", marks=marks))
    return out


@pytest.mark.parametrize("row", _cases())
def test_torchtitan_peak_memory_within_10_percent(row, shared_data):
    pred = torchtitan_prediction(row)
    assert pred == pytest.approx(float(row["memory_gib"]), rel=0.10)


JUPITER = {"GH200-OELLMJS-008": 0.93, "GH200-OELLMJS-009": 0.70, "GH200-OELLMJS-013": 0.93,
           "GH200-OELLMJS-018": 0.93}


@pytest.mark.parametrize("run_id", JUPITER)
def test_jupiter_memory_fraction_within_10_percent(run_id, shared_validation):
    row = next(r for r in load_runs(shared_validation / "gh200_small_blackwell_runs.csv") if r.id == run_id)
    model, plan, gpu_key, _ = row_to_inputs(row)
    b = mem.memory_per_gpu(model, plan, load_catalogue().gpu(gpu_key))
    assert b.total == pytest.approx(JUPITER[run_id] * 96e9, rel=0.10)


REFUSED_BEFORE = {  # the runs issue 26 lists as predicted not to fit, by file
    "published_runs.csv": ["NARAY21T2-004", "NEMO2407-002", "NEMO2407-004", "NEMO2407-010", "NEMO2407-011",
                           "NEMO2407-015"],
    "moe_runs.csv": ["MOE-MOEZOO-016", "MOE-MOEZOO-017", "MOE-MOEZOO-021", "MOE-AUTOMODEL-001", "MOE-AUTOMODEL-003",
                     "MOE-AUTOMODEL-004", "MOE-AUTOMODEL-005"],
    "gh200_small_blackwell_runs.csv": ["BW-NEMO2504-003"],
}


@pytest.mark.parametrize("name", REFUSED_BEFORE)
def test_every_open_run_fits(name, shared_validation):
    """Every run of the file that maps to a plan fits in its GPU's memory (they ran)."""
    cat = load_catalogue()
    checked = []
    for row in load_runs(shared_validation / name):
        if row.skip_reason:
            continue
        try:
            model, plan, gpu_key, _ = row_to_inputs(row)
        except PlannerError:  # rows the validation refuses for other reasons (tests/test_validate*.py)
            continue
        gpu = cat.gpu(gpu_key)
        b = mem.memory_per_gpu(model, plan, gpu)
        assert mem.fits_in_memory(b, gpu), f"{row.id}: {mem.memory_message(b, gpu)}"
        checked.append(row.id)
    assert set(REFUSED_BEFORE[name]) <= set(checked)


def test_llama3_405b_layout_fits_as_meta_ran_it():
    """Dubey et al. 2024 Table 4 / sec. 3.3.2: TP 8, PP 16, 16,384 H100, 16M-token batches (GBS 2048 x 8192); Meta's
    FSDP shards optimizer states and gradients (ZeRO-2: published_runs.csv LLAMA3 rows). With Megatron's defaults
    (ZeRO-1: full fp32 main gradients) the same layout cannot fit: the 16 in-flight micro-batches' activations, the
    bf16 weights and the fp32 gradients alone exceed the 80 GB H100, so a request that leaves the stage to auto (issue
    26's command) is costed at ZeRO-2."""
    base = dict(model="llama3-405b", gpu="h100-sxm", gpus=16384, tp=8, pp=16, vpp=2, mbs=1, gbs=2048, seq_len=8192)

    def memory(**kw):
        res = PlanRequest(**base, **kw).resolve()
        return mem.memory_per_gpu(res.model, res.plan, res.hardware.gpu), res.hardware.gpu

    for kw in (dict(zero=2), dict(main_grads_dtype="bf16"), {}):  # {}: zero left to auto, which picks ZeRO-2
        b, gpu = memory(**kw)
        assert mem.fits_in_memory(b, gpu), (kw, mem.memory_message(b, gpu))
    b, gpu = memory(zero=1)
    assert b.activations + b.weights + b.gradients > gpu.hbm_bytes
