"""Shared fixtures: tiny models are built in code once per session, never downloaded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hermetic import restored_process_state

#: The real-vLLM tier (tests/vllm_real/, tests/slurm/test_real_vllm_scenarios.py): each server takes 35-110 s and
#: 1.6 GiB, so it runs only when asked for: `-m vllm_real`, or LAUNCHGEN_VLLM_REAL=1 (tests/vllm_real/ci.sh).
VLLM_REAL_MARK = "vllm_real"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_REAL_MARK in (config.getoption("markexpr") or "") or os.environ.get("LAUNCHGEN_VLLM_REAL") == "1":
        return
    dropped = [item for item in items if item.get_closest_marker(VLLM_REAL_MARK) is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker(VLLM_REAL_MARK) is None]


@pytest.fixture(autouse=True)
def _hermetic() -> Iterator[None]:
    """Every test leaves the process as it found it (see tests/hermetic.py): the order they run in cannot matter."""
    with restored_process_state():
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Qwen2 with an in-process BPE tokenizer, saved with save_pretrained."""
    import torch  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    from launchgen.trainers.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with initializer_range 0.2: with transformers' 0.02 the random LM head's logits are nearly
    flat (every token ~1/vocab whatever the hidden state), so only training the head itself (which LoRA does not
    adapt) could learn the toy task; a full fine-tune with the head frozen does not learn it in 12 steps either."""
    import torch  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    from launchgen.trainers.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-wide") / "m", initializer_range=0.2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    from launchgen.trainers.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name the random order (pytest-randomly) at the end of every run, -q included, so a red run reproduces."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and not getattr(config.option, "randomly_dont_reorganize", False):
        terminalreporter.write_line(f"random test order: reproduce it with  python -m pytest --randomly-seed={seed}")
