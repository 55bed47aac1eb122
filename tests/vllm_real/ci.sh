#!/usr/bin/env bash
# CI step for the vllm_real tier: build (or reuse) the real CPU vLLM server venv, then run the tier.
# LAUNCHGEN_VLLM_REAL=1 makes a missing server environment a failure instead of a skip; --strict-markers and
# the tier's own checks make "0 tests" impossible to pass unnoticed (pytest exits 5 on no tests).
#   bash tests/vllm_real/ci.sh [extra pytest args]
#   VLLM_REAL_PART=server|slurm   only the tests against a server the tests start, or only the real-SLURM scenarios
#                                 (.ci/run runs the first beside the main suite, the second after it: the cluster's
#                                 nodes are the main suite's then)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

echo "== vllm_real: server environment"
VLLM_REAL_VENV=$(bash tests/vllm_real/install.sh | tail -n 1)
export VLLM_REAL_VENV LAUNCHGEN_VLLM_REAL=1

echo "== vllm_real: tests against a real CPU vllm serve (${VLLM_REAL_PART:-all})"
# with the real-SLURM scenarios that use the real server (the cluster .ci/run started; LAUNCHGEN_REQUIRE_SLURM=1 there)
case "${VLLM_REAL_PART:-all}" in
  all) paths=(tests/vllm_real tests/slurm/test_real_vllm_scenarios.py tests/slurm/test_real_vllm_multinode.py) ;;
  server) paths=(tests/vllm_real) ;;
  slurm) paths=(tests/slurm/test_real_vllm_scenarios.py tests/slurm/test_real_vllm_multinode.py) ;;
  *) echo "VLLM_REAL_PART must be all, server or slurm, not ${VLLM_REAL_PART}" >&2; exit 2 ;;
esac
python -m pytest -q -m vllm_real "${paths[@]}" "$@"
