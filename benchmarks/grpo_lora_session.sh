#!/usr/bin/env bash
# The one device call of benchmarks/grpo_lora.py (issue 14), each part bounded, logs and results under $OUT:
#   bash benchmarks/grpo_lora_session.sh      (on the GPU machine, with .whl carried: trl 1.16.0, transformers
#   5.22.2, accelerate 1.16.0, peft 0.21.2, datasets 5.2.0, dill, multiprocess, pydantic + pydantic-core,
#   annotated-types, typing-inspection)
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/lg && cp -r launchgen /tmp/lg/ && cp -r trainers /tmp/lg/launchgen/trainers && cp -r templates /tmp/lg/launchgen/templates
REPO=$PWD
cd /tmp || exit 1  # `python -m`/scripts must not see the repo's own launchgen/ (it lacks the trainers mapping)
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  grep -v 'it/s\]' "$OUT/$name.log" | tail -n 14; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
step train 400 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 1.5b,3b --modes train --steps 4 --warmup 1 \
  --out "$OUT/train" --workdir /tmp/bench
step full 170 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 1.5b --modes full --steps 2 --warmup 1 \
  --trainers launchgen-lora,trl-lora --out "$OUT/full" --workdir /tmp/bench
