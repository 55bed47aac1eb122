#!/usr/bin/env bash
# The README's first command ends here: the main job (vLLM-less GRPO on a tiny random model, CPU, fp32) rendered
# from examples/local-cpu-quickstart.yaml and run on this machine, exactly as `launchgen render --bash` writes it.
# Nothing is downloaded: the model and tokenizer are built in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f examples/tiny-model/config.json ] || python -m launchgen.trainers.tiny examples/tiny-model
launchgen check examples/local-cpu-quickstart.yaml
launchgen render examples/local-cpu-quickstart.yaml --bash -o quickstart.sh --force
bash quickstart.sh
echo "metrics: launchgen-runs/local/trainer/metrics.jsonl"
tail -n 1 launchgen-runs/local/trainer/metrics.jsonl
