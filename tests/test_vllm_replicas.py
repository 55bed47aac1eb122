"""VLLMReplicaBackend against two stand-in servers: real HTTP, real gloo groups, bit-exact weights on both.

Routing math (prompt groups, least-loaded placement, merge order) is tested without processes first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.generation.backends import BACKENDS
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import CompletionsResult, VLLMClient, VLLMServerError
from launchgen.trainers.generation.vllm_replica import VLLMReplicaBackend, assign, merge, prompt_groups
from vllm_standin.harness import Standin, free_port, start_standin, stop_all


class _Acc:
    is_main_process = True
    process_index = 0
    num_processes = 1
    device = torch.device("cpu")


def _digest(model: Any) -> dict[str, str]:
    return {
        n: hashlib.sha256(p.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for n, p in model.state_dict().items()
    }


def _perturb(model: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


#: the access log on, so a test can count the completions each replica served
_LOUD = {"LAUNCHGEN_STANDIN_QUIET": "0"}


def _completions_served(s: Standin) -> int:
    return s.log_text().count("POST /v1/completions")


# -- routing, no processes ------------------------------------------------------------------------------------
def test_prompt_groups_keep_the_copies_of_one_prompt_together() -> None:
    prompts = [[1], [1], [2, 3], [2, 3], [4], [4]]
    assert prompt_groups(prompts, 2) == [(0, 2), (2, 4), (4, 6)]
    # not repeated num_generations times consecutively: every row on its own
    assert prompt_groups([[1], [2], [2], [3]], 2) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_assign_balances_by_tokens_and_keeps_groups_whole() -> None:
    prompts = [[0] * 30] * 2 + [[1] * 10] * 2 + [[2] * 10] * 2 + [[3] * 10] * 2
    groups = prompt_groups(prompts, 2)
    loads = {0: 0, 1: 0}
    plan = assign(groups, prompts, 0, loads)
    # the 30-token group alone on one replica, the three 10-token groups on the other
    assert sorted(len(v) for v in plan.values()) == [1, 3]
    assert sorted(loads.values()) == [60, 60]
    assert sorted(g for v in plan.values() for g in v) == groups


def test_merge_restores_input_order() -> None:
    def res(rows: list[int]) -> CompletionsResult:
        return CompletionsResult([[r] for r in rows], [[100 + r] for r in rows], [[-0.1 * r] for r in rows],
                                 [r % 2 == 0 for r in rows])

    merged = merge([([(2, 4)], res([2, 3])), ([(0, 2), (4, 5)], res([0, 1, 4]))], 5)
    assert merged.completion_ids == [[100], [101], [102], [103], [104]]
    assert merged.prompt_ids == [[0], [1], [2], [3], [4]]
    assert merged.finished == [True, False, True, False, True]


class _FakeServer:
    """What the replica backend reads of a per-replica `VLLMServerBackend`; records the prompts it was sent."""

    model_id, max_model_len, syncs_done, client = "m", None, 0, None

    def __init__(self, seen: list[int], k: int) -> None:
        self.seen, self.k = seen, k

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _generate_main(self, prompts: list[list[int]], params: SamplingParams) -> CompletionsResult:
        self.seen.append(self.k)
        return CompletionsResult([list(p) for p in prompts], [[1] for _ in prompts], None, [True for _ in prompts])


def test_load_carries_over_calls_so_single_groups_alternate() -> None:
    seen: list[int] = []
    backend = VLLMReplicaBackend(_Acc(), make_replica=lambda k: _FakeServer(seen, k), count=2,  # type: ignore[arg-type,return-value]
                                 num_generations=2)
    backend.connect()
    for _ in range(4):  # one prompt group per call
        backend.generate([[5, 6], [5, 6]], SamplingParams(max_tokens=3))
    assert seen == [0, 1, 0, 1]


# -- two stand-ins ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replica-logs")


def _cfg(tmp_path: Path, model_dir: Path, servers: list[Standin], failover: bool) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": str(tmp_path), "model": {"name_or_path": str(model_dir)},
        "data": {"path": "unused.jsonl"}, "num_generations": 2,
        "generation": {"backend": "vllm_server", "vllm_server": {
            "replicas": [{"host": "127.0.0.1", "port": s.port, "group_port": free_port()} for s in servers],
            "replica_failover": failover, "health_timeout": 30, "weight_sync_timeout": 60, "control_timeout": 30}},
    })  # fmt: skip


@pytest.fixture
def two(tiny_model_dir: Path, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Standin]]:
    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    servers = [start_standin(tiny_model_dir, logdir, wait=False, env=_LOUD) for _ in range(2)]
    try:
        for s in servers:
            s.wait_listening()
        yield servers
    finally:
        stop_all(servers)


def _prompts(n: int) -> list[list[int]]:
    return [p for i in range(n) for p in ([[11 + i, 12, 13 + i]] * 2)]


def test_two_replicas_receive_identical_weights_and_share_the_groups(
    two: list[Standin], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    cfg = _cfg(tmp_path, tiny_model_dir, two, failover=False)
    backend = BACKENDS["vllm_server"].factory(cfg, _Acc(), None, None)
    assert isinstance(backend, VLLMReplicaBackend)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    clients = [VLLMClient("127.0.0.1", s.port) for s in two]
    for step in range(3):
        _perturb(model, step)
        backend.sync_weights(iter(model.named_parameters()))
        want = _digest(model)
        for c in clients:
            assert c.collective_rpc("launchgen_weight_digest")[0] == want
        prompts = _prompts(4)
        out = backend.generate(prompts, SamplingParams(max_tokens=4, temperature=0.7, extra={"seed": step}))
        assert out.prompt_ids == prompts and len(out.completion_ids) == 8
    assert all(r.routed_groups == 6 for r in backend.replicas)  # 4 groups a call, 2 per replica, 3 calls
    assert all(_completions_served(s) == 3 for s in two)
    backend.close()


def test_replica_killed_mid_run_is_replaced_and_gets_the_current_weights(
    two: list[Standin], tiny_model_dir: Path, tmp_path: Path, logdir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    backend = VLLMReplicaBackend.from_config(_cfg(tmp_path, tiny_model_dir, two, failover=True), _Acc())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    params = SamplingParams(max_tokens=4, temperature=0.7)
    _perturb(model, 1)
    backend.sync_weights(iter(model.named_parameters()))
    two[1].proc.kill()
    two[1].proc.wait(timeout=10)
    # generation continues: replica 1's groups are re-routed to replica 0 within the call
    out = backend.generate(_prompts(4), params)
    assert len(out.completion_ids) == 8 and [r.up for r in backend.replicas] == [True, False]
    _perturb(model, 2)
    backend.sync_weights(iter(model.named_parameters()))  # replica 1 is down: only replica 0 receives
    # the script restarts it on the same port (initial weights, no group)
    two[1] = start_standin(tiny_model_dir, logdir, port=two[1].port, env=_LOUD)
    c1 = VLLMClient("127.0.0.1", two[1].port)
    assert c1.collective_rpc("launchgen_weight_digest")[0] != _digest(model)
    _perturb(model, 3)
    backend.sync_weights(iter(model.named_parameters()))  # the next sync takes it back and pushes
    assert [r.up for r in backend.replicas] == [True, True] and backend.replicas[1].rejoins == 1
    want = _digest(model)
    assert c1.collective_rpc("launchgen_weight_digest")[0] == want
    assert VLLMClient("127.0.0.1", two[0].port).collective_rpc("launchgen_weight_digest")[0] == want
    served = _completions_served(two[1])
    backend.generate(_prompts(4), params)
    assert _completions_served(two[1]) == served + 1  # it gets prompts again
    backend.close()


#: the first release whose /weight_info reports the label given to /finish_weight_update (the weight check)
_CHECKABLE = "0.33.0"


@pytest.fixture
def two_checkable(tiny_model_dir: Path, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Standin]]:
    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    servers = [start_standin(tiny_model_dir, logdir, wait=False, env=_LOUD, version=_CHECKABLE) for _ in range(2)]
    try:
        for s in servers:
            s.wait_listening()
        yield servers
    finally:
        stop_all(servers)


def _restart(servers: list[Standin], k: int, model_dir: Path, logdir: Path) -> None:
    """What the script's supervisor does: the old process is gone, a new one loads the model file on the port."""
    servers[k].proc.kill()
    servers[k].proc.wait(timeout=10)
    servers[k] = start_standin(model_dir, logdir, port=servers[k].port, env=_LOUD, version=_CHECKABLE)


