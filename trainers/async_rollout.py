"""Bounded staleness (`generation.max_staleness` k >= 1): the next generation batches are generated on a worker
thread while the current one trains.

Who does what:

* The main thread (`rollout.Rollout`) decides what is generated and when. It samples and tokenizes the prompts of
  generation batch j in the synchronous order, and submits the batch once the server holds the weights it is to be
  generated from: batch j is first trained on at optimizer step c(j) = j * generate_every // GA and generated from
  the weights pushed after step t(j) = max(0, c(j) - k) (0: the initial weights). Submitting at exactly that
  version, not whenever the thread is free, makes which weights generated which sample deterministic (with the
  `finish` push mode), so a resumed run continues as the uninterrupted one would.
* The worker thread only waits on rank 0's HTTP request (`request_all`): no collective, no torch RNG, no
  tokenizer, so it cannot interleave with the training's collectives or change its randomness. The other ranks'
  workers have nothing to do; rank 0's result reaches them by a broadcast on the main thread (`share`) when the
  batch is taken.
* Before a weight push the in-flight generation is either finished (`finish`: the push waits for every submitted
  batch) or frozen in place (`pause`: `/pause?mode=keep`, the push, `/resume`; the push's prefix-cache reset
  preempts the frozen requests, which then continue with the new weights, so a batch is at most as old as the
  version it was submitted at). `benchmarks/async_overlap.py` measures both.
* A checkpoint first finishes every submitted batch and records each (its rows, version and result), so a resumed
  run trains on the same samples.

The importance-sampling correction covers the staleness: the old log-probs are the trainer's at c(j), the sampler's
those of the weights that generated each token (`rollout.Rollout._importance_sampling`).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from launchgen.trainers.generation.protocol import GenerationOutput, SamplingParams
from launchgen.trainers.generation.rank_zero import Payload
from launchgen.trainers.generation.vllm_client import CompletionsResult


class AheadBackend(Protocol):
    """What a backend with `Capabilities.generates_ahead` offers (`vllm_server.VLLMServerBackend`)."""

    def request_all(self, all_prompts: list[list[int]], params: SamplingParams) -> Payload: ...

    def share(self, payload: Payload, start: int, count: int) -> GenerationOutput: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def consume_step(index: int, generate_every: int, ga: int) -> int:
    """The optimizer step (steps done before it) at which generation batch `index` is first trained on."""
    return index * generate_every // ga


def target_version(index: int, generate_every: int, ga: int, k: int) -> int:
    """The weights (optimizer steps in them) generation batch `index` is generated from under max_staleness k."""
    return max(0, consume_step(index, generate_every, ga) - k)


@dataclass
class Job:
    index: int  # generation batch number since the start of training
    version: int  # optimizer steps in the server's weights when it was submitted
    local_rows: list[int]  # this process's prompt rows (data indices, each repeated num_generations times)
    all_prompts: list[list[int]] | None  # every process's prompt token ids; rank 0 only
    payload: Payload | None = None
    done: threading.Event = field(default_factory=threading.Event)


_STOP = None


class AheadGenerator:
    """Submitted jobs run one after another on a daemon thread; `take` hands them back in submission order."""

    def __init__(self, backend: AheadBackend, params: SamplingParams, *, is_main: bool, process_index: int,
                 in_flight_at_push: str) -> None:
        self.backend, self.params = backend, params
        self.is_main, self.process_index = is_main, process_index
        self.in_flight_at_push = in_flight_at_push
        self.next_index = 0  # the next generation batch to submit
        self._pending: deque[Job] = deque()  # submitted, not yet taken (oldest first)
        self._work: queue.Queue[Job | None] = queue.Queue()
        self._running: Job | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._worker, name="launchgen-generate-ahead", daemon=True)
        self._thread.start()

    def _worker(self) -> None:
        while True:
            job = self._work.get()
            if job is _STOP:
                return
            with self._lock:
                self._running = job
            try:
                if self.is_main:
                    assert job.all_prompts is not None
                    job.payload = self.backend.request_all(job.all_prompts, self.params)
                else:
                    job.payload = (None, None)
            except BaseException as exc:  # request_all reports errors itself; anything else must not hang take()
                job.payload = (None, f"{type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._running = None
                job.done.set()

    def submit(self, job: Job) -> None:
        assert job.index == self.next_index, (job.index, self.next_index)
        self.next_index += 1
        self._pending.append(job)
        self._work.put(job)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self, local_count: int) -> tuple[Job, GenerationOutput]:
        """The oldest submitted batch, once generated, with this process's rows (collective: every rank calls it)."""
        if not self._pending:
            raise RuntimeError("async generation: no generation batch was submitted for this step")
        job = self._pending.popleft()
        job.done.wait()
        assert job.payload is not None
        out = self.backend.share(job.payload, self.process_index * local_count, local_count)
        return job, out

    def drain(self) -> None:
        """Wait until every submitted batch is generated."""
        for job in list(self._pending):
            job.done.wait()

    @contextmanager
    def around_push(self) -> Iterator[None]:
        """Around a weight push: finish the in-flight generation first, or freeze it for the push."""
        if self.in_flight_at_push == "finish":
            self.drain()
            yield
            return
        with self._lock:
            paused = self.is_main and self._running is not None
            if paused:
                self.backend.pause()
        try:
            yield
        finally:
            if paused:
                self.backend.resume()

    # -- checkpoints: every submitted batch is finished and recorded -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self.drain()
        jobs = []
        for job in self._pending:
            assert job.payload is not None
            result, message = job.payload
            jobs.append({"index": job.index, "version": job.version, "local_rows": job.local_rows,
                         "result": dataclasses.asdict(result) if result is not None else None, "error": message})
        return {"next_index": self.next_index, "jobs": jobs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert not self._pending, "load the state before submitting"
        self.next_index = int(state["next_index"])
        for rec in state["jobs"]:
            result = CompletionsResult(**rec["result"]) if rec["result"] is not None else None
            job = Job(int(rec["index"]), int(rec["version"]), list(rec["local_rows"]), None, (result, rec["error"]))
            job.done.set()
            self._pending.append(job)

    def close(self) -> None:
        if self._thread.is_alive():
            self._work.put(_STOP)
            # A request in flight may take its full timeout; the thread is a daemon, so do not wait for it.
            self._thread.join(timeout=1.0)
