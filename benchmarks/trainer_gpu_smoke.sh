#!/usr/bin/env bash
# GPU smoke run of the bundled GRPO/RLOO trainers (plain-generate backend) in bf16, fp16, bf16+Liger and RLOO+Liger,
# on a tiny random Qwen2 built in-process (nothing is downloaded). Prints the last metrics line of each run and
# PASS/FAIL per run (exit code 0 and a finite loss and grad_norm). Needs a CUDA GPU; the Liger runs need liger-kernel.
#
#   bash benchmarks/trainer_gpu_smoke.sh [WORKDIR]
set -euo pipefail
work=${1:-$(mktemp -d /tmp/launchgen-gpu-smoke.XXXXXX)}
mkdir -p "$work"
python -m launchgen.trainers.tiny "$work/model" --hidden 256 --layers 2 >/dev/null
python - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/prompts.jsonl", "w") as f:
    for i in range(64):
        f.write(json.dumps({"prompt": f"What is {i} + 7?", "answer": str(i + 7)}) + "\n")
PY
fail=0
run() {  # name trainer precision liger
  local name=$1 trainer=$2 precision=$3 liger=$4
  cat >"$work/$name.yaml" <<EOF
trainer: $trainer
output_dir: $work/out-$name
precision: $precision
model: {name_or_path: $work/model, attn_implementation: sdpa, use_liger_kernel: $liger, gradient_checkpointing: true}
data: {path: $work/prompts.jsonl}
rewards: [{name: accuracy}, {name: length, weight: 0.1, kwargs: {target: 20}}]
generation: {max_completion_length: 32}
num_generations: 4
per_device_train_batch_size: 8
gradient_accumulation_steps: 2
beta: 0.04
learning_rate: 1.0e-4
max_steps: 4
save_steps: 2
EOF
  local rc=0
  python -m launchgen.trainers."$trainer" --config "$work/$name.yaml" >"$work/$name.log" 2>&1 || rc=$?
  local last
  last=$(tail -n 1 "$work/out-$name/metrics.jsonl" 2>/dev/null || echo '{}')
  if [[ $rc == 0 ]] && python -c "import json,math,sys; m=json.loads(sys.argv[1]); sys.exit(0 if math.isfinite(m['loss']) and math.isfinite(m['grad_norm']) else 1)" "$last"; then
    echo "PASS $name: $last"
  else
    echo "FAIL $name (exit $rc): $last"; tail -n 20 "$work/$name.log"; fail=1
  fi
}
run grpo-bf16 grpo bf16 false
run grpo-fp16 grpo fp16 false
run rloo-bf16 rloo bf16 false
if python -c "import liger_kernel" 2>/dev/null; then
  run grpo-bf16-liger grpo bf16 true
  run rloo-bf16-liger rloo bf16 true
else
  echo "SKIP liger runs: liger-kernel is not installed"
fi
echo "workdir: $work"
exit $fail
