"""Colocated vLLM backend logic with an injected fake `LLM` (vllm itself is not installable on CPU CI)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_colocate import VLLMColocateBackend, import_vllm, tp_groups


def test_tp_groups_are_consecutive_ranks() -> None:
    assert tp_groups(4, 2) == [[0, 1], [2, 3]]
    assert tp_groups(3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="tensor_parallel_size=2 must divide"):
        tp_groups(3, 2)


def test_missing_vllm_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"launchgen\[vllm\]"):
        import_vllm()


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]] | None
    finish_reason: str


@dataclass
class _RequestOutput:
    outputs: list[_Completion]


class _SP:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@dataclass
class _FakeModel:
    loaded: list[str] = field(default_factory=list)
    log: list[str] | None = None

    def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        assert self.log is not None
        for name, _ in weights:
            self.loaded.append(name)
            self.log.append(f"load:{name}")


class _FakeLLM:
    """Records calls; completion = [first prompt token, 7], log-prob of token 7 is NaN to test cleaning."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.model = _FakeModel(log=self.log)
        self.llm_engine = type("E", (), {})()
        runner = type("R", (), {"model": self.model})()
        worker = type("W", (), {"model_runner": runner})()
        wrapper = type("WorkerWrapperBase", (), {"worker": worker})()  # vLLM V1's driver_worker
        self.llm_engine.model_executor = type("X", (), {"driver_worker": wrapper})()
        self.prompts: list[list[int]] = []
        self.sampling: Any = None

    def generate(self, prompts: list[dict[str, list[int]]], sampling_params: Any, use_tqdm: bool) -> list[_RequestOutput]:
        self.log.append("generate")
        self.sampling = sampling_params
        self.prompts = [p["prompt_token_ids"] for p in prompts]
        out = []
        for p in self.prompts:
            lps = [{p[0]: _Logprob(-0.5)}, {7: _Logprob(float("nan"))}]
            out.append(_RequestOutput([_Completion([p[0], 7], lps, "stop" if p[0] % 2 else "length")]))
        return out

    def reset_prefix_cache(self) -> None:
        self.log.append("reset")

    def wake_up(self, tags: list[str]) -> None:
        self.log.append("wake:" + ",".join(tags))

    def sleep(self, level: int) -> None:
        self.log.append(f"sleep:{level}")


def _acc(rank: int, n: int) -> Any:
    return type("A", (), {"process_index": rank, "num_processes": n})()


def test_tp_group_gathers_prompts_and_keeps_its_slice() -> None:
    llm = _FakeLLM()
    peer = [[4, 4], [5]]
    backend = VLLMColocateBackend(
        llm, _acc(3, 4), tp_size=2, gather_in_tp_group=lambda mine: [peer, mine], sampling_params_cls=_SP
    )
    assert backend.tp_rank == 1
    out = backend.generate([[1, 2], [3]], SamplingParams(max_tokens=4, temperature=0.5, top_k=3, extra={"seed": 1}))
    assert llm.prompts == [[4, 4], [5], [1, 2], [3]]  # the TP group runs the same requests
    assert out.prompt_ids == [[1, 2], [3]]
    assert out.completion_ids == [[1, 7], [3, 7]]
    assert out.logprobs == [[-0.5, None], [-0.5, None]]  # NaN -> None
    assert out.finished == [True, True]
    sp = llm.sampling.kwargs
    assert sp == {"n": 1, "repetition_penalty": 1.0, "temperature": 0.5, "top_p": 1.0, "top_k": 3, "min_p": 0.0,
                  "max_tokens": 4, "logprobs": 0, "seed": 1}  # fmt: skip


def test_sync_weights_loads_through_the_driver_worker_and_resets_cache() -> None:
    llm = _FakeLLM()
    backend = VLLMColocateBackend(llm, _acc(0, 1), sampling_params_cls=_SP)
    backend.sync_weights(iter([("a", 1), ("b", 2)]))
    assert llm.log == ["load:a", "load:b", "reset"]
    out = backend.generate([[2]], SamplingParams(max_tokens=2, logprobs=False))
    assert out.logprobs is None and out.finished == [False]


