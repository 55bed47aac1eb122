"""Trainer-side weight transports for the vLLM server backend, and vLLM's packed broadcast wire format.

The trainer is rank 0 of a group it hosts (TCPStore master on `group_port`); the server's W workers join as ranks
1..W (`rank_offset` 1). Every update is a sequence of broadcasts from rank 0:

* packed (what TRL and the backend use): tensors are turned into flat uint8 views and concatenated; a chunk is
  closed right AFTER the running byte count exceeds the buffer size, so the tensor that crosses the limit is still
  part of it (vLLM 0.22-0.33 `packed_tensor.pack_tensors`; default 1 GiB). The receiver rebuilds the very same
  boundaries from the announced (name, dtype, shape) list, so sender and receiver must agree byte for byte;
* unpacked: one broadcast per tensor.

Transports:

* `NCCLTransport` - production: vLLM's own trainer-side helpers (`nccl_common.trainer_init` +
  `packed_tensor.packed_nccl_broadcast_producer`; on older vLLM `NCCLWeightTransferEngine.trainer_init /
  trainer_send_weights`), imported lazily so this module imports without vllm.
* `TorchDistTransport` (`GlooTransport`, `TorchNCCLTransport`) - the same choreography and packing over a
  private torch.distributed process group (TCPStore + ProcessGroupGloo/NCCL, never the default group). Only the
  stand-in server (tests/vllm_standin) speaks it: a real vLLM worker rendezvouses through vLLM's
  StatelessProcessGroup, which is a different protocol.

`TorchDistReceiver` is the worker side of `TorchDistTransport`; the stand-in server uses it.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from launchgen.shared.jobdir import ENV_WEIGHT_TRANSPORT

if TYPE_CHECKING:
    import torch

DEFAULT_PACKED_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024  # vLLM's default; the server must use the same
DEFAULT_PACKED_NUM_BUFFERS = 2
TRANSPORT_ENV = ENV_WEIGHT_TRANSPORT
TRANSPORT_KINDS = ("nccl", "gloo", "torch-nccl")

NamedTensor = tuple[str, "torch.Tensor"]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `bfloat16`: the form vLLM resolves with getattr(torch, name)."""
    return str(dtype).removeprefix("torch.")


def chunk_boundaries(sizes: Sequence[int], buffer_size_bytes: int) -> list[list[int]]:
    """Indices of the tensors in each packed chunk, for tensors of `sizes` bytes (vLLM's rule, both sides)."""
    if buffer_size_bytes <= 0:
        raise ValueError(f"packed buffer size must be positive, got {buffer_size_bytes}")
    chunks: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        current.append(i)
        total += size
        if total > buffer_size_bytes:
            chunks.append(current)
            current, total = [], 0
    if current:
        chunks.append(current)
    return chunks


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    # reshape before view: a 0-dim tensor cannot be re-viewed as a dtype of another item size.
    return tensor.contiguous().reshape(-1).view(torch.uint8)


@dataclass
class PackedChunk:
    buffer: torch.Tensor  # flat uint8
    names: list[str]
    sizes: list[int]


def iter_packed_chunks(named: Iterable[NamedTensor], buffer_size_bytes: int) -> Iterator[PackedChunk]:
    """Producer side of the packed format: consume (name, tensor) pairs, yield one uint8 buffer per chunk."""
    import torch

    parts: list[torch.Tensor] = []
    names: list[str] = []
    sizes: list[int] = []
    total = 0
    for name, tensor in named:
        flat = _flat_bytes(tensor)
        parts.append(flat)
        names.append(name)
        sizes.append(flat.numel())
        total += flat.numel()
        if total > buffer_size_bytes:
            yield PackedChunk(torch.cat(parts), names, sizes)
            parts, names, sizes, total = [], [], [], 0
    if parts:
        yield PackedChunk(torch.cat(parts), names, sizes)


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype_name: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        import torch

        return math.prod(self.shape) * getattr(torch, self.dtype_name).itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorMeta:
        return cls(name, dtype_name(tensor.dtype), tuple(tensor.shape))


def update_info_lists(metas: Sequence[TensorMeta]) -> dict[str, list[Any]]:
    """The `names` / `dtype_names` / `shapes` triple of an NCCL update_info."""
    return {
        "names": [m.name for m in metas],
        "dtype_names": [m.dtype_name for m in metas],
        "shapes": [list(m.shape) for m in metas],
    }


