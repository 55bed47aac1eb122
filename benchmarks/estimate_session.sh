#!/usr/bin/env bash
# The device call of issue 26: the peak memory of the benchmark configs (launchgen full fine-tuning at the 0.5B,
# 1.5B and 3B shapes, the 151k-vocabulary config, LoRA at 3B; the training phase on fixed completions, as
# benchmarks/RESULTS.md measured them) next to launchgen/shared/estimate.py's prediction. Carried: .whl (transformers
# 5.22.2, accelerate 1.16.0, peft 0.21.2, liger-kernel 0.8.5, pydantic 2.14.4 + pydantic-core, annotated-types,
# typing-inspection). Logs and tables under $OUT.
#   bash benchmarks/estimate_session.sh            # the five configs
#   PART2=1 bash benchmarks/estimate_session.sh    # configs 1 and 3 without checkpointing; config 1 full steps
#   PART2=1 PART3=1 bash benchmarks/estimate_session.sh  # fp32 runs (configs 1 and 3; config 1 without checkpointing)
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/lg && cp -r launchgen /tmp/lg/ && cp -r trainers /tmp/lg/launchgen/trainers && cp -r templates /tmp/lg/launchgen/templates
REPO=$PWD
cd /tmp || exit 1  # scripts must not see the repo's own launchgen/ (it lacks the trainers mapping)
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  grep '"peak_mem_gib"\|Error' "$OUT/$name.log" | cut -c1-400 | tail -n 12; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
[ "${PART2:-0}" = 1 ] || step gvt 150 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1,3,2 --modes train --trainers launchgen \
  --steps 2 --warmup 1 --out "$OUT/gvt" --workdir /tmp/bench
[ "${PART2:-0}" = 1 ] || step lora 100 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 3b --modes train --trainers launchgen-full,launchgen-lora \
  --lora-dropout 0 --steps 2 --warmup 1 --out "$OUT/lora" --workdir /tmp/bench
if [ "${PART3:-0}" = 1 ]; then  # fp32 runs, whose activations are 4-byte elements: configs 1 and 3, and 1 without checkpointing
  step fp32 240 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1,3 --modes train --trainers '' \
    --lg-variant 'fp32:precision=fp32;model.dtype=float32' --steps 2 --warmup 1 --out /tmp/o/fp32 --workdir /tmp/bench
  step fp32nogc 200 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes train --trainers '' \
    --lg-variant 'fp32:precision=fp32;model.dtype=float32' --gradient-checkpointing off --steps 2 --warmup 1 \
    --out /tmp/o/fp32nogc --workdir /tmp/bench
  cp /tmp/o/fp32/results.jsonl "$OUT"/fp32-results.jsonl; cp /tmp/o/fp32nogc/results.jsonl "$OUT"/fp32nogc-results.jsonl
  python3 "$REPO/benchmarks/estimate_vs_measured.py" /tmp/o/fp32/results.jsonl off:/tmp/o/fp32nogc/results.jsonl | tee "$OUT/table3.md"
  exit 0
fi
if [ "${PART2:-0}" = 1 ]; then  # the second call: without gradient checkpointing, and full steps with generation
  step nogc 120 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1,3 --modes train --trainers launchgen \
    --gradient-checkpointing off --steps 2 --warmup 1 --out "$OUT/nogc" --workdir /tmp/bench
  step full 90 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes full --trainers launchgen \
    --steps 2 --warmup 1 --gen-configs none --out "$OUT/full" --workdir /tmp/bench
  python3 "$REPO/benchmarks/estimate_vs_measured.py" "$OUT"/nogc/results.jsonl "$OUT"/full/results.jsonl | tee "$OUT/table2.md"
  exit 0
fi
python3 "$REPO/benchmarks/estimate_vs_measured.py" "$OUT"/gvt/results.jsonl "$OUT"/lora/results.jsonl | tee "$OUT/table.md"
