"""GRPO over two real vLLM replicas (`vllm.replicas: 2`): the shared server and one more for this module.

The trainer is the bundled CLI with both endpoints in `generation.vllm_server.replicas`, as the job script writes
them. Every weight update must reach both servers (their weight versions count every push, and with
max_staleness 0 the trainer's own `sampling/sampling_logp_difference/max` says each step that whichever replica
generated a sample held the current weights), both must serve prompt groups (vLLM's Prometheus request counter),
and after the run both must hold the saved final model's weights bit for bit (the digest worker extension,
worker_ext.py) and generate with its log-probs. Then a replica is SIGKILLed mid-run
and started again on its port, as the job script's supervisor does under `vllm.restart_replicas`: generation goes
on on the other replica, the restarted one is taken back with the current weights, and the run completes.

Cost: one extra server start for the module (overlapped with the first trainer's start-up) and one restart in
the kill test: each 35-140 s, depending on the machine's load.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMClient
from safetensors.torch import load_file

from vllm_real.common import (
    LOGPROB_TOL,
    load_model,
    max_logprob_gap,
    read_metrics,
    train,
    trainer_command,
    trainer_config,
    vllm_layout,
)
from vllm_real.harness import RealServer, free_port, start_server
from vllm_real.worker_ext import DIGEST_METHOD, tensor_digest

pytestmark = pytest.mark.vllm_real

STEPS = 3
PROMPT = [31, 32, 33, 34, 35]


@pytest.fixture(scope="module")
def second(real_venv: Path, real_model: Path, real_logs: Path) -> Iterator[list[RealServer]]:
    """The second replica, in a box (the kill test puts the server it restarts there). Not waited for: a trainer
    waits for every replica's /health itself, so the module's first run overlaps its start with the server's."""
    box = [start_server(real_venv, real_model, real_logs, digest_extension=True)]
    try:
        yield box
    finally:
        box[0].stop()


def _replicas_config(tmp_path: Path, model: Path, servers: list[RealServer], steps: int, failover: bool
                     ) -> dict[str, Any]:
    cfg = trainer_config(tmp_path, model, servers[0], "grpo", steps)
    s = cfg["generation"]["vllm_server"]
    del s["host"], s["port"], s["group_port"]
    s["replicas"] = [{"host": "127.0.0.1", "port": r.port, "group_port": free_port()} for r in servers]
    s["replica_failover"] = failover
    s["health_timeout"] = 240  # the second replica may still be starting (see `second`)
    return cfg


