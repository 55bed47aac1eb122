"""Checks of bounded staleness (`train.args.generation.max_staleness`, issue 16): LG350-LG353.

The trainer generates the next batches while it trains only against a `vllm serve` of its own (server mode), and
only where its loss corrects for samples drawn from older weights (GRPO's importance sampling, left enabled). The
rules have one owner, `launchgen.trainers.declarations.config.staleness_refusals` (the trainer config refuses the same specs at
start-up); here each becomes its own code, pointing at the spec field to change. Registered into
`launchgen.checks` with the same `check` decorator (imported with the other modules of `launchgen.checks.spec`).
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.modes import _expected_backend
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.config import staleness_refusals

_doc("LG350", "error", "generation.max_staleness without a vLLM server to generate ahead on (colocate, or no vllm "
     "section): generation would share the trainer's weights or GPUs.",
     "Use vllm.mode: server, or set train.args.generation.max_staleness: 0.")
_doc("LG351", "error", "generation.max_staleness with the importance-sampling correction disabled: stale samples "
     "would be trained on as if on-policy.",
     "Remove train.args.generation.importance_sampling.enabled: false, or set max_staleness: 0.")
_doc("LG352", "error", "generation.max_staleness with a trainer whose loss has no correction for stale samples "
     "(rloo, online_dpo, sft).",
     "Use trainer: grpo, or set train.args.generation.max_staleness: 0.")
_doc("LG353", "warning", "generation.in_flight_at_push is set but max_staleness is 0: nothing is in flight at a push.",
     "Remove train.args.generation.in_flight_at_push, or set max_staleness >= 1.")

_CODES = {"backend": "LG350", "correction": "LG351", "trainer": "LG352"}
_PATHS = {"backend": "train.args.generation.max_staleness",
          "correction": "train.args.generation.importance_sampling.enabled",
          "trainer": "train.trainer"}


def _staleness(ctx: Ctx) -> int:
    """The configured k, or 0 where it is unset or not an int (LG901 reports a malformed value)."""
    k = ctx.value("generation.max_staleness")
    return k if isinstance(k, int) and not isinstance(k, bool) else 0


@check("LG350", "LG351", "LG352")
def staleness_needs_a_server_and_a_correction(ctx: Ctx) -> Iterator[Issue]:
    k = _staleness(ctx)
    if k < 1:
        return
    backend = ctx.arg("generation.backend") or _expected_backend(ctx)
    enabled = ctx.value("generation.importance_sampling.enabled")
    for reason, _field, message in staleness_refusals(ctx.spec.train.trainer, str(backend), enabled is not False):
        where = "" if reason != "backend" else (
            " (there is no vllm section)" if ctx.spec.vllm is None else f" (vllm.mode is {ctx.spec.vllm.mode})")
        yield ctx.issue(_CODES[reason], _PATHS[reason], f"max_staleness {k}: {message}{where}")


@check("LG353")
def push_mode_without_staleness(ctx: Ctx) -> Iterator[Issue]:
    if ctx.arg("generation.in_flight_at_push") is not None and _staleness(ctx) < 1:
        yield ctx.issue("LG353", "train.args.generation.in_flight_at_push",
                        "in_flight_at_push is set but generation.max_staleness is 0 (synchronous): it has no effect")
