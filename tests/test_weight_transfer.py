"""The packed wire format and the torch.distributed (gloo) transport, in-process (no server)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any

import pytest
import torch
from launchgen.trainers.generation.weight_transfer import (
    GlooTransport,
    NCCLTransport,
    TensorMeta,
    TorchDistReceiver,
    TorchNCCLTransport,
    TransportError,
    chunk_boundaries,
    iter_packed_chunks,
    make_transport,
    unpack_chunk,
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_chunk_rule_closes_after_the_crossing_tensor() -> None:
    # buffer 10: 4+4 = 8 (open), +4 = 12 > 10 -> close [0,1,2]; 10 alone is not > 10 -> open, +1 -> close.
    assert chunk_boundaries([4, 4, 4, 10, 1, 3], 10) == [[0, 1, 2], [3, 4], [5]]
    # a tensor bigger than the buffer closes its own chunk right away
    assert chunk_boundaries([25, 1], 10) == [[0], [1]]
    # exactly the buffer size does not close the chunk ("exceeds", not "reaches")
    assert chunk_boundaries([5, 5, 1], 10) == [[0, 1, 2]]
    assert chunk_boundaries([], 10) == []
    with pytest.raises(ValueError):
        chunk_boundaries([1], 0)


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 5, generator=g)),  # 60 bytes
        ("b", torch.randn(7, generator=g).to(torch.bfloat16)),  # 14 bytes
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),  # 0-dim, 8 bytes
        ("c", torch.randn(4, 4, generator=g).t()),  # non-contiguous, 64 bytes
        ("d", torch.arange(5, dtype=torch.int64)),  # 40 bytes
    ]


def test_packed_chunks_follow_the_rule_and_round_trip() -> None:
    named = _named()
    metas = [TensorMeta.of(n, t) for n, t in named]
    assert [m.nbytes for m in metas] == [60, 14, 8, 64, 40]
    chunks = list(iter_packed_chunks(iter(named), 70))
    # 60, +14 = 74 > 70 -> close; 8 + 64 = 72 > 70 -> close; 40 -> final
    assert [c.names for c in chunks] == [["a", "b"], ["scalar", "c"], ["d"]]
    assert [c.buffer.numel() for c in chunks] == [74, 72, 40]
    assert [[metas[i].name for i in idx] for idx in chunk_boundaries([m.nbytes for m in metas], 70)] == [
        c.names for c in chunks
    ]
    by_name = dict(named)
    start = 0
    for chunk in chunks:
        part = metas[start : start + len(chunk.names)]
        start += len(chunk.names)
        for name, tensor in unpack_chunk(chunk.buffer, part):
            assert tensor.dtype == by_name[name].dtype
            assert torch.equal(tensor, by_name[name])


def _run_pair(packed: bool, buffer_size: int, world: int = 2) -> tuple[list[list[int]], dict[str, torch.Tensor]]:
    named = _named()
    metas = [TensorMeta.of(n, t) for n, t in named]
    port = _port()
    received: dict[str, torch.Tensor] = {}
    seen: list[list[int]] = []
    errors: list[BaseException] = []

    def receiver(rank: int) -> None:
        try:
            r = TorchDistReceiver("gloo")
            r.init("127.0.0.1", port, rank, world, 30)
            sizes = r.receive(
                metas,
                lambda pairs: received.update({n: t.clone() for n, t in pairs}) if rank == 1 else None,
                packed=packed,
                buffer_size_bytes=buffer_size,
            )
            seen.append(sizes)
            r.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=receiver, args=(r,), daemon=True) for r in range(1, world)]
    for t in threads:
        t.start()
    sender = GlooTransport()
    sender.init("127.0.0.1", port, world, 30)
    sender.send(iter(named), packed=packed, buffer_size_bytes=buffer_size)
    sender.close()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return seen, received


@pytest.mark.parametrize("packed", [True, False])
def test_gloo_transport_delivers_bit_exact(packed: bool) -> None:
    seen, received = _run_pair(packed, buffer_size=70, world=3)
    expected_sizes = [74, 72, 40] if packed else [60, 14, 8, 64, 40]
    assert seen == [expected_sizes, expected_sizes]
    for name, tensor in _named():
        assert received[name].dtype == tensor.dtype
        assert torch.equal(received[name], tensor), name


def test_receiver_dead_mid_transfer_fails_the_sender_within_its_timeout() -> None:
    port = _port()
    metas = [TensorMeta("x", "float32", (1024,)), TensorMeta("y", "float32", (1024,))]

    def receiver() -> None:
        r = TorchDistReceiver("gloo")
        r.init("127.0.0.1", port, 1, 2, 10)
        # take the first chunk, then "die" without receiving the second
        r._group.broadcast(torch.empty(metas[0].nbytes, dtype=torch.uint8))
        r.close()

    t = threading.Thread(target=receiver, daemon=True)
    t.start()
    sender = GlooTransport()
    sender.init("127.0.0.1", port, 2, 3)
    named = [("x", torch.zeros(1024)), ("y", torch.zeros(1024))]
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        sender.send(iter(named), packed=True, buffer_size_bytes=1000)  # one broadcast per tensor
    assert time.monotonic() - start < 20
    sender.close()
    t.join(5)


def test_transport_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAUNCHGEN_WEIGHT_TRANSPORT", raising=False)
    assert isinstance(make_transport(None, None), NCCLTransport)
    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    assert isinstance(make_transport(None, None), GlooTransport)
    assert isinstance(make_transport("torch-nccl", None), TorchNCCLTransport)
    with pytest.raises(ValueError, match="LAUNCHGEN_WEIGHT_TRANSPORT"):
        make_transport("ucx", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_nccl_transport_without_cuda_names_the_gloo_switch() -> None:
    with pytest.raises(TransportError, match="LAUNCHGEN_WEIGHT_TRANSPORT=gloo"):
        NCCLTransport().init("127.0.0.1", _port(), 2, 1)


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, new_api: bool) -> dict[str, Any]:
    """Modules with vLLM's trainer-side signatures (read from the 0.31 / 0.27 wheels), recording their calls."""
    import types

    calls: dict[str, Any] = {}

    class Comm:
        def __init__(self) -> None:
            self.group = types.SimpleNamespace(store=object(), socket=object())

        def broadcast(self, tensor: Any, src: int, stream: Any = None) -> None:
            calls.setdefault("broadcast", []).append((tensor.numel(), src))

    def trainer_init(init_info: dict[str, Any], rank: int = 0) -> Comm:  # vLLM 0.31 nccl_common
        calls["init"] = (dict(init_info), rank)
        return Comm()

    def producer(iterator: Any, group: Any, src: int, post_iter_func: Any, buffer_size_bytes: int = 1 << 30,
                 num_buffers: int = 2) -> None:  # fmt: skip
        calls["producer"] = ([post_iter_func(item).numel() for item in iterator], src, buffer_size_bytes, num_buffers)

    class Args:  # 0.27 NCCLTrainerSendWeightsArgs
        def __init__(self, group: Any, src: int = 0, post_iter_func: Any = None, packed: bool = False, stream: Any = None,
                     packed_buffer_size_bytes: int = 1 << 30, packed_num_buffers: int = 2) -> None:  # fmt: skip
            self.group, self.packed, self.size = group, packed, packed_buffer_size_bytes

    class Engine:
        @staticmethod
        def trainer_init(init_info: dict[str, Any]) -> Comm:
            calls["init"] = (dict(init_info), 0)
            return Comm()

        @staticmethod
        def trainer_send_weights(iterator: Any, trainer_args: Args) -> None:
            calls["send_weights"] = ([t.numel() for _, t in iterator], trainer_args.packed, trainer_args.size)

    mods = {n: types.ModuleType(n) for n in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer",
                                             "vllm.distributed.weight_transfer.nccl_engine")}  # fmt: skip
    mods["vllm.distributed.weight_transfer.nccl_engine"].NCCLWeightTransferEngine = Engine  # type: ignore[attr-defined]
    mods["vllm.distributed.weight_transfer.nccl_engine"].NCCLTrainerSendWeightsArgs = Args  # type: ignore[attr-defined]
    if new_api:
        common = types.ModuleType("vllm.distributed.weight_transfer.nccl_common")
        common.trainer_init = trainer_init  # type: ignore[attr-defined]
        packed = types.ModuleType("vllm.distributed.weight_transfer.packed_tensor")
        packed.packed_nccl_broadcast_producer = producer  # type: ignore[attr-defined]
        mods[common.__name__], mods[packed.__name__] = common, packed
    else:
        for name in ("nccl_common", "packed_tensor"):
            monkeypatch.setitem(sys.modules, f"vllm.distributed.weight_transfer.{name}", None)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: None)
    return calls


@pytest.mark.parametrize("new_api", [True, False])
def test_nccl_transport_calls_vllms_trainer_helpers(monkeypatch: pytest.MonkeyPatch, new_api: bool) -> None:
    calls = _fake_vllm(monkeypatch, new_api)
    t = NCCLTransport(torch.device("cuda", 1))
    t.init("10.0.0.1", 51216, 3, 30)
    assert calls["init"] == ({"master_address": "10.0.0.1", "master_port": 51216, "world_size": 3}, 0)
    named = [("a", torch.zeros(3)), ("b", torch.zeros(2, 2))]
    t.send(iter(named), packed=True, buffer_size_bytes=1024, num_buffers=2)
    if new_api:
        assert calls["producer"] == ([3, 4], 0, 1024, 2)  # post_iter_func hands vLLM the tensor itself
        t.send(iter(named), packed=False)
        assert calls["broadcast"] == [(3, 0), (4, 0)]
    else:
        assert calls["send_weights"] == ([3, 4], True, 1024)
    t.close()
    t.close()
