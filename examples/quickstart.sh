#!/usr/bin/env bash
# The README's first command ends here: the main job (vLLM-less GRPO on a tiny random model, CPU, fp32) rendered
# from examples/local-cpu-quickstart.yaml and run on this machine, exactly as `launchgen render --bash` writes it.
# Nothing is downloaded: the model and tokenizer are built in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f examples/tiny-model/config.json ] || python -m launchgen.trainers.tiny examples/tiny-model
launchgen check examples/local-cpu-quickstart.yaml
launchgen render examples/local-cpu-quickstart.yaml --bash -o quickstart.sh --force
# this run's attempt: the job script takes the first logs/attempt-<N> that does not exist yet (a re-run into the
# same job directory is attempt 1, 2, ...), so what is read below is never an earlier run's
attempt=0
while [ -e "launchgen-runs/local/logs/attempt-$attempt" ]; do attempt=$((attempt + 1)); done
trainer_log=launchgen-runs/local/logs/attempt-$attempt/trainer-local.log

# the job script shows the trainer's `[launchgen] step` line per logging step as it trains (on stderr, beside its
# own `launchgen:` lines)
rc=0
bash quickstart.sh || rc=$?
if ((rc != 0)); then
  # the job's own last lines above say why (a refused re-run names the fields that differ)
  echo "the job failed (exit $rc); its trainer log: $trainer_log" >&2
  exit "$rc"
fi
if ! grep -q '^\[launchgen\] step ' "$trainer_log" 2>/dev/null; then
  # nothing trained in this run (training was already complete): the metrics file is an earlier run's
  echo "no step was trained in this run (see the job's last line above); the earlier run's metrics are in" \
    "launchgen-runs/local/trainer/metrics.jsonl (remove launchgen-runs/local to train again)"
  exit 0
fi
echo "metrics: launchgen-runs/local/trainer/metrics.jsonl"
tail -n 1 launchgen-runs/local/trainer/metrics.jsonl
