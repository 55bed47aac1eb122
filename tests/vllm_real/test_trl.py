"""TRL's own GRPO and Online DPO trainers (`python -m launchgen.trainers.trl`, TRL 1.16's classes and its own
VLLMClient) against the real CPU vLLM server, with their weight syncs carried by launchgen's gloo engine.

TRL's client hosts the weight-transfer group with vLLM's NCCL engine, which needs CUDA; the server here reports
the `gloo` engine, so `launchgen.trainers.trl.server` hosts the group with launchgen's gloo transport instead.
The trainer runs in the server venv: TRL refuses `use_vllm` where `vllm` does not import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMClient
from trl_runs import trl_cfg

from vllm_real.common import LOGPROB_TOL, REPO_ROOT, connect, load_model, max_logprob_gap
from vllm_real.harness import RealServer, free_port, run_bounded

pytestmark = pytest.mark.vllm_real

STEPS = 3


def _restore_base_weights(server: RealServer, model: Path) -> None:
    """TRL pushes weights only after its first step (it assumes the server loaded the model it trains): an earlier
    test may have left other weights on the shared server."""
    backend = connect(server)
    backend.sync_weights(iter(load_model(model).named_parameters()))
    backend.close()


@pytest.mark.parametrize("name", ["grpo", "online_dpo"])
def test_trl_trainer_trains_against_the_real_server_and_syncs_over_gloo(
        name: str, healthy_shared: RealServer, real_model: Path, real_venv: Path, tmp_path: Path) -> None:
    _restore_base_weights(healthy_shared, real_model)
    cfg = trl_cfg(tmp_path, real_model, name, max_steps=STEPS, save_steps=2, use_vllm=True, vllm_mode="server",
                  vllm_server_timeout=120, learning_rate=0.02)
    cfg["server"] = {"host": "127.0.0.1", "port": healthy_shared.port, "group_port": free_port()}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests" / "trainers"), os.environ.get("PYTHONPATH", "")]))
    # TRL's client waits are bounded by launchgen.trainers.trl.server (each request, the gloo group); this bound
    # on the whole run names where the trainer waited if it still hangs
    run = run_bounded([str(real_venv / "bin" / "python"), "-m", "launchgen.trainers.trl", "--config", str(path)],
                      env, 540, f"the TRL {name} trainer (3 steps against the shared server)", healthy_shared)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out = Path(cfg["args"]["output_dir"])
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    if name == "grpo":  # TRL's own importance-sampling metric: server and trainer log-probs agree every step
        for m in metrics:
            assert m["sampling/sampling_logp_difference/max"] < 1e-4, m
    # TRL pushed the weights of step 2 before step 3 generated: the server serves checkpoint-2's model
    client = VLLMClient("127.0.0.1", healthy_shared.port, control_timeout=60, request_timeout=120)
    prompt = [31, 32, 33, 34, 35]
    res = client.completions(str(real_model), [prompt], 2,
                             SamplingParams(max_tokens=6, temperature=1.0, extra={"seed": 5}))
    assert res.logprobs is not None
    assert max_logprob_gap(load_model(out / "checkpoint-2"), prompt, res.completion_ids, res.logprobs,
                           1.0) < LOGPROB_TOL
    assert max_logprob_gap(load_model(real_model), prompt, res.completion_ids, res.logprobs, 1.0) > 1e-3