def _requests_served(server: RealServer) -> float:
    """Completions the server finished since it started (vLLM's Prometheus counter, summed over its labels)."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:request_success_total")]
    assert values, f"no vllm:request_success_total in {server.url}/metrics"
    return sum(values)


def _requests_served_if_up(server: RealServer) -> float:
    """`_requests_served`, or 0 for a server still starting (it cannot have served anything yet)."""
    try:
        return _requests_served(server)
    except requests.ConnectionError:
        return 0.0


def _logprob_gap(server: RealServer, model_id: str, model: Any) -> float:
    client = VLLMClient("127.0.0.1", server.port, control_timeout=60, request_timeout=120)
    res = client.completions(model_id, [PROMPT], 2, SamplingParams(max_tokens=6, temperature=1.0, extra={"seed": 5}))
    assert res.logprobs is not None
    return max_logprob_gap(model, PROMPT, res.completion_ids, res.logprobs, 1.0)


def _weight_version(server: RealServer) -> str | None:
    return VLLMClient("127.0.0.1", server.port, control_timeout=60, request_timeout=120).weight_version()


def _both_hold_the_final_weights(servers: list[RealServer], real_model: Path, cfg: dict[str, Any]) -> None:
    """Bit for bit (the digest worker extension on both servers), and by the log-probs they generate with."""
    final_dir = Path(cfg["output_dir"]) / "final"
    want = {n: tensor_digest(t) for n, t in vllm_layout(load_file(str(final_dir / "model.safetensors"))).items()}
    for server in servers:
        got = VLLMClient("127.0.0.1", server.port, control_timeout=60).collective_rpc(DIGEST_METHOD)[0]
        assert set(got) == set(want), sorted(set(got) ^ set(want))
        assert not sorted(n for n in want if got[n] != want[n]), server.url
    final = load_model(final_dir)
    base = load_model(real_model)
    for server in servers:
        assert _logprob_gap(server, str(real_model), final) < LOGPROB_TOL, server.url
        assert _logprob_gap(server, str(real_model), base) > 1e-3, server.url  # it did train


def _await(path: Path, trainer: subprocess.Popen[bytes], log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if trainer.poll() is not None:
            raise AssertionError(f"the trainer exited with {trainer.returncode} before {path.name}:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        assert time.monotonic() < deadline, f"no {path.name} within {timeout:g} s"
        time.sleep(0.1)


def test_a_killed_replica_is_restarted_and_taken_back_with_the_current_weights(
    healthy_shared: RealServer, second: list[RealServer], real_venv: Path, real_model: Path, real_logs: Path,
    tmp_path: Path,
) -> None:
    """max_staleness 0, failover on. Replica 1 dies after step 1's generation: the push after step 1 fails on it
    (set aside), step 2 generates on replica 0 alone while the test restarts replica 1 on its port, the push after
    step 2 takes it back with the current weights, step 3 generates on both, and every step runs."""
    gate = tmp_path / "gate"
    gate.mkdir()
    servers = [healthy_shared, second[0]]
    cfg = _replicas_config(tmp_path, real_model, servers, STEPS, failover=True)
    # the trainer waits in the reward of steps 1 and 2 until the test has killed, then restarted, replica 1
    cfg["rewards"] = [{"name": "toy_rewards:target_fraction_gated",
                       "kwargs": {"gate_dir": str(gate), "gate_calls": [1, 2]}}]
    argv, env = trainer_command(tmp_path, cfg)
    log = tmp_path / "trainer.log"
    served_start = [_requests_served(healthy_shared), _requests_served_if_up(second[0])]
    with open(log, "wb") as fh:
        trainer = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _await(gate / "reached-1", trainer, log, timeout=420)  # also the second replica's first start
        served_first = [_requests_served(s) - n for s, n in zip(servers, served_start, strict=True)]
        port = second[0].port
        second[0].kill()  # SIGKILL the whole group: API server, engine core, workers
        served_before = _requests_served(healthy_shared)
        (gate / "go-1").touch()
        restarted = real_logs / "restarted"  # its own log: the killed server's names the same port
        restarted.mkdir(exist_ok=True)
        second[0] = start_server(real_venv, real_model, restarted, port=port,  # the supervisor's restart
                                 digest_extension=True)
        _await(gate / "reached-2", trainer, log)
        served_alone = _requests_served(healthy_shared) - served_before
        second[0].wait_healthy()
        (gate / "go-2").touch()
        rc = trainer.wait(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    text = log.read_text(errors="replace")
    assert rc == 0, text[-4000:]
    metrics = read_metrics(cfg)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    # whichever replica generated a sample held the trainer's current weights, every step
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-4 for m in metrics), metrics
    assert "vLLM replica 1 failed during weight sync" in text and "vLLM replica 1 is back" in text, text[-4000:]
    assert all(n > 0 for n in served_first), served_first  # step 1's 2 prompt groups: one on each
    assert served_alone > 0  # step 2's, on replica 0 while replica 1 was down
    assert _requests_served(second[0]) > 0  # the restarted replica took prompts again (step 3)
    # the push before the first generation, then one per step; the restarted server counts on from the trainer
    servers[1] = second[0]
    assert [_weight_version(s) for s in servers] == [str(STEPS + 1)] * 2
    _both_hold_the_final_weights(servers, real_model, cfg)


def test_grpo_generates_ahead_over_two_replicas_and_both_follow_every_push(
    healthy_shared: RealServer, second: list[RealServer], real_model: Path, tmp_path: Path
) -> None:
    """max_staleness 1 (max_staleness 0 is the kill test's, before and after the kill)."""
    second[0].wait_healthy()
    servers = [healthy_shared, second[0]]
    cfg = _replicas_config(tmp_path, real_model, servers, STEPS, failover=False)
    cfg["generation"]["max_staleness"] = 1
    served_before = [_requests_served(s) for s in servers]
    metrics = train(tmp_path, cfg)
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0]  # never older than k = 1
    served = [_requests_served(s) - before for s, before in zip(servers, served_before, strict=True)]
    assert all(n > 0 for n in served), served
    assert [_weight_version(s) for s in servers] == [str(STEPS + 1)] * 2
    _both_hold_the_final_weights(servers, real_model, cfg)
