"""GRPO, RLOO and Online DPO train against the shared real vLLM server, with a weight sync after every step.

Each trainer is the bundled CLI (`python -m launchgen.trainers.<name> --config`), as a job script runs it. Before
the first step (the server starts out holding other weights) and after every step the server must generate from
the trainer's current weights: for GRPO the trainer's own
`sampling/sampling_logp_difference/max` says so each step; for all three the server's weight version counts
the syncs and, after the run, its log-probs equal the saved final model's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMClient

from vllm_real.common import LOGPROB_TOL, connect, load_model, max_logprob_gap, perturb, train, trainer_config
from vllm_real.harness import RealServer

pytestmark = pytest.mark.vllm_real

STEPS = 3


@pytest.mark.parametrize("trainer", ["grpo", "rloo", "online_dpo"])
def test_trains_with_a_sync_every_step_and_the_server_follows(
    trainer: str, healthy_shared: RealServer, real_model: Path, tmp_path: Path
) -> None:
    cfg = trainer_config(tmp_path, real_model, healthy_shared, trainer, STEPS)
    # The server holds other weights than the model file (a long-lived server after another trainer): the
    # trainer must push its own before the first generation, or step 1 samples from a stale policy.
    stale = load_model(real_model)
    perturb(stale, seed=11)
    other = connect(healthy_shared)
    other.sync_weights(iter(stale.named_parameters()))
    other.close()
    metrics = train(tmp_path, cfg)
    assert len(metrics) == STEPS
    for m in metrics:
        assert m["time/sync_weights"] > 0
        if trainer == "grpo":  # the importance-sampling correction compares server and trainer log-probs
            assert m["sampling/sampling_logp_difference/max"] < 1e-4, m
    client = VLLMClient("127.0.0.1", healthy_shared.port, control_timeout=60, request_timeout=120)
    # One finished update before the first generation, then one per step (the trainer's own count).
    assert client.weight_version() == str(STEPS + 1)
    final = load_model(Path(cfg["output_dir"]) / "final")
    base = load_model(real_model)
    prompt = [31, 32, 33, 34, 35]
    res = client.completions(str(real_model), [prompt], 2, SamplingParams(max_tokens=6, temperature=1.0,
                                                                           extra={"seed": 5}))
    assert res.logprobs is not None
    assert max_logprob_gap(final, prompt, res.completion_ids, res.logprobs, 1.0) < LOGPROB_TOL
    assert max_logprob_gap(base, prompt, res.completion_ids, res.logprobs, 1.0) > 1e-3  # it did train


@pytest.mark.parametrize("in_flight", ["finish", "pause"])
def test_grpo_generates_ahead_with_max_staleness_1(
    in_flight: str, healthy_shared: RealServer, real_model: Path, tmp_path: Path
) -> None:
    """Bounded staleness against real vLLM: each batch is one step old, and with `pause` the push runs while
    requests are frozen (`/pause?mode=keep`; the reset preempts them, which only a real scheduler does)."""
    cfg = trainer_config(tmp_path, real_model, healthy_shared, "grpo", STEPS)
    cfg["max_steps"] = 4
    cfg["generation"].update(max_staleness=1, in_flight_at_push=in_flight, generation_kwargs={"ignore_eos": True},
                             max_completion_length=24)
    restore = connect(healthy_shared)
    restore.sync_weights(iter(load_model(real_model).named_parameters()))
    restore.close()
    metrics = train(tmp_path, cfg)
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    # one step behind: the server's log-probs are no longer the trainer's, and the correction sees it
    assert max(m["sampling/sampling_logp_difference/max"] for m in metrics[1:]) > 1e-4
    client = VLLMClient("127.0.0.1", healthy_shared.port, control_timeout=60, request_timeout=120)
    assert client.weight_version() == "5"  # the push before the first generation, then one per step
    assert client._json(client._request("GET", "/is_paused", timeout=30), "/is_paused")["is_paused"] is False