def test_replica_restarted_between_generations_gets_no_prompts_before_it_holds_the_pushed_weights(
    two_checkable: list[Standin], tiny_model_dir: Path, tmp_path: Path, logdir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    two = two_checkable
    backend = VLLMReplicaBackend.from_config(_cfg(tmp_path, tiny_model_dir, two, failover=True), _Acc())
    assert all(r.checkable for r in backend.replicas)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    params = SamplingParams(max_tokens=4, temperature=0.7)
    _perturb(model, 1)
    backend.sync_weights(iter(model.named_parameters()))
    backend.generate(_prompts(4), params)
    assert all(_completions_served(s) == 1 for s in two)
    # restarted while the trainer was not talking to it: healthy, answering, with the model file's weights
    _restart(two, 1, tiny_model_dir, logdir)
    c1 = VLLMClient("127.0.0.1", two[1].port)
    assert c1.health() == 200 and c1.collective_rpc("launchgen_weight_digest")[0] != _digest(model)
    out = backend.generate(_prompts(4), params)
    assert len(out.completion_ids) == 8
    assert _completions_served(two[1]) == 0  # every sample came from replica 0, which holds the pushed weights
    assert [r.up for r in backend.replicas] == [True, False]
    assert "was restarted" in backend.replicas[1].last_error
    _perturb(model, 2)
    backend.sync_weights(iter(model.named_parameters()))  # revived with the current weights in this sync
    assert [r.up for r in backend.replicas] == [True, True] and backend.replicas[1].rejoins == 1
    assert c1.collective_rpc("launchgen_weight_digest")[0] == _digest(model)
    backend.generate(_prompts(4), params)
    assert _completions_served(two[1]) == 1  # back in the rotation once it holds them
    # both restarted: no replica holds the pushed weights, and the call stops instead of sampling the model file
    for k in range(2):
        _restart(two, k, tiny_model_dir, logdir)
    with pytest.raises(VLLMServerError, match=r"every vLLM replica failed.*was restarted"):
        backend.generate(_prompts(2), SamplingParams(max_tokens=2))
    assert all(_completions_served(s) == 0 for s in two)
    backend.close()


def test_without_failover_a_dead_replica_fails_the_call(
    two: list[Standin], tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = VLLMReplicaBackend.from_config(_cfg(tmp_path, tiny_model_dir, two, failover=False), _Acc())
    two[0].proc.kill()
    two[0].proc.wait(timeout=10)
    with pytest.raises(VLLMServerError, match=f"127.0.0.1:{two[0].port}"):
        backend.generate(_prompts(2), SamplingParams(max_tokens=2))
    backend.close()


def test_replicas_need_distinct_group_ports(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="its own group_port"):
        TrainerConfig.model_validate({
            "trainer": "grpo", "output_dir": str(tmp_path), "model": {"name_or_path": "m"},
            "data": {"path": "d.jsonl"}, "generation": {"backend": "vllm_server", "vllm_server": {
                "replicas": [{"host": "a", "port": 1, "group_port": 5}, {"host": "b", "port": 2, "group_port": 5}]}},
        })  # fmt: skip
