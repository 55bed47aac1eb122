"""The collective shell of a backend whose HTTP work happens on trainer rank 0 only (one server or several).

Every rank calls `connect`, `generate` and `sync_weights`; rank 0 does the work (`_connect_main`,
`_generate_main`, `_sync_main`, supplied by the subclass) and the others take part in the same accelerate
collectives (prompt gather, result broadcast, the named-parameter walk), so all ranks raise the same error
together instead of some hanging in the next collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .protocol import GenerationOutput, SamplingParams
from .sync_support import WeightSyncError
from .vllm_client import CompletionsResult, VLLMServerError

if TYPE_CHECKING:
    import torch

#: Rank 0's generation outcome: the result, or the text of the error every rank raises (`share`).
Payload = tuple[CompletionsResult | None, str | None]


class RankZeroBackend:
    """Collectives around rank 0's work; subclasses implement the three `_*_main` methods."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.is_main = bool(getattr(accelerator, "is_main_process", True))
        self._connected = False

    # -- rank 0's work (subclasses) ------------------------------------------------------------------------
    def _connect_main(self) -> None:
        raise NotImplementedError

    def _generate_main(self, all_prompts: list[list[int]], params: SamplingParams) -> CompletionsResult:
        raise NotImplementedError

    def _sync_main(self, it: Iterator[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    # -- collectives (single-process shortcuts keep tests and 1-GPU runs free of torch.distributed) -------------
    def _num_processes(self) -> int:
        return int(getattr(self.accelerator, "num_processes", 1))

    def _gather(self, obj: Any) -> list[Any]:
        if self._num_processes() == 1:
            return [obj]
        from accelerate.utils import gather_object

        return list(gather_object([obj]))

    def _broadcast_from_main(self, obj: Any) -> Any:
        if self._num_processes() == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def _collective_status(self, error: BaseException | None, what: str) -> None:
        """Every rank learns rank 0's outcome, so all raise together instead of some hanging in the next collective."""
        message = None if error is None else f"{type(error).__name__}: {error}"
        message = self._broadcast_from_main(message)
        if error is not None:
            raise error
        if message is not None:
            raise WeightSyncError(f"{what} failed on trainer rank 0: {message}")

    # -- the protocol ----------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Rank 0 connects (health, models, weight-transfer group); every rank learns the outcome."""
        if self._connected:
            return
        error: BaseException | None = None
        if self.is_main:
            try:
                self._connect_main()
            except BaseException as exc:
                error = exc
        self._collective_status(error, "connecting to the vLLM server")
        self._connected = True

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        per_rank: list[list[list[int]]] = self._gather(prompt_ids)
        payload: Payload = (None, None)
        if self.is_main:
            payload = self.request_all([p for rank in per_rank for p in rank], params)
        start = sum(len(r) for r in per_rank[: int(getattr(self.accelerator, "process_index", 0))])
        return self.share(payload, start, len(prompt_ids))

    def request_all(self, all_prompts: list[list[int]], params: SamplingParams) -> Payload:
        """Rank 0: generate for every rank's prompts; the result or the error's text, never raised.

        No collective runs here, so `async_rollout`'s worker thread calls it while the main thread trains.
        """
        try:
            return self._generate_main(all_prompts, params), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def share(self, payload: Payload, start: int, count: int) -> GenerationOutput:
        """Collective: every rank gets rows [start, start + count) of rank 0's result, or every rank raises."""
        result, message = self._broadcast_from_main(payload)
        if message is not None:
            raise VLLMServerError(f"generation failed on trainer rank 0: {message}")
        assert result is not None
        rows = slice(start, start + count)
        return GenerationOutput(
            prompt_ids=[list(p) for p in result.prompt_ids[rows]],
            completion_ids=result.completion_ids[rows],
            logprobs=result.logprobs[rows] if result.logprobs is not None else None,
            finished=result.finished[rows],
        )

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        error: BaseException | None = None
        if self.is_main:
            try:
                self._sync_main(iter(named_params))
            except BaseException as exc:
                error = exc
        else:
            for _ in named_params:  # join the same gathers as rank 0, in the same order
                pass
        self._collective_status(error, "weight sync")
