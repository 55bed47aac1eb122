"""Start and stop the stand-in `vllm serve` from tests, over its real CLI (tests/vllm_standin/bin/vllm)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BIN_DIR = Path(__file__).resolve().parent / "bin"
VLLM_BIN = BIN_DIR / "vllm"
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def standin_env(extra: dict[str, str] | None = None, dev_mode: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN_DIR), str(Path(sys.executable).parent), env.get("PATH", "")])
    # Appended, not prepended: the repo's own launchgen/ has no trainers/ (the install maps it in), so it must
    # not shadow an installed launchgen; the repo root is only needed for `tests.*` imports.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(REPO_ROOT)) if p)
    env.setdefault("LAUNCHGEN_STANDIN_QUIET", "1")
    env["LAUNCHGEN_STANDIN_DEVICE"] = env.get("LAUNCHGEN_STANDIN_DEVICE", "cpu")
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    else:
        env.pop("VLLM_SERVER_DEV_MODE", None)
    env.update(extra or {})
    return env


@dataclass
class Standin:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_listening(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stand-in exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"stand-in not listening on {self.port} after {timeout} s:\n{self.log_text()}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        return self.proc.returncode


def stop_all(servers: list[Standin]) -> None:
    """SIGTERM every stand-in first, then wait: their shutdowns overlap instead of adding up."""
    for s in servers:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in servers:
        s.stop()


def start_standin(
    model_dir: Path | str,
    log_dir: Path,
    *,
    version: str = "0.31.0",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    dev_mode: bool = True,
    weight_transfer: bool = True,
    wait: bool = True,
    port: int | None = None,
) -> Standin:
    port = port or free_port()
    args = [str(VLLM_BIN), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--dtype", "float32"]
    if weight_transfer:
        args += ["--weight-transfer-config", '{"backend": "nccl"}']
    args += extra_args or []
    e = standin_env({"LAUNCHGEN_STANDIN_VLLM_VERSION": version, **(env or {})}, dev_mode=dev_mode)
    log = log_dir / f"standin-{port}.log"
    fh = open(log, "wb")  # noqa: SIM115 - the child owns it for its lifetime
    # sys.executable, not the shebang's python3: the stand-in must see the same torch/transformers as the test.
    proc = subprocess.Popen([sys.executable, *args], env=e, stdout=fh, stderr=subprocess.STDOUT)
    fh.close()
    s = Standin(proc, port, log, args)
    if wait:
        try:
            s.wait_listening()
        except BaseException:
            s.stop()
            raise
    return s
