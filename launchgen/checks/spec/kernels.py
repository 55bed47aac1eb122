"""LG6xx: attention kernels, Liger and precision."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from launchgen.checks.context import Ctx, _set
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue
from launchgen.shared.precision import PRECISION_DTYPE
from launchgen.trainers.declarations.config import BUILTIN_ATTN, HUB_KERNEL_RE

# === LG6xx kernels and precision ==========================================================================

_doc("LG601", "error", "train.args.model.attn_implementation is malformed or contradicts train.attn_implementation.",
     "Set the attention implementation once, in train.attn_implementation.")
_doc("LG602", "warning", "A Hub kernel without a pinned revision: the build it resolves to changes under you.",
     "Pin it: org/repo@<branch-or-commit>, e.g. kernels-community/flash-attn2@v2.")
_doc("LG603", "error", "kernels-community/flash-attn2 build v3 with CUDA 12.8 fails in the backward pass of "
     "GQA models.", "Pin train.attn_implementation to kernels-community/flash-attn2@v2.")
_doc("LG604", "warning", "flash_attention_2 falls back to the Hub kernel kernels-community/flash-attn2 (unpinned) "
     "when the flash-attn package is missing; with CUDA 12.8 and a GQA model that can be the failing v3 build.",
     "Use train.attn_implementation: kernels-community/flash-attn2@v2, or install flash-attn on the nodes.")
_doc("LG605", "error", "bf16 and fp16 are both true.", "Set one precision: train.precision: bf16 or fp16.")
_doc("LG606", "error", "A bf16/fp16 alias or train.args.precision contradicts train.precision.",
     "Drop the alias and set train.precision only.")
_doc("LG607", "error", "Liger GRPO loss with entropy masking (top_entropy_quantile < 1).",
     "Set top_entropy_quantile to 1.0 or model.liger_grpo_loss: false.")
_doc("LG608", "error", "Liger GRPO loss with a non-token importance_sampling_level.",
     "Set importance_sampling_level: token or model.liger_grpo_loss: false.")
_doc("LG609", "error", "Liger GRPO loss with an entropy bonus (entropy_coef or use_adaptive_entropy).",
     "Set entropy_coef to 0 and use_adaptive_entropy to false, or model.liger_grpo_loss: false.")
_doc("LG610", "error", "Liger GRPO loss with off-policy sequence masking.",
     "Remove off_policy_mask_threshold or set model.liger_grpo_loss: false.")

_doc("LG611", "warning", "model.dtype differs from the training precision, so the server samples in another "
     "dtype than the trainer scores log-probs in.", "Leave model.dtype: auto (it follows train.precision).")

FLASH_ATTN2_REPO = "kernels-community/flash-attn2"


def split_kernel(value: str) -> tuple[str, str | None]:
    """`wrapper|org/repo@rev:fn` -> ("org/repo", "rev" or None)."""
    body = value.split("|", 1)[-1].split(":", 1)[0]
    repo, _, rev = body.partition("@")
    return repo, (rev or None)


def is_hub_kernel(value: str | None) -> bool:
    return value is not None and value not in BUILTIN_ATTN and bool(HUB_KERNEL_RE.match(value))


def attn_setting(ctx: Ctx) -> tuple[str | None, str]:
    if ctx.spec.train.attn_implementation is not None:
        return ctx.spec.train.attn_implementation, "train.attn_implementation"
    a = ctx.arg("model.attn_implementation")
    return (a if isinstance(a, str) else None), "train.args.model.attn_implementation"


@check("LG601")
def attn_implementation_args(ctx: Ctx) -> Iterator[Issue]:
    a = ctx.arg("model.attn_implementation")
    if a is None:
        return
    path = "train.args.model.attn_implementation"
    if not isinstance(a, str) or (a not in BUILTIN_ATTN and not HUB_KERNEL_RE.match(a)):
        yield ctx.issue("LG601", path, f"{a!r} is neither a built-in attention implementation "
                        f"({', '.join(sorted(BUILTIN_ATTN))}) nor a Hub kernel org/repo[@revision]")
    elif ctx.spec.train.attn_implementation not in (None, a):
        yield ctx.issue("LG601", path, f"{a!r} contradicts train.attn_implementation "
                        f"{ctx.spec.train.attn_implementation!r}")


@check("LG602")
def hub_kernel_pinned(ctx: Ctx) -> Iterator[Issue]:
    a, path = attn_setting(ctx)
    if a is not None and is_hub_kernel(a):
        _repo, rev = split_kernel(a)
        if rev is None:
            yield ctx.issue("LG602", path, f"Hub kernel {a!r} has no revision; transformers picks its default "
                            "build branch, which changes between releases")


def cuda_is_128(ctx: Ctx) -> bool:
    cv = ctx.spec.train.cuda_version
    return cv is not None and (cv == "12.8" or cv.startswith("12.8."))


@check("LG603", "LG604")
def flash_attn2_v3_gqa(ctx: Ctx) -> Iterator[Issue]:
    a, path = attn_setting(ctx)
    if a is None or not cuda_is_128(ctx):
        return
    cfg = ctx.model_config
    gqa = cfg.is_gqa if cfg is not None else None
    gqa_text = ("a GQA model" if gqa else "a model whose config.json is not reachable (GQA unknown)")
    if gqa is False:
        return
    if a == "flash_attention_2":
        yield ctx.issue("LG604", path, f"flash_attention_2 with CUDA 12.8 and {gqa_text} can fall back to the "
                        "unpinned Hub kernel, whose v3 build fails in the backward pass")
        return
    if not is_hub_kernel(a):
        return
    repo, rev = split_kernel(a)
    if repo != FLASH_ATTN2_REPO or rev not in (None, "v3"):
        return
    build = "build v3" if rev == "v3" else "the default build (v3, or v4 with torch >= 2.10 on transformers >= 5.22)"
    yield ctx.issue("LG603", path, f"{a!r} resolves to {build}; with CUDA 12.8 and {gqa_text} the v3 build "
                    "fails in the backward pass", severity="error" if gqa else "warning")


@check("LG605", "LG606")
def precision_consistent(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if t.bf16 and t.fp16:
        yield ctx.issue("LG605", "train.fp16", "train.bf16 and train.fp16 are both true")
        return
    explicit = _set(t, "precision")
    for alias in ("bf16", "fp16"):
        val = getattr(t, alias)
        if val and explicit and t.precision != alias:
            yield ctx.issue("LG606", f"train.{alias}", f"train.{alias} is true but train.precision is {t.precision}")
        elif val is False and explicit and t.precision == alias:
            yield ctx.issue("LG606", f"train.{alias}", f"train.{alias} is false but train.precision is {alias}")
    if _args_precision_conflict(ctx):
        yield ctx.issue("LG606", "train.args.precision",
                        f"train.args.precision is {ctx.arg('precision')!r} but train.precision is {t.precision!r}")


def _args_precision_conflict(ctx: Ctx) -> bool:
    ap = ctx.arg("precision")
    return ap is not None and ap != ctx.spec.train.precision


@check("LG611")
def dtype_matches_precision(ctx: Ctx) -> Iterator[Issue]:
    m, t = ctx.spec.model, ctx.spec.train
    if ctx.spec.vllm is None or m.dtype == "auto" or t.bf16 or t.fp16 or t.bf16 is False:
        return  # aliases: resolved by the plan, contradictions are LG605/LG606
    expected = PRECISION_DTYPE[t.precision]
    if m.dtype != expected:
        yield ctx.issue("LG611", "model.dtype",
                        f"model.dtype {m.dtype} but train.precision {t.precision} ({expected}): vLLM generates in "
                        f"{m.dtype} while the trainer computes log-probs in {expected}, widening the mismatch the "
                        "importance-sampling correction absorbs")


def liger_enabled(ctx: Ctx) -> bool:
    return bool(ctx.spec.train.use_liger_kernel or ctx.arg("model.use_liger_kernel") is True)


def liger_fused_loss(ctx: Ctx) -> bool:
    """GRPO's loss is Liger's fused one (use_liger_kernel alone patches the layers; the chunked head keeps the loss)."""
    return liger_enabled(ctx) and ctx.arg("model.liger_grpo_loss") is True


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@check("LG607", "LG608", "LG609", "LG610")
def liger_combinations(ctx: Ctx) -> Iterator[Issue]:
    if not liger_fused_loss(ctx) or not ctx.trainer_facts.supports_liger_loss:
        return
    q = _num(ctx.value("top_entropy_quantile"))
    if q is not None and q < 1.0:
        yield ctx.issue("LG607", "train.args.top_entropy_quantile",
                        f"top_entropy_quantile {q} masks tokens by entropy, which Liger's fused GRPO loss cannot do")
    level = ctx.value("importance_sampling_level")
    if level is not None and level != "token":
        yield ctx.issue("LG608", "train.args.importance_sampling_level",
                        f"importance_sampling_level {level!r}: Liger's fused GRPO loss supports token level only")
    coef = _num(ctx.value("entropy_coef"))
    if coef:
        yield ctx.issue("LG609", "train.args.entropy_coef",
                        f"entropy_coef {coef} adds an entropy bonus, which Liger's fused GRPO loss does not compute")
    if ctx.value("use_adaptive_entropy") is True:
        yield ctx.issue("LG609", "train.args.use_adaptive_entropy",
                        "use_adaptive_entropy adds an entropy bonus, which Liger's fused GRPO loss does not compute")
    if ctx.value("off_policy_mask_threshold") is not None:
        yield ctx.issue("LG610", "train.args.off_policy_mask_threshold",
                        "off-policy sequence masking is not supported by Liger's fused GRPO loss")