def test_sync_weights_uses_vllms_in_place_reload_where_the_worker_has_one() -> None:
    """vLLM >= 0.2x: Worker.reload_weights(weights_iterator=...) (layerwise: re-processes repacked layers)."""
    llm = _FakeLLM()
    worker = llm.llm_engine.model_executor.driver_worker.worker
    received: list[tuple[list[tuple[str, int]], bool]] = []

    class Runner:
        model = llm.model

        def reload_weights(self, weights_iterator: Any = None, weights_path: Any = None,
                           is_checkpoint_format: bool = True) -> None:
            raise AssertionError("the worker's method (it sets the current vllm config) must be called")

    def reload_weights(weights_iterator: Any = None, is_checkpoint_format: bool = True) -> None:
        received.append((list(weights_iterator), is_checkpoint_format))
        llm.log.append("reload")

    worker.model_runner = Runner()
    worker.reload_weights = reload_weights
    backend = VLLMColocateBackend(llm, _acc(0, 1), sampling_params_cls=_SP)
    backend.sync_weights(iter([("a", 1), ("b", 2)]))
    assert received == [([("a", 1), ("b", 2)], True)]
    assert llm.log == ["reload", "reset"]  # no load_weights of its own


def test_sync_weights_never_calls_a_reload_that_would_read_the_disk() -> None:
    llm = _FakeLLM()
    worker = llm.llm_engine.model_executor.driver_worker.worker

    class OldRunner:
        model = llm.model

        def reload_weights(self) -> None:  # older vLLM: reloads the checkpoint from disk (TRL #5312)
            raise AssertionError("reload from disk")

    worker.model_runner = OldRunner()
    worker.reload_weights = lambda *a, **k: OldRunner().reload_weights()
    backend = VLLMColocateBackend(llm, _acc(0, 1), sampling_params_cls=_SP)
    backend.sync_weights(iter([("a", 1)]))
    assert llm.log == ["load:a", "reset"]


def test_sleep_mode_wakes_weights_first_repushes_then_kv_cache() -> None:
    llm = _FakeLLM()
    pushes: list[int] = []

    def params() -> Any:
        pushes.append(1)
        return iter([("w", 0)])

    backend = VLLMColocateBackend(llm, _acc(0, 1), enable_sleep_mode=True, named_params_fn=params, sampling_params_cls=_SP)
    backend.generate([[1]], SamplingParams(max_tokens=2))  # weights were discarded by the initial sleep
    assert llm.log == ["wake:weights", "load:w", "reset", "wake:kv_cache", "generate", "sleep:2"]
    llm.log.clear()
    backend.sync_weights(iter([("w", 1)]))  # after an optimizer step
    backend.generate([[1]], SamplingParams(max_tokens=2))
    assert llm.log == ["wake:weights", "load:w", "reset", "wake:kv_cache", "generate", "sleep:2"]
    assert len(pushes) == 1  # the trainer's own sync made a re-push unnecessary


def test_sleep_mode_with_partial_syncs_pushes_every_weight_after_a_level_2_sleep() -> None:
    """peft: the trainer's sync carries the adapted modules only, but level-2 sleep dropped all the weights, so
    the engine loads `named_params_fn`'s full set instead (a partial load would leave the rest undefined)."""
    llm = _FakeLLM()

    def full() -> Any:
        return iter([("embed", 0), ("q", 0), ("norm", 0)])

    walked: list[str] = []

    def adapted() -> Any:
        for name in ("q",):
            walked.append(name)
            yield name, 1

    backend = VLLMColocateBackend(llm, _acc(0, 1), enable_sleep_mode=True, named_params_fn=full,
                                  sampling_params_cls=_SP, partial_syncs=True)
    backend.sync_weights(adapted())  # the first push, with the engine asleep since start-up
    assert llm.log == ["wake:weights", "load:embed", "load:q", "load:norm", "reset"] and walked == ["q"]
    backend.generate([[1]], SamplingParams(max_tokens=2))
    llm.log.clear()
    backend.sync_weights(adapted())
    assert llm.log == ["wake:weights", "load:embed", "load:q", "load:norm", "reset"]
    awake = _FakeLLM()  # without sleep mode the engine keeps what it has: the partial stream alone is loaded
    VLLMColocateBackend(awake, _acc(0, 1), named_params_fn=full, sampling_params_cls=_SP,
                        partial_syncs=True).sync_weights(adapted())
    assert awake.log == ["load:q", "reset"]
