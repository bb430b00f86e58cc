#!/usr/bin/env bash
# Regenerate the checked-in example reports of issue 5 item 7 and the validation report of issue 4
# (Markdown + PNG plots under reports/). Run from anywhere; it works in the repository root.
# The reports carry no date, so running this twice on the same code and data changes nothing.
#
#   scripts/make_reports.sh            # all four reports
#   PLANNER=planner scripts/make_reports.sh   # use another planner executable
set -euo pipefail
cd "$(dirname "$0")/.."

PLANNER=${PLANNER:-}
if [[ -z "$PLANNER" ]]; then
    if [[ -x .venv/bin/planner ]]; then PLANNER=.venv/bin/planner; else PLANNER=planner; fi
fi

# Published runs (read-only shared data, never copied here): named by a path relative to the
# repository so the command recorded in reports/validation.md is the same on every machine.
PUBLISHED=../shared/validation/published_runs.csv
if [[ ! -f "$PUBLISHED" ]]; then
    found=$("$(dirname "$PLANNER")/python" -c 'from costmodel.core.paths import validation_dir as v; import os; d = v(); print(os.path.relpath(d / "published_runs.csv") if d else "")' 2>/dev/null || true)
    PUBLISHED=${found:-$PUBLISHED}
fi

run() {
    # print the command as the report records it, then run it (the tables go to /dev/null: the report has them)
    echo "+ planner ${*}" >&2
    "$PLANNER" "$@" >/dev/null
}

mkdir -p reports

# 1. llama-13b on 128 A100-80GB: every plan of the default space (exhaustive = the ground truth).
run search --model llama-13b --gpus 128 --gpu a100-80gb --exhaustive --top 10 \
    --report reports/llama-13b-128xa100-80gb.md

# 2. A100 vs GH200 cost per token for llama-13b on 128 GPUs, with time and cost to train 1T tokens.
run compare --model llama-13b --gpus 128 --gpu a100-80gb --gpu gh200 --tokens 1e12 \
    --report reports/llama-13b-a100-vs-gh200.md

# 3. Sizing: smallest / cheapest allocation that trains llama3-70b on 2T tokens within 30 days.
run size --model llama3-70b --tokens 2e12 --deadline 30d --gpu a100-80gb --gpu h100-sxm \
    --report reports/llama3-70b-size-2T-30d.md

# 4. Validation: published runs and the CPU runs measured on this machine, predicted vs measured.
#    CPU_RUNS: the run file of a CPU ground-truth run (default: the latest checked-in one, reports/cpu-runs/run10);
#    its rows need the CPU cost model fitted in that run (PLANNER_MODELS_DIR, e.g. profiles/cpu-gt10/models,
#    written by benchmarks/cpu_ground_truth.py, not in git); without it they are listed as skipped
#    ("unknown GPU 'cpu'").
CPU_RUNS=${CPU_RUNS:-reports/cpu-runs/run10/cpu_runs.csv}
runs=(--runs "$PUBLISHED")
if [[ -f "$CPU_RUNS" ]]; then runs+=(--runs "$CPU_RUNS"); fi
if [[ -z "${PLANNER_MODELS_DIR:-}" && -f profiles/cpu-gt10/models/index.json ]]; then
    export PLANNER_MODELS_DIR=profiles/cpu-gt10/models
fi
run validate "${runs[@]}" --report reports/validation.md

echo "reports written:" >&2
ls -1 reports/llama-13b-128xa100-80gb* reports/llama-13b-a100-vs-gh200* reports/llama3-70b-size-2T-30d* \
    reports/validation.md reports/validation_scatter.png >&2
