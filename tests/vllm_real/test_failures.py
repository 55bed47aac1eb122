"""Failure paths against a real CPU vLLM: each ends in recovery or a clear error within its timeout.

Every test here breaks its server, so each gets one of its own (`scratch_server`), never the shared one. A
failed update and a backend that cannot run are in test_contract.py (against the stand-in too).
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


def _engine_cores(server_pid: int) -> list[int]:
    """The server's engine core processes (`VLLM::EngineCore`, children of its process group)."""
    pgid = os.getpgid(server_pid)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            same_group = os.getpgid(int(entry.name)) == pgid
        except (OSError, ProcessLookupError):
            continue
        if same_group and cmd.startswith("VLLM::EngineCore"):
            found.append(int(entry.name))
    return found


def test_engine_killed_during_the_update_fails_the_step_within_seconds(
    scratch_server: Callable[..., RealServer], real_model: Path
) -> None:
    """The engine core dies mid-update (a kernel crash, an OOM kill) while the API server lives on: the step fails
    in seconds through the client's /health watch or the broken transfer, never at weight_sync_timeout (600 s)."""
    server = scratch_server()
    backend = connect(server, weight_sync_timeout=600, packed_buffer_size_bytes=100_000)
    model = load_model(real_model)
    backend.sync_weights(iter(model.named_parameters()))  # records the metadata: the next sync streams
    cores = _engine_cores(server.proc.pid)
    assert cores, "no VLLM::EngineCore process in the server's group"

    def killing(it: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for i, pair in enumerate(it):
            if i == 5:
                for pid in cores:
                    os.kill(pid, signal.SIGKILL)
            yield pair

    started = time.monotonic()
    with pytest.raises((WeightSyncError, VLLMServerError)):
        backend.sync_weights(killing(model.named_parameters()))
    assert time.monotonic() - started < 60, "an engine death mid-update must not wait for weight_sync_timeout"
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
