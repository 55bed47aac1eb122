"""VLLMClient against the stand-in `vllm serve` over real HTTP: endpoints, error semantics, version gates, health."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import requests
import torch  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import (
    VLLMClient,
    VLLMServerError,
    VLLMTimeoutError,
    VLLMVersion,
)
from vllm_standin.harness import VLLM_BIN, Standin, free_port, standin_env, start_standin


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("standin-logs")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, logdir: Path) -> Iterator[Standin]:
    s = start_standin(tiny_model_dir, logdir, extra_args=["--tensor-parallel-size", "2", "--max-model-len", "64"])
    yield s
    s.stop()


@pytest.fixture
def client(server: Standin) -> Iterator[VLLMClient]:
    c = VLLMClient("127.0.0.1", server.port, request_timeout=60, control_timeout=30)
    c.wait_for_health(30)
    yield c
    c.close()


# -- always-on routes ---------------------------------------------------------------------------------------
def test_metadata_routes(client: VLLMClient, tiny_model_dir: Path) -> None:
    assert client.health() == 200
    assert client.version() == "0.31.0"
    assert client.server_version() == VLLMVersion(0, 31, 0)
    card = client.models()[0]
    assert card["id"] == str(tiny_model_dir)
    assert card["max_model_len"] == 64
    info = client.server_info()
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert client.check_weight_transfer_configured(info) == {"backend": "nccl"}
    assert client.get_world_size() == 2  # TP * PP * DP


def test_completions_are_prompt_major_with_logprobs(client: VLLMClient) -> None:
    model = client.models()[0]["id"]
    prompts = [[5, 6, 7], [9, 10]]
    params = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, top_k=50, extra={"seed": 3})
    res = client.completions(model, prompts, 3, params)
    assert res.prompt_ids == prompts
    assert len(res.completion_ids) == 6
    assert res.logprobs is not None
    for ids, lps in zip(res.completion_ids, res.logprobs, strict=True):
        assert 1 <= len(ids) <= 6
        assert len(lps) == len(ids)
        assert all(lp is not None and lp <= 0.0 for lp in lps)
    # same seed, same request -> same samples; prompt-major order is stable
    again = client.completions(model, prompts, 3, params)
    assert again.completion_ids == res.completion_ids
    # greedy: all n samples of a prompt agree
    greedy = client.completions(model, [[5, 6, 7]], 2, SamplingParams(max_tokens=4, temperature=0.0, logprobs=False))
    assert greedy.logprobs is None
    assert greedy.completion_ids[0] == greedy.completion_ids[1]


def test_completions_errors_name_the_server(client: VLLMClient) -> None:
    model = client.models()[0]["id"]
    with pytest.raises(VLLMServerError, match=r"HTTP 400.*maximum context length is 64") as err:
        client.completions(model, [[1] * 60], 1, SamplingParams(max_tokens=10))
    assert err.value.status == 400 and f"127.0.0.1:{client.port}" in str(err.value)
    assert "/v1/completions" in str(err.value)
    with pytest.raises(VLLMServerError, match="does not exist"):
        client.completions("other-model", [[1, 2]], 1, SamplingParams(max_tokens=2))


def test_logprob_parsing_handles_none_and_nan() -> None:
    c = VLLMClient("127.0.0.1", 1)
    data = {
        "choices": [
            {"index": 1, "token_ids": [4, 5], "prompt_token_ids": [1], "finish_reason": "length", "logprobs": None},
            {
                "index": 0,
                "token_ids": [7, 8],
                "prompt_token_ids": [1],
                "finish_reason": "stop",
                "logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-0.5, float("nan")]},
            },
        ]
    }
    res = c._parse_completions(data, [[1]], 2, True)
    assert res.completion_ids == [[7, 8], [4, 5]]  # re-ordered by index
    assert res.logprobs == [[-0.5, None], [None, None]]
    assert res.finished == [True, False]
    bad = {"choices": [{"index": 0, "token_ids": [7], "logprobs": {"tokens": ["token_id:9"], "token_logprobs": [-1.0]}}]}
    with pytest.raises(VLLMServerError, match="log-prob is for token 9"):
        c._parse_completions(bad, [[1]], 1, True)
    with pytest.raises(VLLMServerError, match="returned 1 choices for 1 prompts x n=2"):
        c._parse_completions({"choices": data["choices"][:1]}, [[1]], 2, True)


# -- dev routes and their error semantics ---------------------------------------------------------------------
def test_weight_update_lifecycle_errors(tiny_model_dir: Path, logdir: Path) -> None:
    # Its own server: a failed update leaves the layers mid-reload and the next generation kills the engine (as in
    # vLLM), so sharing the module's server would break whichever test runs after this one.
    server = start_standin(tiny_model_dir, logdir, extra_args=["--tensor-parallel-size", "2", "--max-model-len", "64"])
    client = VLLMClient("127.0.0.1", server.port, request_timeout=60, control_timeout=30)
    try:
        client.wait_for_health(30)
        _weight_update_lifecycle(client, server)
    finally:
        client.close()
        server.stop()


def _weight_update_lifecycle(client: VLLMClient, server: Standin) -> None:
    client.start_weight_update()
    with pytest.raises(VLLMServerError, match="already active") as err:
        client.start_weight_update()
    assert err.value.status == 500
    client.finish_weight_update()
    with pytest.raises(VLLMServerError, match="without a matching start_weight_update"):
        client.finish_weight_update()
    with pytest.raises(VLLMServerError, match="start_weight_update must be called before"):
        client.update_weights({"names": [], "dtype_names": [], "shapes": []}, timeout=10)
    # 400 when the body lacks init_info / update_info (raw HTTP: the client always sends them)
    for route, key in (("/init_weight_transfer_engine", "init_info"), ("/update_weights", "update_info")):
        r = requests.post(server.url + route, json={}, timeout=10)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == f"Missing '{key}' in request body"
    # unknown update_info keys are errors from 0.28 on (`packed` moved to init_info)
    client.start_weight_update()
    info = {"names": ["x"], "dtype_names": ["float32"], "shapes": [[1]], "packed": True}
    with pytest.raises(VLLMServerError, match="unexpected keyword argument 'packed'"):
        client.update_weights(info, timeout=10)
    # a failed update ends the session on the worker, as in vLLM
    with pytest.raises(VLLMServerError, match="without a matching"):
        client.finish_weight_update()
    client.reset_prefix_cache()
    client.pause(mode="keep")
    client.resume()
    client.sleep(level=1)
    assert client.is_sleeping()
    client.wake_up(["weights", "kv_cache"])
    assert not client.is_sleeping()
    # the update that failed above left the layers mid-reload: the first generation kills the engine
    model = client.models()[0]["id"]
    with pytest.raises(VLLMServerError, match="HTTP 500: EngineCore encountered an issue"):
        client.completions(model, [[1, 2]], 1, SamplingParams(max_tokens=2))
    server.proc.wait(timeout=30)


def test_startup_delay_then_missing_weight_transfer_config_names_the_flag(tiny_model_dir: Path, logdir: Path) -> None:
    env = {"LAUNCHGEN_STANDIN_STARTUP_DELAY": "2"}
    s = start_standin(tiny_model_dir, logdir, weight_transfer=False, env=env, wait=False)
    try:
        c = VLLMClient("127.0.0.1", s.port, control_timeout=10)
        c.wait_for_health(120, poll_interval=0.2)  # refused while "loading", then healthy
        assert c.health() == 200
        with pytest.raises(VLLMServerError) as err:
            c.check_weight_transfer_configured()
        assert "--weight-transfer-config '{\"backend\": \"nccl\"}'" in str(err.value)
        info = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
        with pytest.raises(VLLMServerError, match="Weight transfer not configured"):
            c.init_weight_transfer_engine(info)
    finally:
        s.stop()


# -- version parsing (the gates against servers of each version are in test_vllm_server_backend.py) --------
def test_version_parsing() -> None:
    assert VLLMVersion.parse("0.22.1.dev5+gabc.cu129") == VLLMVersion(0, 22, 1)
    assert VLLMVersion.parse("0.31") == VLLMVersion(0, 31, 0)
    with pytest.raises(ValueError):
        VLLMVersion.parse("main")


# -- health wait: a timeout on every branch ----------------------------------------------------------------------
def _assert_times_out(c: VLLMClient, timeout: float, *needles: str) -> None:
    start = time.monotonic()
    with pytest.raises(VLLMTimeoutError) as err:
        c.wait_for_health(timeout, poll_interval=0.2)
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + 3, elapsed
    msg = str(err.value)
    assert f"127.0.0.1:{c.port}" in msg and "last seen" in msg
    for needle in needles:
        assert needle in msg, msg


def test_health_timeout_when_nothing_listens() -> None:
    _assert_times_out(VLLMClient("127.0.0.1", free_port()), 1.0, "ConnectionError")


def test_health_timeout_when_the_server_never_answers() -> None:
    with socket.socket() as s:  # listening but never accepting: each probe times out
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        c = VLLMClient("127.0.0.1", s.getsockname()[1], probe_timeout=0.3)
        _assert_times_out(c, 1.0, "timed out")


def test_health_timeout_on_404() -> None:
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), NotFound)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        _assert_times_out(VLLMClient("127.0.0.1", httpd.server_address[1]), 1.0, "HTTP 404")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_hooks_never_healthy_reset_retry_and_death(tiny_model_dir: Path, logdir: Path) -> None:
    env = {
        "LAUNCHGEN_STANDIN_NEVER_HEALTHY": "1",
        "LAUNCHGEN_STANDIN_RESET_FAILS": "2",
        "LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS": "1",
    }
    s = start_standin(tiny_model_dir, logdir, env=env)
    try:
        c = VLLMClient("127.0.0.1", s.port, control_timeout=10, request_timeout=10)
        _assert_times_out(c, 1.0, "HTTP 503")
        # reset reports success=false twice: a bound of 2 attempts fails, the retry loop succeeds
        with pytest.raises(VLLMServerError, match="success=false after 2 attempts"):
            c.reset_prefix_cache(max_attempts=2, retry_interval=0.01)
        c.reset_prefix_cache(max_attempts=3, retry_interval=0.01)
        model = c.models()[0]["id"]
        c.completions(model, [[1, 2]], 1, SamplingParams(max_tokens=2))  # answered, then the server exits
        assert s.proc.wait(timeout=10) == 1
        start = time.monotonic()
        with pytest.raises(VLLMServerError, match="is the server running"):
            c.completions(model, [[1, 2]], 1, SamplingParams(max_tokens=2))
        assert time.monotonic() - start < 5
    finally:
        s.stop()


# -- the stand-in's CLI behaves like `vllm serve` ----------------------------------------------------------------
def _run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(VLLM_BIN), *args], env=standin_env(env), capture_output=True, text=True, timeout=120
    )


def test_cli_rejects_unknown_flags_and_crashes_like_vllm(tmp_path: Path) -> None:
    r = _run_cli(["serve", "m", "--no-such-flag", "1"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    r = _run_cli(["serve", "m", "--logprobs-mode", "bogus"])
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = _run_cli(["serve", "m"], env={"LAUNCHGEN_STANDIN_CRASH_AT_START": "1"})
    assert r.returncode == 1 and "CRASH_AT_START" in r.stderr
    r = _run_cli(["serve", str(tmp_path / "missing"), "--port", str(free_port())])
    assert r.returncode == 1 and "failed to load model" in r.stderr
    assert _run_cli(["--version"]).stdout.strip() == "0.31.0"


def test_cli_accepts_the_real_flags_dev_routes_404_without_dev_mode_and_sigterm(tiny_model_dir: Path, logdir: Path) -> None:
    flags = [
        "--data_parallel_size", "1", "--max-model-len", "1k", "--gpu-memory-utilization", "0.5",
        "--no-enable-prefix-caching", "--trust-remote-code", "--seed", "7", "--enforce-eager",
        "--served-model-name", "tiny", "--revision", "main", "--model-impl", "vllm", "--kv-cache-dtype", "auto",
    ]  # fmt: skip
    s = start_standin(tiny_model_dir, logdir, extra_args=flags, version="0.33.0", dev_mode=False)
    try:
        c = VLLMClient("127.0.0.1", s.port, control_timeout=10)
        c.wait_for_health(30)
        card = c.models()[0]  # always-on routes work without dev mode
        assert card["id"] == "tiny" and card["max_model_len"] == 1000  # vLLM: k = 1000, K = 1024
        # dev routes are 404 without VLLM_SERVER_DEV_MODE=1, and the client says how to fix it
        for call in (c.server_info, c.get_world_size, c.start_weight_update):
            with pytest.raises(VLLMServerError, match="VLLM_SERVER_DEV_MODE=1") as err:
                call()
            assert err.value.status == 404
        assert requests.get(s.url + "/server_info", timeout=5).json() == {"detail": "Not Found"}
    finally:
        assert s.stop() == 0
    assert "Shutting down" in s.log_text()
