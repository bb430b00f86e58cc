"""Write a deterministic, varied batch of prediction requests (JSONL) for before/after comparisons.

A refactor or a new feature that must not move dense predictions is checked by running
`planner predict --batch` over this file before and after the change and diffing the outputs
(issue #13: bit-for-bit identical). The batch mixes every model preset, every catalogue GPU, every
parallel dimension, recompute, ZeRO stage and dtype; some lines are invalid on purpose, so the
error path is compared too. Run: `python scripts/equivalence_batch.py --n 1000 > batch.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import random

MODELS = ["gpt3-175b", "gpt-20b", "llama3-8b", "llama3-70b", "llama3-405b", "llama-7b", "llama-13b",
          "llama-70b", "llemma-7b", "mistral-7b", "mpt-7b", "mpt-30b"]
GPUS = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "gh200", "gh200-144gb", "b200", "gb200",
        "mi300x"]


def request(rng: random.Random, i: int) -> dict:
    tp = rng.choice([1, 2, 4, 8])
    pp = rng.choice([1, 1, 2, 4, 8])
    cp = rng.choice([1, 1, 1, 2])
    dp = rng.choice([1, 2, 4, 8, 16, 32])
    r = {"id": i, "model": rng.choice(MODELS), "gpu": rng.choice(GPUS), "gpus": tp * pp * cp * dp,
         "tp": tp, "pp": pp, "cp": cp, "mbs": rng.choice([1, 1, 2, 4])}
    if rng.random() < 0.2:
        r["vpp"] = rng.choice([2, 4])
    if rng.random() < 0.5:
        r["gbs"] = r["mbs"] * dp * rng.choice([1, 4, 16, 64])
    if rng.random() < 0.4:
        r["seq_len"] = rng.choice([1024, 2048, 4096, 8192])
    if rng.random() < 0.4:
        r["recompute"] = rng.choice(["none", "selective", "full"])
    if rng.random() < 0.3:
        r["zero"] = rng.choice([0, 1, 2, 3])
    if rng.random() < 0.2:
        r["dtype"] = rng.choice(["bf16", "fp16", "fp8", "fp32"])
    if rng.random() < 0.1:
        r["sequence_parallel"] = False
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.n):
        print(json.dumps(request(rng, i)))


if __name__ == "__main__":
    main()