def unpack_chunk(buffer: torch.Tensor, metas: Sequence[TensorMeta]) -> list[NamedTensor]:
    import torch

    pieces = buffer.split([m.nbytes for m in metas])
    return [(m.name, p.view(getattr(torch, m.dtype_name)).reshape(m.shape)) for m, p in zip(metas, pieces, strict=True)]


@runtime_checkable
class Transport(Protocol):
    """Trainer rank 0's end of the weight-transfer group."""

    def init(self, master_address: str, master_port: int, world_size: int, timeout: float) -> None:
        """Host the rendezvous on master_address:master_port as rank 0 and wait until all `world_size` joined."""
        ...

    def send(
        self,
        named_tensors: Iterable[NamedTensor],
        *,
        packed: bool,
        buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
    ) -> None:
        """Broadcast the tensors from rank 0, packed exactly like vLLM or one per tensor."""
        ...

    def close(self) -> None:
        """Drop the group; safe to call twice."""
        ...


class TransportError(RuntimeError):
    pass


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


class _TorchDistGroup:
    """A private process group (own TCPStore, never the default group), so it coexists with accelerate's."""

    def __init__(self, backend: str, device: torch.device | None) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        self.backend = backend
        self.device = device
        self.pg: Any = None
        self.store: Any = None

    def _tensor_device(self) -> torch.device:
        import torch

        if self.backend == "nccl":
            if self.device is None:
                return torch.device("cuda", torch.cuda.current_device())
            return self.device
        return torch.device("cpu")

    def _set_device(self) -> None:
        # The CUDA current device is per thread; transfers run on helper threads.
        import torch

        if self.backend == "nccl" and self.device is not None and self.device.index is not None:
            torch.cuda.set_device(self.device)

    def connect(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self._set_device()
        self.store = dist.TCPStore(
            host,
            port,
            world_size if rank == 0 else None,
            rank == 0,
            timeout=_timedelta(timeout),
            wait_for_workers=False,
        )
        prefixed = dist.PrefixStore("launchgen-weight-transfer", self.store)
        if self.backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, _timedelta(timeout))
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = _timedelta(timeout)
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        # A one-element all_reduce makes every rank finish connecting before init returns, like vLLM's
        # PyNcclCommunicator warm-up, so the HTTP init call and the group agree on "joined".
        probe = torch.ones(1, device=self._tensor_device())
        self.pg.allreduce([probe]).wait()
        if self.backend == "nccl":
            torch.cuda.synchronize()
        if int(probe.item()) != world_size:
            raise TransportError(f"weight-transfer group warm-up saw {int(probe.item())} ranks, expected {world_size}")

    def broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        if self.pg is None:
            raise TransportError("weight-transfer group is not initialised (call init first)")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        pg, self.pg, self.store = self.pg, None, None
        if pg is not None and hasattr(pg, "shutdown"):
            # A peer that already died must not turn close() into an error.
            with contextlib.suppress(Exception):
                pg.shutdown()


class TorchDistTransport:
    """vLLM's choreography over torch.distributed (gloo on CPU, NCCL on GPU); understood by the stand-in only."""

    def __init__(self, backend: str = "gloo", device: torch.device | None = None) -> None:
        self._group = _TorchDistGroup(backend, device)

    @property
    def backend(self) -> str:
        return self._group.backend

    def init(self, master_address: str, master_port: int, world_size: int, timeout: float) -> None:
        self._group.connect(master_address, master_port, 0, world_size, timeout)

    def send(
        self,
        named_tensors: Iterable[NamedTensor],
        *,
        packed: bool,
        buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
    ) -> None:
        import torch

        self._group._set_device()
        target = self._group._tensor_device()
        moved = ((n, t.detach().to(target)) for n, t in named_tensors)
        if packed:
            for chunk in iter_packed_chunks(moved, buffer_size_bytes):
                self._group.broadcast(chunk.buffer)
        else:
            for _name, tensor in moved:
                self._group.broadcast(_flat_bytes(tensor))
        if self._group.backend == "nccl":
            torch.cuda.synchronize()

    def close(self) -> None:
        self._group.close()


class GlooTransport(TorchDistTransport):
    def __init__(self) -> None:
        super().__init__("gloo")


class TorchNCCLTransport(TorchDistTransport):
    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__("nccl", device)


