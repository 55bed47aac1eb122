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
cd /tmp
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
python3 -c "import torch, transformers, liger_kernel; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  tail -n 25 "$OUT/$name.log"; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
STEPS=${STEPS:-liger_parity,trainer_smoke,weight_sync_1gpu,grpo_vs_trl_cfg1}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
want liger_parity && step liger_parity 150 python3 "$REPO/benchmarks/liger_parity.py"
want trainer_smoke && step trainer_smoke 170 bash "$REPO/benchmarks/trainer_gpu_smoke.sh" /tmp/smoke
want weight_sync_1gpu && step weight_sync_1gpu 60 python3 "$REPO/benchmarks/weight_sync_nccl.py" gpu --trainer-gpu 0 --server-gpu 0 --shapes 0.5b --syncs 3
want grpo_vs_trl_cfg1 && step grpo_vs_trl_cfg1 170 python3 "$REPO/benchmarks/grpo_vs_trl.py" --configs 1 --modes full,train --out "$OUT/bench" --workdir /tmp/bench
exit 0
