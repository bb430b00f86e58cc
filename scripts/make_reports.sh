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

# 4. Validation: every open run file of ../shared/validation (published dense runs, MoE runs, GH200 / small-model /
#    Blackwell runs), leave-one-source-out, one section each.
run validate --report reports/validation.md

echo "reports written:" >&2
ls -1 reports/llama-13b-128xa100-80gb* reports/llama-13b-a100-vs-gh200* reports/llama3-70b-size-2T-30d* \
    reports/validation.md reports/validation*_scatter.png >&2
