#!/usr/bin/env bash
# The README's first command ends here: the main job (vLLM-less GRPO on a tiny random model, CPU, fp32) rendered
# from examples/local-cpu-quickstart.yaml and run on this machine, exactly as `launchgen render --bash` writes it.
# Nothing is downloaded: the model and tokenizer are built in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f examples/tiny-model/config.json ] || python -m launchgen.trainers.tiny examples/tiny-model
launchgen check examples/local-cpu-quickstart.yaml
launchgen render examples/local-cpu-quickstart.yaml --bash -o quickstart.sh --force
trainer_log=launchgen-runs/local/logs/attempt-0/trainer-local.log
rm -f -- "$trainer_log"  # a previous run's lines are not this one's progress

# The trainer writes one plain line per logging step to its log (launchgen.trainers.reporting); show each new one
# here while the job runs, so the terminal is not silent for the minutes it trains.
show_progress() {
  local shown=0 n alive
  while :; do
    alive=1
    kill -0 "$1" 2>/dev/null || alive=0  # before reading: the lines of a job that just ended are still shown
    if [ -f "$trainer_log" ]; then
      n=$(grep -c '^\[launchgen\] step ' "$trainer_log" || true)
      if ((n > shown)); then
        grep '^\[launchgen\] step ' "$trainer_log" | tail -n "+$((shown + 1))" | head -n "$((n - shown))"
        shown=$n
      fi
    fi
    ((alive)) || break
    sleep 1
  done
}
bash quickstart.sh &
job=$!
show_progress "$job"
rc=0
wait "$job" || rc=$?
if ((rc != 0)); then
  echo "the job failed (exit $rc); its trainer log: $trainer_log" >&2
  exit "$rc"
fi
echo "metrics: launchgen-runs/local/trainer/metrics.jsonl"
tail -n 1 launchgen-runs/local/trainer/metrics.jsonl
