"""Every request TRL's VLLMClient makes is bounded (launchgen.trainers.trl.server.bound_http): TRL 1.16 sends them
without a timeout, so a server that accepts a request and never answers held the trainer for good. Against a
real socket that accepts and never answers, with TRL's own retry policy mounted."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import types
from collections.abc import Iterator

import pytest
import requests
from launchgen.trainers.trl import server
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP address that accepts every connection, reads the request and never answers; the requests seen."""
    seen: list[bytes] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                seen.append(conn.recv(65536))
            held.append(conn)  # open, unanswered

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", seen
    stop.set()
    thread.join(5)
    for c in held:
        c.close()
    sock.close()


def _bounded(monkeypatch: pytest.MonkeyPatch, seconds: float) -> types.SimpleNamespace:
    """A module like TRL's client module (its `requests` global), bounded, with every bound `seconds`."""
    monkeypatch.setattr(server, "ENDPOINT_TIMEOUTS_S", dict.fromkeys(server.ENDPOINT_TIMEOUTS_S, seconds))
    monkeypatch.setattr(server, "CONTROL_TIMEOUT_S", seconds)
    module = types.SimpleNamespace(requests=requests)
    server.bound_http(module)
    return module


def _trl_session(module: types.SimpleNamespace) -> requests.Session:
    """The session as TRL 1.16's VLLMClient.__init__ builds it: retries on reads, POST included."""
    session = module.requests.Session()
    retry = Retry(total=5, connect=5, read=5, status=3, status_forcelist=[500, 502, 503], backoff_factor=2,
                  allowed_methods=["POST", "GET"])
    session.mount("http://", HTTPAdapter(max_retries=retry, pool_maxsize=64))
    return session


@pytest.mark.parametrize(("method", "endpoint"), [("post", "/update_weights"), ("post", "/v1/completions"),
                                                  ("post", "/init_weight_transfer_engine"),
                                                  ("get", "/get_world_size"), ("get", "/server_info")])
def test_a_request_without_an_answer_fails_within_its_bound_naming_it_and_is_not_sent_again(
        monkeypatch: pytest.MonkeyPatch, silent_server: tuple[str, list[bytes]], method: str, endpoint: str) -> None:
    url, seen = silent_server
    session = _trl_session(_bounded(monkeypatch, 0.5))
    start = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout, match=rf"{method.upper()} .*{endpoint} got no answer from "
                                                              r"the vLLM server within 0.5 s"):
        getattr(session, method)(url + endpoint, json={})
    assert time.monotonic() - start < 5
    # a second /update_weights would start a second receive on a server still busy with the first
    assert len(seen) == 1 and seen[0].split(b" ")[1] == endpoint.encode()


def test_trls_bare_health_probe_is_bounded(monkeypatch: pytest.MonkeyPatch,
                                           silent_server: tuple[str, list[bytes]]) -> None:
    """TRL's check_server calls `requests.get(url)` (no session, no timeout) in its retry loop."""
    url, _seen = silent_server
    module = _bounded(monkeypatch, 0.5)
    start = time.monotonic()
    with pytest.raises(requests.exceptions.RequestException, match=r"GET .*/health got no answer"):
        module.requests.get(url + "/health")
    assert time.monotonic() - start < 5


def test_trls_client_module_is_bounded_once_with_the_bundled_backends_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.generation import vllm_client

    monkeypatch.setattr(vllm_client, "requests", vllm_client.requests)  # restored after the test
    server.bound_http(vllm_client)
    bounded = vllm_client.requests
    server.bound_http(vllm_client)
    assert vllm_client.requests is bounded and issubclass(bounded.Session, requests.Session)
    assert bounded.exceptions is requests.exceptions and bounded.ConnectionError is requests.ConnectionError
    assert [server.timeout_for(f"http://h:1{e}") for e in ("/v1/completions", "/update_weights", "/health",
                                                            "/get_world_size", "/init_weight_transfer_engine/")] \
        == [600.0, 1800.0, 5.0, 300.0, server.GROUP_TIMEOUT_S + 300.0]
