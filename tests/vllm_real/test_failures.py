"""Failure paths against a real CPU vLLM: each ends in recovery or a clear error within its timeout.

Every test here breaks its server, so each gets one of its own (`scratch_server`), never the shared one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMServerError, VLLMTimeoutError
from launchgen.trainers.generation.vllm_server import WeightSyncError

from vllm_real.common import LOGPROB_TOL, connect, load_model, max_logprob_gap, perturb
from vllm_real.harness import REPO_ROOT, RealServer, free_port

pytestmark = pytest.mark.vllm_real

PROMPT = [21, 22, 23, 24]
SAMPLING = SamplingParams(max_tokens=6, temperature=0.9, extra={"seed": 3})


def _follows(backend: Any, model: Any) -> float:
    out = backend.generate([PROMPT, PROMPT], SAMPLING)
    return max_logprob_gap(model, PROMPT, out.completion_ids, out.logprobs, 0.9)


def _wrong_shape(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters with one announced at a shape the server's model does not have."""
    for name, p in model.named_parameters():
        yield (name, torch.zeros(3, 5)) if name == "model.norm.weight" else (name, p)


def test_failed_update_leaves_a_serving_engine(scratch_server: Callable[..., RealServer], real_model: Path) -> None:
    """vLLM ends the session itself after a failed /update_weights and leaves the layers mid-reload; without
    start + finish the next generation kills the engine (EngineDeadError, the process exits)."""
    server = scratch_server()
    backend = connect(server, packed=False)
    model = load_model(real_model)
    with pytest.raises(VLLMServerError) as err:
        backend.sync_weights(_wrong_shape(model))
    assert "/update_weights returned HTTP 500: worker error:" in str(err.value)
    assert _follows(backend, model) < LOGPROB_TOL  # still serving, on the last complete weights
    assert backend.client is not None and backend.client.health() == 200 and server.alive()
    backend._metas = None  # the shape of the model changed between syncs: the next sync announces again
    perturb(model, 7)
    backend.sync_weights(iter(model.named_parameters()))
    assert _follows(backend, model) < LOGPROB_TOL
    backend.close()


def test_backend_that_cannot_run_says_so_without_a_network_hint(
    scratch_server: Callable[..., RealServer],
) -> None:
    server = scratch_server(backend="nccl")  # vLLM's own NCCL engine: no GPU here
    started = time.monotonic()
    with pytest.raises(VLLMServerError) as err:
        connect(server, control_timeout=30)
    text = str(err.value)
    assert time.monotonic() - started < 30
    assert "Cannot access accelerator device" in text
    assert "firewall" not in text and "VLLM_HOST_IP" not in text
    assert """--weight-transfer-config '{"backend": "gloo"}'""" in text
    assert server.alive()


def test_server_killed_mid_sync_is_an_error_within_the_timeout(
    scratch_server: Callable[..., RealServer], real_model: Path
) -> None:
    server = scratch_server()
    backend = connect(server, weight_sync_timeout=30, packed_buffer_size_bytes=100_000)
    model = load_model(real_model)
    backend.sync_weights(iter(model.named_parameters()))  # records the metadata: the next sync streams
    assert _follows(backend, model) < LOGPROB_TOL

    def killing(it: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for i, pair in enumerate(it):
            if i == 5:
                os.killpg(server.proc.pid, signal.SIGKILL)
                time.sleep(0.5)
            yield pair

    started = time.monotonic()
    with pytest.raises((WeightSyncError, VLLMServerError)) as err:
        backend.sync_weights(killing(model.named_parameters()))
    assert time.monotonic() - started < 30, "the failure must not wait for weight_sync_timeout"
    assert "weight" in str(err.value).lower() or "/update_weights" in str(err.value)
    with pytest.raises(VLLMServerError, match="failed: ConnectionError"):
        backend.generate([PROMPT], SAMPLING)
    backend.close()


_CRASHING_TRAINER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[3])
    from vllm_real.common import connect, load_model, perturb
    from vllm_real.harness import RealServer

    class _Port(RealServer):
        def __init__(self, port):
            self.port = port

    backend = connect(_Port(int(sys.argv[1])), packed_buffer_size_bytes=100_000)
    model = load_model(sys.argv[2])
    perturb(model, 1)
    backend.sync_weights(iter(model.named_parameters()))
    perturb(model, 2)

    def crash(it):
        for i, pair in enumerate(it):
            if i == 6:
                os._exit(17)  # the trainer dies in the middle of the broadcast
            yield pair

    backend.sync_weights(crash(model.named_parameters()))
""")


def test_trainer_crash_mid_sync_then_a_new_trainer_reconnects(
    scratch_server: Callable[..., RealServer], real_model: Path, tmp_path: Path
) -> None:
    server = scratch_server()
    script = tmp_path / "crashing_trainer.py"
    script.write_text(_CRASHING_TRAINER)
    crashed = subprocess.run([sys.executable, str(script), str(server.port), str(real_model),
                              str(REPO_ROOT / "tests")], capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 17, crashed.stderr[-3000:]
    backend = connect(server, group_port=free_port())  # a requeued trainer: new process, new group
    model = load_model(real_model)
    backend.generate([PROMPT], SAMPLING)  # the crashed update left layers mid-reload: connect restored them
    assert server.alive()
    perturb(model, 3)
    backend.sync_weights(iter(model.named_parameters()))
    assert _follows(backend, model) < LOGPROB_TOL
    backend.close()


def test_stopped_server_times_out_then_syncs_after_it_resumes(
    scratch_server: Callable[..., RealServer], real_model: Path
) -> None:
    """A server that stops answering (SIGSTOP: a hung node) is an error within each call's own timeout."""
    server = scratch_server()
    backend = connect(server, weight_sync_timeout=10)
    model = load_model(real_model)
    backend.sync_weights(iter(model.named_parameters()))
    assert _follows(backend, model) < LOGPROB_TOL  # the first generation's health gate is behind us
    assert backend.client is not None
    backend.request_timeout = backend.client.control_timeout = 3  # a fresh server's first calls can take longer
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(VLLMServerError, match="got no answer within 3 s"):
            backend.generate([PROMPT], SAMPLING)
        assert time.monotonic() - started < 8
        started = time.monotonic()
        perturb(model, 4)
        with pytest.raises(VLLMTimeoutError, match="/start_weight_update got no answer within 3 s"):
            backend.sync_weights(iter(model.named_parameters()))
        assert time.monotonic() - started < 3 * 4 + 5  # start + the recovery's finish/start/finish, each 3 s
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    server.wait_healthy(60)
    # The start that timed out reaches the engine after SIGCONT and leaves a session open; the next sync
    # closes it and goes on.
    backend.sync_weights(iter(model.named_parameters()))
    assert _follows(backend, model) < LOGPROB_TOL
    backend.close()