class TorchDistReceiver:
    """Worker side of `TorchDistTransport`: joins as `rank`, rebuilds vLLM's chunks from the announced metadata."""

    def __init__(self, backend: str = "gloo", device: torch.device | None = None) -> None:
        self._group = _TorchDistGroup(backend, device)

    def init(self, master_address: str, master_port: int, rank: int, world_size: int, timeout: float) -> None:
        self._group.connect(master_address, master_port, rank, world_size, timeout)

    def receive(
        self,
        metas: Sequence[TensorMeta],
        load: Callable[[list[NamedTensor]], None],
        *,
        packed: bool,
        buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    ) -> list[int]:
        """Receive one update; returns the byte size of every broadcast (the chunk sizes when packed)."""
        import torch

        self._group._set_device()
        device = self._group._tensor_device()
        sizes = [m.nbytes for m in metas]
        groups = chunk_boundaries(sizes, buffer_size_bytes) if packed else [[i] for i in range(len(metas))]
        seen: list[int] = []
        for idx in groups:
            chunk_metas = [metas[i] for i in idx]
            buf = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8, device=device)
            self._group.broadcast(buf)
            seen.append(buf.numel())
            load(unpack_chunk(buf, chunk_metas))
        return seen

    def close(self) -> None:
        self._group.close()


class NCCLTransport:
    """Production transport: vLLM's own trainer-side NCCL helpers (imported lazily)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self._comm: Any = None

    def _set_device(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise TransportError(
                "the NCCL weight transport needs a CUDA device on trainer rank 0; on a CPU-only test setup against "
                f"the stand-in server set {TRANSPORT_ENV}=gloo"
            )
        if self.device is not None and self.device.index is not None:
            # vLLM builds the endpoint on torch.accelerator.current_device_index(), which is per thread.
            torch.cuda.set_device(self.device)

    def init(self, master_address: str, master_port: int, world_size: int, timeout: float) -> None:
        self._set_device()
        info = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        try:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init
        except ImportError:
            try:
                from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
            except ImportError as exc:
                raise TransportError(
                    "the NCCL weight transport uses vLLM's trainer-side helpers, but `vllm` (>= 0.21) is not "
                    "importable on the trainer: install it there (`pip install 'launchgen[vllm]'`)"
                ) from exc
            trainer_init = NCCLWeightTransferEngine.trainer_init
        self._comm = trainer_init(info)

    def send(
        self,
        named_tensors: Iterable[NamedTensor],
        *,
        packed: bool,
        buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
    ) -> None:
        import torch

        if self._comm is None:
            raise TransportError("NCCL weight transport is not initialised (call init first)")
        self._set_device()
        iterator = iter(named_tensors)
        try:
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer
        except ImportError:
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerSendWeightsArgs,
                NCCLWeightTransferEngine,
            )

            args = NCCLTrainerSendWeightsArgs(
                group=self._comm,
                packed=packed,
                packed_buffer_size_bytes=buffer_size_bytes,
                packed_num_buffers=num_buffers,
            )
            NCCLWeightTransferEngine.trainer_send_weights(iterator, args)
            torch.cuda.synchronize()
            return
        if packed:
            packed_nccl_broadcast_producer(
                iterator=iterator,
                group=self._comm,
                src=0,
                post_iter_func=lambda item: item[1],
                buffer_size_bytes=buffer_size_bytes,
                num_buffers=num_buffers,
            )
        else:
            stream = torch.cuda.current_stream()
            for _name, tensor in iterator:
                self._comm.broadcast(tensor.contiguous(), src=0, stream=stream)
        torch.cuda.synchronize()

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None and getattr(comm, "group", None) is not None:
            # Same local-only teardown as TRL: drop the store/socket so the port is released.
            for attr in ("store", "socket"):
                if hasattr(comm.group, attr):
                    setattr(comm.group, attr, None)


def renewed(transport: Transport) -> Transport:
    """An unconnected transport of the same kind and device, to host a new group after the old one broke."""
    if isinstance(transport, NCCLTransport):
        return NCCLTransport(transport.device)
    if isinstance(transport, GlooTransport):
        return GlooTransport()
    if isinstance(transport, TorchNCCLTransport):
        return TorchNCCLTransport(transport._group.device)
    raise TransportError(f"cannot rebuild a weight-transfer group of {type(transport).__name__}")


def make_transport(kind: str | None, device: torch.device | None) -> Transport:
    """`nccl` (vLLM helpers, default), `gloo` (CPU tests) or `torch-nccl` (stand-in on GPUs without vllm)."""
    kind = (kind or os.environ.get(TRANSPORT_ENV) or "nccl").strip().lower()
    if kind == "nccl":
        return NCCLTransport(device)
    if kind == "gloo":
        return GlooTransport()
    if kind == "torch-nccl":
        return TorchNCCLTransport(device)
    raise ValueError(f"{TRANSPORT_ENV}={kind!r} is not a weight transport; choose one of {', '.join(TRANSPORT_KINDS)}")
