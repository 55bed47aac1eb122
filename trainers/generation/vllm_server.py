"""Generation from a stock `VLLM_SERVER_DEV_MODE=1 vllm serve` and weight sync over vLLM's transfer engine.

Trainer rank 0 owns the HTTP client and hosts the weight-transfer rendezvous; the other ranks only take part in
the accelerate collectives (prompt gather, result broadcast) and walk the same named-parameter iterator.

Weight sync (reference sections 2.4, 2.7, 8.4, 8.5), on rank 0:

    POST /start_weight_update                      (vLLM >= 0.21)
    POST /update_weights {"update_info": ...}  ||  packed broadcast of the same tensors
    POST /finish_weight_update                     (vLLM >= 0.21)
    POST /reset_prefix_cache                       (retried while it reports success=false, >= 0.26)

Threads: the broadcast runs on a daemon thread, the blocking `/update_weights` POST on a second daemon thread
with its own HTTP timeout, and the main thread pulls the named-parameter iterator and supervises both with a
deadline. The main thread, not the broadcast thread, owns the iterator because under FSDP/ZeRO-3 every `next()`
is a collective: on any failure rank 0 still drains the iterator so the other ranks' gathers complete, then
every rank raises the same error (no rank is left hanging in a mismatched collective). A dead or stuck server
is therefore an error within `weight_sync_timeout`, never a hang; `/finish_weight_update` is attempted
best-effort after a failure so the next start is not refused.

`update_info` must announce (name, dtype, shape) before the bytes flow. The first sync does not know them yet, so
it sends one `/update_weights` per packed chunk (memory bounded by one chunk; vLLM accepts several updates inside
one start/finish session) and records the metadata; later syncs stream the whole model in one call with the
recorded metadata, checking every tensor against it. A sync whose first tensor is not the recorded first one is
another stream (with peft the first push is every weight, the later ones the adapted modules only) and is
learnt again the same way. vLLM < 0.21 has no start/finish, so there the first sync holds the full model once.
Every tensor is copied (on its device) as it is pulled: a gathering iterator only guarantees a tensor until its
next step, and the broadcast reads it later on another thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from launchgen.shared import ports

from .protocol import SamplingParams
from .rank_zero import RankZeroBackend
from .sync_support import (
    GLOO_BACKEND,
    HealthWatch,
    WeightSyncError,
    broadcast_failure,
    init_failure_hint,
    record_event,
    resolve_group_host,
    run_daemon,
    snapshot,
    transport_for_backend,
    wait_port_free,
)
from .sync_support import checked as _checked
from .sync_support import opens_with as _opens_with
from .vllm_client import CompletionsResult, VLLMClient, VLLMServerError, VLLMTimeoutError, VLLMVersion
from .weight_transfer import (
    DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    DEFAULT_PACKED_NUM_BUFFERS,
    TensorMeta,
    Transport,
    make_transport,
    renewed,
    update_info_lists,
)

if TYPE_CHECKING:
    import torch
    from launchgen.trainers.declarations.config import TrainerConfig

logger = logging.getLogger(__name__)

_END = object()
_ABORT = object()
_POLL = 0.05


class VLLMServerBackend(RankZeroBackend):
    """`GenerationBackend` talking to `vllm serve`; build it with `from_config` on every rank."""

    def __init__(
        self,
        accelerator: Any,
        *,
        client: VLLMClient | None,
        transport: Transport | None,
        num_generations: int,
        group_host: str | None = None,
        group_port: int = ports.GROUP_DEFAULT,
        health_timeout: float = 240.0,
        request_timeout: float = 600.0,
        weight_sync_timeout: float = 1800.0,
        control_timeout: float = 300.0,
        rendezvous_timeout: float = 180.0,
        packed: bool = True,
        packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        packed_num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
    ) -> None:
        super().__init__(accelerator)
        if self.is_main and (client is None or transport is None):
            raise ValueError("the main process needs an HTTP client and a weight transport")
        self.client = client
        self.transport = transport
        self.num_generations = num_generations
        self.group_host = group_host
        self.group_port = group_port
        self.health_timeout = health_timeout
        self.request_timeout = request_timeout
        self.weight_sync_timeout = weight_sync_timeout
        self.control_timeout = control_timeout
        self.rendezvous_timeout = rendezvous_timeout
        self.packed = packed
        self.packed_buffer_size_bytes = packed_buffer_size_bytes
        self.packed_num_buffers = packed_num_buffers
        self.model_id: str | None = None
        self.max_model_len: int | None = None
        self.server_world_size: int | None = None
        self.version: VLLMVersion | None = None
        self.server_backend: str | None = None
        #: Completed syncs; sent as the weight version on /finish_weight_update where the server records it.
        self.syncs_done = 0
        #: A sync failed: the weight-transfer stream is out of step, the next sync first rebuilds the group.
        self._group_broken = False
        self._sender: threading.Thread | None = None  # the last sync's broadcast thread
        self._metas: list[TensorMeta] | None = None
        self._generated_once = False
        self._paused = False  # between pause() and resume(): the sync preempts the paused requests at its reset
        self._closed = False
        #: Bytes streamed by the last sync, and the seconds spent in /update_weights + broadcast (no start/finish).
        self.last_sync_bytes = 0
        self.last_transfer_seconds = 0.0
        self._deadline = 0.0

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: TrainerConfig, accelerator: Any) -> VLLMServerBackend:
        s = cfg.generation.vllm_server
        is_main = bool(getattr(accelerator, "is_main_process", True))
        client = transport = None
        if is_main:
            client = VLLMClient(
                s.host,
                s.port,
                base_url=s.base_url,
                request_timeout=s.request_timeout,
                control_timeout=s.control_timeout,
            )
            transport = make_transport(None, getattr(accelerator, "device", None))
        backend = cls(
            accelerator,
            client=client,
            transport=transport,
            num_generations=int(cfg.num_generations or 1),
            group_host=s.group_host,
            group_port=s.group_port,
            health_timeout=s.health_timeout,
            request_timeout=s.request_timeout,
            weight_sync_timeout=s.weight_sync_timeout,
            control_timeout=s.control_timeout,
            rendezvous_timeout=s.rendezvous_timeout,
        )
        backend.connect()
        return backend

    # -- init ---------------------------------------------------------------------------------------------
    def _connect_main(self) -> None:
        assert self.client is not None and self.transport is not None
        c = self.client
        c.wait_for_health(self.health_timeout)
        self.version = c.server_version()
        card = c.models()[0]
        self.model_id = str(card["id"])
        self.max_model_len = card.get("max_model_len")
        self.server_backend = str(c.check_weight_transfer_configured().get("backend", "nccl"))
        self.transport = transport_for_backend(self.server_backend, self.transport)
        self.server_world_size = c.get_world_size()
        self._join_group()

    def _join_group(self, renew: bool = False) -> None:
        """Clear what a previous trainer left on the server, then host the group and have the server join it.

        `renew`: this trainer's own group broke (a failed sync leaves broadcasts half-consumed, so the stream is
        out of step): the old end is closed only after the server dropped its side, which ends any send still
        blocked on it, and a fresh one takes the same port.
        """
        assert self.client is not None and self.version is not None and self.server_world_size is not None
        c = self.client
        self._release_previous_group()
        if renew:
            assert self.transport is not None
            # The server has dropped its side, which ends a send still blocked on the old group; the old store
            # (and its port) goes only once that send has unwound.
            if self._sender is not None:
                self._sender.join(self.rendezvous_timeout)
                self._sender = None
            self.transport.close()
            self.transport = renewed(self.transport)
            if not wait_port_free(self.group_port, self.rendezvous_timeout):
                raise WeightSyncError(
                    f"trainer rank 0 could not renew its weight-transfer group after a failed sync: port "
                    f"{self.group_port} on this node was still taken {self.rendezvous_timeout:g} s after the old "
                    "group closed (generation.vllm_server.rendezvous_timeout)"
                )
        world_size = self.server_world_size + 1
        host = resolve_group_host(self.group_host, c.host)
        init_info: dict[str, Any] = {
            "master_address": host,
            "master_port": self.group_port,
            "rank_offset": 1,
            "world_size": world_size,
        }
        if self.packed and self.version.packed_in_init_info:
            init_info.update(self._packed_fields())
        if self.server_backend == GLOO_BACKEND:
            init_info["timeout_s"] = self.weight_sync_timeout  # how long a worker waits on a stuck trainer
        transport = self.transport
        assert transport is not None
        thread, outcome = run_daemon(
            "launchgen-wt-init",
            lambda: transport.init(host, self.group_port, world_size, self.rendezvous_timeout),
        )
        try:
            c.init_weight_transfer_engine(init_info, timeout=self.rendezvous_timeout)
        except VLLMServerError as exc:
            thread.join(1.0)  # a bind failure on this end ends at once; a wait for the workers does not
            own_error = outcome.error  # read before close(), whose own error would hide it
            transport.close()
            bound = (f" (generation.vllm_server.rendezvous_timeout={self.rendezvous_timeout:g} s)"
                     if isinstance(exc, VLLMTimeoutError) else "")
            # This end's own failure (a port already taken) is often why the workers could not connect.
            own = (f"; trainer rank 0's end on {host}:{self.group_port} failed: {own_error}"
                   if own_error is not None else "")
            raise type(exc)(
                f"weight-transfer rendezvous with the {c.where}: {exc}{bound}{own}"
                f"{init_failure_hint(exc, self.server_backend or 'nccl', host, self.group_port)}",
                endpoint=exc.endpoint,
                status=exc.status,
                body=exc.body,
            ) from exc
        thread.join(self.rendezvous_timeout)
        if not outcome.done:
            raise VLLMTimeoutError(
                f"weight-transfer rendezvous: the {c.where} ({self.server_world_size} worker(s)) joined, "
                f"but trainer rank 0's end on {host}:{self.group_port} did not complete within "
                f"generation.vllm_server.rendezvous_timeout={self.rendezvous_timeout:g} s (the workers reach that address "
                "from the server's node: a firewall, or VLLM_HOST_IP naming an address they cannot reach)"
            )
        if outcome.error is not None:
            raise WeightSyncError(
                f"trainer rank 0 could not host the weight-transfer group on {host}:{self.group_port} for the "
                f"{c.where}: {outcome.error}"
            ) from outcome.error
        logger.info(
            "vLLM %s at %s:%s serves %s (world size %d); %s weight-transfer group on %s:%d",
            self.version, c.host, c.port, self.model_id, self.server_world_size, self.server_backend, host,
            self.group_port,
        )

    def _release_previous_group(self) -> None:
        """Undo what a trainer that crashed may have left on the server, before joining a new group.

        Its group is shut down where the server has the route (a group of dead peers otherwise lingers until its
        timeout); an update it left open is finished; and one start + finish pair restores layers that a failed
        update left mid-reload (vLLM then kills the engine on the next generation). On healthy weights that pair
        changes nothing: no tensor is received, so every layer gets its own weights back.
        """
        assert self.client is not None and self.version is not None
        c = self.client
        try:
            c.shutdown_weight_transfer_engine()
        except VLLMServerError as exc:
            if exc.status is None:
                raise
            # "Cannot release a trainer connection during a weight update": the dead trainer was mid-update.
            logger.warning("vLLM refused to release the previous trainer's group (%s); closing its update first", exc)
            c.finish_weight_update()
            c.shutdown_weight_transfer_engine()
        if self.version.has_update_lifecycle:
            self._start_update()
            c.finish_weight_update()

    def _packed_fields(self) -> dict[str, Any]:
        return {
            "packed": True,
            "packed_buffer_size_bytes": self.packed_buffer_size_bytes,
            "packed_num_buffers": self.packed_num_buffers,
        }

    # -- generation ---------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Rank 0: freeze in-flight requests where they are (vLLM's `/pause?mode=keep`) until `resume`."""
        assert self.client is not None
        self.client.pause(mode="keep", clear_cache=False)
        self._paused = True

    def resume(self) -> None:
        assert self.client is not None
        self._paused = False
        self.client.resume()

    def _generate_main(self, all_prompts: list[list[int]], params: SamplingParams) -> CompletionsResult:
        assert self.client is not None and self.model_id is not None
        if not self._generated_once:
            self.client.wait_for_health(self.health_timeout)
            self._generated_once = True
        if self.max_model_len is not None:
            longest = max((len(p) for p in all_prompts), default=0)
            if longest + params.max_tokens > int(self.max_model_len):
                raise VLLMServerError(
                    f"a prompt of {longest} tokens + generation.max_completion_length={params.max_tokens} exceeds the "
                    f"server's max_model_len={self.max_model_len}: restart `vllm serve` with a larger --max-model-len, "
                    "or lower data.max_prompt_length / generation.max_completion_length",
                    endpoint="/v1/completions",
                )
        g = self.num_generations
        grouped = g > 1 and len(all_prompts) % g == 0 and all(
            all_prompts[i] == all_prompts[i - i % g] for i in range(len(all_prompts))
        )
        if grouped:
            # The sampler repeats each prompt g times consecutively: send each once with n=g (prompt-major back).
            res = self.client.completions(self.model_id, all_prompts[::g], g, params, timeout=self.request_timeout)
            res.prompt_ids = [p for p in res.prompt_ids for _ in range(g)]
            return res
        return self.client.completions(self.model_id, all_prompts, 1, params, timeout=self.request_timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.transport is not None:
            self.transport.close()
        if self.client is not None:
            self.client.close()

    # -- weight sync --------------------------------------------------------------------------------------
    def _sync_main(self, it: Iterator[tuple[str, torch.Tensor]]) -> None:
        assert self.client is not None and self.version is not None
        c = self.client
        lifecycle = self.version.has_update_lifecycle
        started = False
        self.last_sync_bytes = 0
        self.last_transfer_seconds = 0.0
        # One budget for the whole sync, however many /update_weights calls the first one needs.
        self._deadline = time.monotonic() + self.weight_sync_timeout
        try:
            if self._group_broken:
                self._join_group(renew=True)
                self._group_broken = False
            if lifecycle:
                started = True  # also when start times out: the server may still open the session later
                self._start_update()
            if self._metas:
                it, known = _opens_with(it, self._metas[0])
                if not known:
                    self._metas = None
            if self._metas is not None:
                self._transfer(self._metas, _checked(it, self._metas))
            elif lifecycle and self.packed:
                self._metas = self._transfer_chunked(it)
            else:
                items = [(n, snapshot(t)) for n, t in it]
                metas = [TensorMeta.of(n, t) for n, t in items]
                self._transfer(metas, iter(items))
                self._metas = metas
            if lifecycle:
                c.finish_weight_update(str(self.syncs_done + 1))
                started = False
            # Paused requests hold cache blocks; preempting them lets the reset succeed and recomputes their KV.
            c.reset_prefix_cache(reset_running_requests=self._paused)
            self.syncs_done += 1
        except BaseException:
            for _ in it:  # finish every collective the other ranks are (or will be) waiting in
                pass
            self._group_broken = True
            if started:
                self._recover_failed_update()
            raise

    def _start_update(self) -> None:
        """/start_weight_update; a session left open (a start whose answer timed out) is closed and reopened."""
        assert self.client is not None
        try:
            self.client.start_weight_update()
        except VLLMServerError as exc:
            if exc.status != 500 or "already active" not in str(exc):
                raise
            logger.warning("the server had a weight update open (%s); finishing it and starting again", exc)
            self.client.finish_weight_update()
            self.client.start_weight_update()

    def _recover_failed_update(self) -> None:
        """Close the server's update session so it keeps serving (best effort; the original error is raised).

        After a failed /update_weights vLLM has already ended the session itself, with the model's layers in
        the middle of a layerwise reload (empty): it refuses /finish_weight_update ("called without a matching
        start_weight_update"), and the next generation kills the engine. A fresh start + finish puts the
        layers' last complete weights back. The next sync sends every tensor again.
        """
        assert self.client is not None
        c = self.client
        try:
            c.finish_weight_update()
            return
        except VLLMServerError as exc:
            if exc.status is None:  # the server is gone: nothing to close
                logger.warning("after a failed sync the server does not answer: %s", exc)
                return
        try:
            c.start_weight_update()
            c.finish_weight_update()
            logger.warning("weight sync failed; closed the server's update session with start + finish")
        except VLLMServerError as exc:
            logger.warning("could not close the server's update session after a failed sync: %s", exc)

    def _transfer_chunked(self, it: Iterator[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
        """First sync: one /update_weights per packed chunk; returns the metadata seen."""
        metas: list[TensorMeta] = []
        chunk: list[tuple[str, torch.Tensor]] = []
        total = 0
        for name, tensor in it:
            chunk.append((name, snapshot(tensor)))
            total += tensor.numel() * tensor.element_size()
            if total > self.packed_buffer_size_bytes:  # vLLM's rule: the crossing tensor closes the chunk
                metas += self._send_chunk(chunk)
                chunk, total = [], 0
        if chunk:
            metas += self._send_chunk(chunk)
        return metas

    def _send_chunk(self, chunk: list[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
        metas = [TensorMeta.of(n, t) for n, t in chunk]
        self._transfer(metas, iter(chunk))
        return metas

    def _update_info(self, metas: list[TensorMeta]) -> dict[str, Any]:
        assert self.version is not None
        info: dict[str, Any] = update_info_lists(metas)
        if self.packed and not self.version.packed_in_init_info:
            info.update(self._packed_fields())
        return info

    def _transfer(self, metas: list[TensorMeta], items: Iterator[tuple[str, torch.Tensor]]) -> None:
        """One /update_weights (HTTP thread) || one broadcast stream (sender thread), fed by this thread."""
        assert self.client is not None and self.transport is not None
        client, transport = self.client, self.transport
        update_info = self._update_info(metas)
        started = time.monotonic()
        deadline = self._deadline
        q: queue.Queue[Any] = queue.Queue(maxsize=4)
        wake = threading.Event()  # set by either helper thread when it ends, so the wait below has no poll latency

        def feed() -> Iterator[tuple[str, torch.Tensor]]:
            while True:
                item = q.get()
                if item is _END:
                    return
                if item is _ABORT:
                    raise WeightSyncError("weight transfer aborted by the main thread")
                name, tensor, event = item
                if event is not None:
                    import torch

                    # The tensor was produced on the main thread's stream; the sender may use another one.
                    stream = torch.cuda.current_stream()
                    stream.wait_event(event)
                    tensor.record_stream(stream)
                self.last_sync_bytes += tensor.numel() * tensor.element_size()
                yield name, tensor

        self._sender, sent = run_daemon(
            "launchgen-wt-send",
            lambda: transport.send(
                feed(),
                packed=self.packed,
                buffer_size_bytes=self.packed_buffer_size_bytes,
                num_buffers=self.packed_num_buffers,
            ),
            wake,
        )
        _, answered = run_daemon(
            "launchgen-wt-http",
            lambda: client.update_weights(update_info, timeout=max(deadline - time.monotonic(), 1.0)),
            wake,
        )

        watch = HealthWatch(client.health_problem, client.where, wake)

        def check() -> None:
            if answered.error is not None:
                raise answered.error
            if sent.error is not None:
                raise broadcast_failure(sent.error, client.health_problem, client.where,
                                        answer=lambda: answered.error) from sent.error
            if watch.problem is not None and not answered.done:
                raise VLLMServerError(watch.problem, endpoint="/update_weights")
            if time.monotonic() > deadline:
                raise VLLMTimeoutError(
                    f"weight update to {client.where} did not finish within weight_sync_timeout="
                    f"{self.weight_sync_timeout:g} s (server {'answered' if answered.done else 'has not answered'}, "
                    f"broadcast {'done' if sent.done else 'still running'})",
                    endpoint="/update_weights",
                )

        def put(item: Any) -> None:
            while True:
                check()
                try:
                    q.put(item, timeout=_POLL)
                    return
                except queue.Full:
                    continue

        try:
            with watch:
                for name, tensor in items:
                    put((name, tensor, record_event(tensor)))
                put(_END)
                while True:
                    wake.clear()  # before the check: a thread ending after it sets the event again
                    check()
                    if sent.done and answered.done:
                        self.last_transfer_seconds += time.monotonic() - started
                        break
                    wake.wait(max(min(deadline - time.monotonic(), 1.0), 0.0))
        except BaseException:
            with contextlib.suppress(queue.Full):
                q.put_nowait(_ABORT)
            raise
