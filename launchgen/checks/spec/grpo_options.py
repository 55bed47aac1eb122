"""LG612-LG616: GRPOConfig loss options (`trainers/declarations/algorithm_options.py`) in combinations the trainer cannot run or
that do not do what a TRL user expects. Spec-stage checks (they read `train.args` only, no file), so `plan` and
`render` refuse the same specs; the trainer refuses the errors again at start-up (a hand-written config).

LG607-LG610 (in `launchgen/checks/spec/kernels.py`) cover entropy masking, sequence-level ratios, the entropy bonus and the
off-policy mask with Liger's fused loss; this module adds the loss types and `delta` (LG612, LG613) and the
rules without Liger.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.kernels import liger_fused_loss
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.algorithm_options import NEW_LOSS_TYPES, AlgorithmOptions

_A = "train.args"

_doc("LG612", "error", "Liger's fused GRPO loss (model.liger_grpo_loss) with loss_type cispo, sapo, luspo or vespo, "
     "which it does not compute.", "Set train.args.model.liger_grpo_loss: false (the trainer's chunked log-prob "
     "head computes every loss type) or use grpo, dapo, dr_grpo or bnpo.")
_doc("LG613", "error", "Liger's fused GRPO loss with two-sided clipping (delta).",
     "Set train.args.model.liger_grpo_loss: false or remove train.args.delta.")
_doc("LG614", "error", "top_entropy_quantile < 1, entropy_coef != 0 or use_adaptive_entropy with "
     "max_tokens_per_forward: they are "
     "computed over the whole micro-batch, which the passes split.",
     "Remove train.args.max_tokens_per_forward (or the entropy option).")
_doc("LG615", "error", "loss_type vespo with a sequence-level importance-sampling mode on a vLLM backend: VESPO "
     "folds the token IS ratios into its sequence weight (TRL refuses it too).",
     "Set train.args.generation.importance_sampling.mode to token_truncate or token_mask, or disable the correction.")
_doc("LG616", "warning", "importance_sampling_level and loss_type do not match the papers' setup (TRL warns the "
     "same): luspo at token level, vespo at sequence level, or sequence level with a token-sum loss (bnpo, dr_grpo, "
     "dapo, cispo), which weights each completion by its length.",
     "For GSPO use loss_type grpo with importance_sampling_level sequence; luspo wants sequence, vespo token.")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _is_grpo(ctx: Ctx) -> bool:
    """The trainer takes GRPO's loss options (its config class has them)."""
    return issubclass(ctx.trainer_class, AlgorithmOptions)


@check("LG612", "LG613")
def liger_loss_options(ctx: Ctx) -> Iterator[Issue]:
    if not _is_grpo(ctx) or not liger_fused_loss(ctx):
        return
    lt = ctx.value("loss_type")
    if lt in NEW_LOSS_TYPES:
        yield ctx.issue("LG612", f"{_A}.loss_type",
                        f"loss_type {lt} with model.liger_grpo_loss: Liger's fused GRPO loss computes grpo, dapo, "
                        "dr_grpo and bnpo only")
    if ctx.value("delta") is not None:
        yield ctx.issue("LG613", f"{_A}.delta", "two-sided clipping (delta) is not computed by Liger's fused GRPO loss")


@check("LG614")
def entropy_options_with_passes(ctx: Ctx) -> Iterator[Issue]:
    if not _is_grpo(ctx) or ctx.value("max_tokens_per_forward") is None:
        return
    q, coef = _num(ctx.value("top_entropy_quantile")), _num(ctx.value("entropy_coef"))
    if q is not None and q < 1.0:
        yield ctx.issue("LG614", f"{_A}.top_entropy_quantile",
                        f"top_entropy_quantile {q} takes its quantile over the whole micro-batch, which "
                        "max_tokens_per_forward splits into passes")
    if coef:
        yield ctx.issue("LG614", f"{_A}.entropy_coef",
                        f"entropy_coef {coef}: the entropy bonus is a mean over the whole micro-batch, which "
                        "max_tokens_per_forward splits into passes")
    if ctx.value("use_adaptive_entropy") is True:
        yield ctx.issue("LG614", f"{_A}.use_adaptive_entropy",
                        "use_adaptive_entropy: the entropy bonus is a mean over the whole micro-batch, which "
                        "max_tokens_per_forward splits into passes")


@check("LG615")
def vespo_sequence_is(ctx: Ctx) -> Iterator[Issue]:
    if not _is_grpo(ctx) or ctx.value("loss_type") != "vespo" or ctx.spec.vllm is None:
        return
    if ctx.value("generation.importance_sampling.enabled") is False:
        return
    mode = ctx.value("generation.importance_sampling.mode")
    if isinstance(mode, str) and mode.startswith("sequence"):
        written = ctx.has_arg("generation.importance_sampling.mode")
        path = f"{_A}.generation.importance_sampling.mode" if written else f"{_A}.loss_type"
        yield ctx.issue("LG615", path, f"loss_type vespo with importance_sampling.mode {mode}"
                        + ("" if written else " (the default)") + ": VESPO needs per-token IS ratios")


@check("LG616")
def level_matches_loss(ctx: Ctx) -> Iterator[Issue]:
    if not _is_grpo(ctx):
        return
    lt, level = ctx.value("loss_type"), ctx.value("importance_sampling_level")
    path = f"{_A}.importance_sampling_level" if ctx.has_arg("importance_sampling_level") else f"{_A}.loss_type"
    if lt == "luspo" and level != "sequence":
        yield ctx.issue("LG616", path, "loss_type luspo at importance_sampling_level token: the paper (and TRL) "
                        "use sequence")
    elif lt == "vespo" and level != "token":
        yield ctx.issue("LG616", path, "loss_type vespo computes its own sequence weight: importance_sampling_level "
                        "should be token")
    elif level == "sequence" and lt in ("bnpo", "dr_grpo", "dapo", "cispo"):
        yield ctx.issue("LG616", path, f"importance_sampling_level sequence with loss_type {lt} sums token "
                        "terms, weighting each completion by its length (GSPO's objective is loss_type grpo)")
