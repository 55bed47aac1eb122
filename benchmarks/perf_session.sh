#!/usr/bin/env bash
# The device calls of issue 27 (performance): the new table, in two calls of about five minutes each.
#   PART=1 bash benchmarks/perf_session.sh   # full GRPO steps, launchgen vs TRL 1.16: c1, c1big, c3, 3B
#   PART=2 bash benchmarks/perf_session.sh   # c2 (Liger), LoRA full steps at 1.5B and 3B, c2 under
#                                            # memory_budget_gib 7
#   PART=rerun STEPS=2 WARMUP=1 bash benchmarks/perf_session.sh  # what was run after the first call's failures (RESULTS.md)
#   PART=decode bash benchmarks/perf_session.sh  # issue 27 item 3: decode_profile.py at 3B (old engine vs this one,
#       profiled) and c1; the old engine travels as out/perf_old/fast_generate_old (carry it: `run` carry=["out/perf_old",
#       ".whl"]), a copy of trainers/generation/fast_generate/ before the change
#   PART=rows bash benchmarks/perf_session.sh    # issue 27 item 3: full GRPO steps, launchgen only, c1, c3, 3B
#   PART=lora15 bash benchmarks/perf_session.sh  # LoRA (compiled layers) vs full FT full steps at 1.5B, one process
#   PART=one bash benchmarks/perf_session.sh     # both in one call (what ran, 2026-12-05: the device allowed one call):
#       decode_profile old vs new at 3B, then the 3B, c3 and c1 rows
#   PART=issue39a / PART=issue39b bash benchmarks/perf_session.sh  # issue 39, two calls on one warm machine:
#       a: c1 (full), c3 and c1big (full + training phase alone); b: 3B (full + training phase alone), and
#       decode_profile.py at 3B and c1big: the engine's default against decode_attention="flex".
#       Full rows: launchgen at its defaults (gradient_checkpointing auto), TRL 1.16 (its default, on), then
#       launchgen under memory_budget_gib = 0.6x TRL's peak of the shape; training phase alone: auto against
#       forced on and forced off. Every row: decode against the weights and weights+KV floors, training-phase MFU.
# Carried: .whl (trl 1.16.0, transformers 5.22.2, accelerate 1.16.0, peft 0.21.2, liger-kernel 0.8.5,
# datasets 5.2.0, dill, multiprocess, pydantic + pydantic-core, annotated-types, typing-inspection).
# Logs and tables under $OUT; both trainers in one process. WARMUP defaults to 2: with 1, the first timed step
# of a compiled-layer run can hold a recompile (a new completion width), as in the 2026-12-04 calls (WARMUP=1).
set -uo pipefail
OUT=${OUT:-/tmp/out}
PART=${PART:-1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/lg && cp -r launchgen /tmp/lg/ && cp -r trainers /tmp/lg/launchgen/trainers && cp -r templates /tmp/lg/launchgen/templates
if [[ -d out/perf_old/fast_generate_old ]]; then cp -r out/perf_old/fast_generate_old /tmp/lg/launchgen/trainers/generation/; fi
REPO=$PWD
cd /tmp || exit 1  # scripts must not see the repo's own launchgen/ (it lacks the trainers mapping)
export PYTHONPATH=/tmp/lg:/tmp/site:$REPO PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step() { local name=$1 limit=$2; shift 2; echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1; local rc=$?
  grep -v 'it/s\]' "$OUT/$name.log" | grep -v '^{' | tail -n 14; echo "== $name rc=$rc in $((SECONDS - t0)) s"; }
G=(python3 "$REPO/benchmarks/grpo_vs_trl.py" --modes full --steps "${STEPS:-3}" --warmup "${WARMUP:-2}" --workdir /tmp/bench)
if [[ $PART == 1 ]]; then
  step c1 110 "${G[@]}" --configs 1
  step c1big 120 "${G[@]}" --configs 4
  step c3 120 "${G[@]}" --configs 3
  step c5 170 "${G[@]}" --configs 5
elif [[ $PART == 2 ]]; then
  step c2 200 "${G[@]}" --configs 2
  step lora 130 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 1.5b,3b --modes full --steps "${STEPS:-3}" --warmup "${WARMUP:-2}" \
    --trainers launchgen-lora --lora-dropout 0 --workdir /tmp/bench
  step c2budget 80 "${G[@]}" --configs 2 --trainers '' --lg-variant "budget7:memory_budget_gib=7"
elif [[ $PART == decode ]]; then
  D=(python3 "$REPO/benchmarks/decode_profile.py")
  step d3b 220 "${D[@]}" --config 5 --variants old,unstacked,new
  step d1 60 "${D[@]}" --config 1 --variants old,new --calls 2
  step d3b-autotune 110 "${D[@]}" --config 5 --variants new,autotune --calls 2
  for f in d3b d1 d3b-autotune; do echo "== $f"; cat "$OUT/$f/decode_profile.md" 2>/dev/null; done
elif [[ $PART == one ]]; then
  G+=(--trainers launchgen)
  step d3b 170 python3 "$REPO/benchmarks/decode_profile.py" --config 5 --variants old,new --calls 2
  step c5 150 "${G[@]}" --configs 5
  step c3 100 "${G[@]}" --configs 3
  step c1 80 "${G[@]}" --configs 1
  cat "$OUT/d3b/decode_profile.md" 2>/dev/null; for f in c5 c3 c1; do echo "== $f"; cat "$OUT/$f/table.md" 2>/dev/null; done
  (cd "$OUT" && tar czf /tmp/one.tgz . && rm -rf ./* && mv /tmp/one.tgz .)  # the device returns at most 8 files
elif [[ $PART == issue39a || $PART == issue39b ]]; then
  I=("${G[@]}" --trainers "launchgen,trl" --budget-of-trl 0.6 --lg-variant "gc-on:model.gradient_checkpointing=true"
     --lg-variant "gc-off:model.gradient_checkpointing=false" --train-trainers "launchgen,gc-on,gc-off")
  if [[ $PART == issue39a ]]; then
    step c1 110 "${I[@]}" --configs 1
    I+=(--modes "full,train")
    step c3 190 "${I[@]}" --configs 3
    step c1big 230 "${I[@]}" --configs 4
    names=(c1 c3 c1big)
  else
    step c5 260 "${I[@]}" --modes "full,train" --configs 5
    D=(python3 "$REPO/benchmarks/decode_profile.py" --variants "new,flex" --calls 2)
    step d3b 130 "${D[@]}" --config 5
    step dc1big 110 "${D[@]}" --config 4 --prompts 128 --prompt-len 512
    names=(c5)
    for f in d3b dc1big; do echo "== $f"; tail -n 5 "$OUT/$f/decode_profile.md" 2>/dev/null; done
  fi
  for f in "${names[@]}"; do echo "== $f"; sed 1d "$OUT/$f/table.md" 2>/dev/null; done
  (cd "$OUT" && tar czf "/tmp/$PART.tgz" . && rm -rf ./* && mv "/tmp/$PART.tgz" .)
elif [[ $PART == lora15 ]]; then  # 2026-12-05 evening: LoRA with compiled decoder layers against full FT at 1.5B
  step lora15 230 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 1.5b --modes full --steps "${STEPS:-3}" \
    --warmup "${WARMUP:-2}" --trainers launchgen-full,launchgen-lora --lora-dropout 0 --workdir /tmp/bench
  cat "$OUT/lora15/"*.md 2>/dev/null
elif [[ $PART == short ]]; then  # 2026-12-05 afternoon: beside trl_bash_session.sh in one call, so no 3B row
  G+=(--trainers launchgen)
  step d3b 170 python3 "$REPO/benchmarks/decode_profile.py" --config 5 --variants old,new --calls 2
  step c1 80 "${G[@]}" --configs 1
  step c3 100 "${G[@]}" --configs 3
  cat "$OUT/d3b/decode_profile.md" 2>/dev/null; for f in c1 c3; do echo "== $f"; cat "$OUT/$f/table.md" 2>/dev/null; done
  (cd "$OUT" && tar czf /tmp/short.tgz . && rm -rf ./* && mv /tmp/short.tgz .)
elif [[ $PART == oldnew ]]; then  # the old engine against this one at c1 and c3 (same call, same card)
  step d1 90 python3 "$REPO/benchmarks/decode_profile.py" --config 1 --variants old,new --calls 2
  step d3 90 python3 "$REPO/benchmarks/decode_profile.py" --config 3 --variants old,new --calls 2
  for f in d1 d3; do echo "== $f"; cat "$OUT/$f/decode_profile.md" 2>/dev/null; done
elif [[ $PART == rows ]]; then
  G+=(--trainers launchgen)
  step c5 170 "${G[@]}" --configs 5
  step c3 110 "${G[@]}" --configs 3
  step c1 90 "${G[@]}" --configs 1
else  # PART=rerun: the second call of 2026-12-04 (after the graph-pool fix), everything but c1big in one call
  step c5 130 "${G[@]}" --configs 5
  step c2 160 "${G[@]}" --configs 2
  step c3 90 "${G[@]}" --configs 3
  step lora 100 python3 "$REPO/benchmarks/grpo_lora.py" --shapes 1.5b,3b --modes full --steps "${STEPS:-3}" \
    --warmup "${WARMUP:-2}" --trainers launchgen-lora --lora-dropout 0 --workdir /tmp/bench
  step c1 80 "${G[@]}" --configs 1
fi
exit 0
