#!/usr/bin/env bash
# One device call that runs every GPU check of this round, each bounded, logs under $OUT:
# Liger parity, the trainer GPU smoke runs, NCCL weight sync on one GPU, and GRPO-vs-TRL config 1.
#   bash benchmarks/gpu_session.sh            (on the GPU machine, with .whl carried)
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/lg && cp -r launchgen /tmp/lg/ && cp -r trainers /tmp/lg/launchgen/trainers && cp -r templates /tmp/lg/launchgen/templates
REPO=$PWD
# `python -m` puts the working directory first on sys.path, and the repo's own launchgen/ lacks the
# trainers/ mapping the install provides: run every step from outside the repo.
cd /tmp || exit 1
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
python3 -c "import torch, transformers, liger_kernel; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  tail -n 25 "$OUT/$name.log"; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
STEPS=${STEPS:-liger_parity,trainer_smoke,weight_sync_1gpu,grpo_vs_trl_cfg1}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
want liger_parity && step liger_parity 150 python3 "$REPO/benchmarks/liger_parity.py"
want trainer_smoke && step trainer_smoke 300 bash "$REPO/benchmarks/trainer_gpu_smoke.sh" /tmp/smoke
want weight_sync_1gpu && step weight_sync_1gpu 60 python3 "$REPO/benchmarks/weight_sync_nccl.py" gpu --trainer-gpu 0 --server-gpu 0 --shapes 0.5b --syncs 3
want grpo_vs_trl_cfg1 && step grpo_vs_trl_cfg1 170 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes full,train --out "$OUT/bench" --workdir /tmp/bench
# Training phase alone: compiled layers (the CUDA default) against uncompiled, and the config-2 memory knobs.
want train_c1 && step train_c1 240 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes train \
  --lg-variant "eager:model.compile=false" \
  --out "$OUT/train_c1" --workdir /tmp/bench
want train_c2 && step train_c2 330 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 2 --modes train \
  --lg-variant "compiled:model.compile=true" \
  --lg-variant "lean8k:max_tokens_per_forward=8192;model.logits_chunk_mib=64" \
  --lg-variant "lean8k-compiled:max_tokens_per_forward=8192;model.logits_chunk_mib=64;model.compile=true" \
  --lg-variant "lean4k:max_tokens_per_forward=4096;model.logits_chunk_mib=64" \
  --out "$OUT/train_c2" --workdir /tmp/bench
want logp_head && step logp_head 150 python3 "$REPO/benchmarks/logp_head_gpu.py"
want decode_c2 && step decode_c2 200 python3 "$REPO/benchmarks/decode_gpu_check.py" --configs 2 --out "$OUT/decode_c2"
# The issue-5 table: full steps and training phase at config 1 (launchgen defaults), full steps at config 2 with
# launchgen's defaults and its memory-lean knobs (same algorithm; see RESULTS.md).
want final_c1 && step final_c1 200 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes full \
  --out "$OUT/final_c1" --workdir /tmp/bench
want final_c2 && step final_c2 200 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 2 --modes full --trainers launchgen \
  --lg-variant "lean:max_tokens_per_forward=4096;model.logits_chunk_mib=64;generation.keep_kv_cache=false" \
  --out "$OUT/final_c2" --workdir /tmp/bench
want final_c2_trl && step final_c2_trl 260 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 2 --modes full \
  --trainers trl --out "$OUT/final_c2_trl" --workdir /tmp/bench
# launchgen alone (no TRL wheels needed): config 1 full steps and training phase, and the decode paths at config 1
# with their bitwise/log-prob checks; the after-refactor check (issue 11)
want lg_c1 && step lg_c1 200 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes full,train \
  --trainers launchgen --out "$OUT/lg_c1" --workdir /tmp/bench
want decode_c1 && step decode_c1 200 python3 "$REPO/benchmarks/decode_gpu_check.py" --configs 1 --out "$OUT/decode_c1"
want decode && step decode 300 python3 "$REPO/benchmarks/decode_gpu_check.py" --configs 1,3,2 --out "$OUT/decode"
exit 0
