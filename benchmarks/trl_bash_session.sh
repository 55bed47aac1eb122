#!/usr/bin/env bash
# The device call of issue 24 (and issue 27's item 4): `grpo` and `trl.grpo` under the rendered `--bash` script on
# one GPU, plain generation, the same spec but the trainer line (benchmarks/trl_bash_steps.py).
#   bash benchmarks/trl_bash_session.sh     # SHAPES=small: the small shape alone
# Carried: .whl (launchgen's own wheel, `pip wheel --no-deps .`; trl 1.16.0, transformers 5.22.2, accelerate 1.16.0,
# peft, liger-kernel, datasets, dill, multiprocess, pydantic + core, click, rich, pyyaml, jinja2, packaging, ...).
# The rendered script calls `accelerate` and `python3` from PATH, so the wheels go to one --target directory whose
# bin/ leads PATH.
set -uo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
REPO=$PWD
cd /tmp || exit 1  # the repo's own launchgen/ (no trainers mapping) must not shadow the installed one
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, trl, accelerate, launchgen.trainers; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__, "accelerate", accelerate.__version__)'
echo "== small: hidden 512, 4 layers, 16 x 8 completions of 64 tokens"
timeout "${LIMIT_SMALL:-200}" python3 "$REPO/benchmarks/trl_bash_steps.py" --device cuda --steps "${STEPS:-6}" \
  --trainers "${TRAINERS:-grpo,trl.grpo}" --work /tmp/tbs-small --out "$OUT/trl_bash_small.json" 2>&1 | tail -n 40
echo "== rc=${PIPESTATUS[0]}"
[[ ${SHAPES:-small,big} == *big* ]] || exit 0
echo "== big: hidden 1024, 8 layers, 16 x 8 completions of 256 tokens"
timeout "${LIMIT_BIG:-260}" python3 "$REPO/benchmarks/trl_bash_steps.py" --device cuda --steps "${STEPS:-6}" \
  --hidden 1024 --layers 8 --completion 256 --work /tmp/tbs-big --out "$OUT/trl_bash_big.json" 2>&1 | tail -n 40
echo "== rc=${PIPESTATUS[0]}"
exit 0
