#!/usr/bin/env bash
# The device call of issue 14's memory question: what LoRA's peak is made of at the 3B shape, and the peak and step
# time with `max_tokens_per_forward` (launchgen's memory-only knob: the same gradient in several passes), all in one
# call so the figures share a machine state (the first call of 2026-12-03 ran an earlier set of steps). Carried: .whl (see grpo_lora_session.sh). Logs and tables under $OUT.
#   bash benchmarks/grpo_lora_memory_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/lg && cp -r launchgen /tmp/lg/ && cp -r trainers /tmp/lg/launchgen/trainers && cp -r templates /tmp/lg/launchgen/templates
REPO=$PWD
cd /tmp || exit 1  # scripts must not see the repo's own launchgen/ (it lacks the trainers mapping)
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
B=(python3 "$REPO/benchmarks/grpo_lora.py" --modes train --lora-dropout 0 --workdir /tmp/bench)
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1; local rc=$?
  grep -v 'it/s\]' "$OUT/$name.log" | grep -v '^{' | tail -n 60; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
# 1: the same-run comparison at both shapes, full FT, LoRA and TRL with LoRA
step compare 300 "${B[@]}" --shapes 1.5b,3b --steps 4 --warmup 1 --trainers launchgen-full,launchgen-lora,trl-lora
# 2: what LoRA's peak is made of (allocator history replayed; slow, so one timed step)
step breakdown 100 "${B[@]}" --shapes 3b --steps 1 --warmup 1 --trainers launchgen-lora --memory-breakdown
# 3: the micro-batch of 64 x 288 tokens in 4 passes (launchgen's memory-only knob), full FT likewise for the ratio
step passes4 110 "${B[@]}" --shapes 3b --steps 4 --warmup 1 --trainers launchgen-lora,launchgen-full --set max_tokens_per_forward=4608
# 4: LoRA with PEFT's default-like dropout 0.05 (TRL's comparison runs with dropout 0: see RESULTS.md)
step dropout 60 "${B[@]}" --shapes 3b --steps 4 --warmup 1 --trainers launchgen-lora --lora-dropout 0.05
