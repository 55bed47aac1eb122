"""Whether a run may resume from the checkpoints in its output_dir: the one owner of that rule.

Every checkpoint records the resolved config it was trained with (`trainer_state.json`, key `config`), less the
fields in `MAY_CHANGE`. A run resumes only when its own config matches the newest checkpoint's; otherwise it
refuses (a `TrainerSetupError`, exit 2, before any model is loaded) and names the fields that differ, how to start
fresh and how to force it (`resume: force`). `resume: never` into a directory that holds checkpoints is refused
too: the fresh run would overwrite and prune them. A run whose output_dir already holds the complete marker of a
training at least `max_steps` long, with a matching config, says so and does nothing: re-running a finished job
must not retrain it or rewrite `final/`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchgen.trainers import checkpoint as ckpt
from launchgen.trainers import rerun
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

#: Dotted config paths that may differ between a checkpoint and the run resuming it; every other field must match.
MAY_CHANGE: tuple[str, ...] = (
    "output_dir",  # the job directory may be moved or copied with its checkpoints
    "max_steps",  # extend (or shorten) a run
    "num_train_epochs",  # the same, counted in passes over the data
    "save_strategy",
    "save_steps",
    "eval_strategy",
    "eval_steps",
    "eval_data",
    "save_total_limit",
    "save_final_model",
    "logging_steps",
    "report_to",
    "run_name",
    "resume",
    "max_tokens_per_forward",  # memory only: each micro-batch's gradient is the same
    "generation.keep_kv_cache",  # memory only (its default changed from true to lend)
    "memory_budget_gib",  # memory only, like the knobs it sets
    "model.logits_chunk_mib",  # memory only: the same log-probs tile by tile (memory_budget_gib may set it)
    # compute only: the same gradient, activations recomputed or kept (auto may decide otherwise on another GPU)
    "model.gradient_checkpointing",
    "generation.vllm_server",  # server address and ports change with every attempt; timeouts are operational
)
#: Key of the recorded config in a checkpoint's trainer_state.json.
STATE_KEY = "config"
#: How many differing fields an error lists.
SHOWN = 6
_MISSING = object()  # a field one side of a comparison lacks


#: Sections added after checkpoints were already being written, left out of the fingerprint while unset (None),
#: so a checkpoint of an older version (which has no such key) still matches a config that does not use them.
ADDED_OFF_WHEN_NONE: tuple[str, ...] = ("peft",)


def fingerprint(cfg: TrainerConfig) -> dict[str, Any]:
    """The resolved config as JSON, without the fields that may change across a resume."""
    data: dict[str, Any] = cfg.model_dump(mode="json")
    for key in ADDED_OFF_WHEN_NONE:
        if data.get(key, 0) is None:
            del data[key]
    return _without_may_change(data)


def _without_may_change(data: dict[str, Any]) -> dict[str, Any]:
    for path in MAY_CHANGE:
        *parents, leaf = path.split(".")
        node: Any = data
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return data


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted field, checkpoint's value, this run's value) for every field that differs, sorted by field. A field
    that joined MAY_CHANGE after the checkpoint was written is still in its fingerprint: dropped here too."""
    a, b = _flatten(_without_may_change(copy.deepcopy(saved))), _flatten(current)
    return [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(a.keys() | b.keys())
            if a.get(k, _MISSING) != b.get(k, _MISSING)]


def _at_default(cfg: BaseModel, dotted: str, value: Any) -> bool:
    """Whether `dotted` names a field of this run's config that holds its declared default (`value` is its JSON)."""
    *parents, leaf = dotted.split(".")
    node: Any = cfg
    for name in parents:
        node = getattr(node, name, None)
        if not isinstance(node, BaseModel):
            return False
    field = type(node).model_fields.get(leaf)
    if field is None or field.is_required():
        return False
    return bool(to_jsonable_python(field.get_default(call_default_factory=True)) == value)


def config_differences(saved: dict[str, Any], cfg: TrainerConfig) -> list[tuple[str, Any, Any]]:
    """`differences` between a checkpoint's recorded config and this run's, less the fields the checkpoint predates
    that this run leaves at their defaults: a launchgen upgrade that adds an option (at a default that keeps the old
    behaviour) must not make every requeued job refuse to resume. Setting such an option still counts."""
    return [(k, old, new) for k, old, new in differences(saved, fingerprint(cfg))
            if not (old is _MISSING and _at_default(cfg, k, new))]


@dataclass(frozen=True)
class ResumeDecision:
    checkpoint: Path | None  # resume from here; None: start fresh
    complete: bool = False  # nothing to do: a matching training already reached max_steps
    note: str | None = None  # a line to print (rank 0)


def _shown(v: Any) -> str:
    return "(unset)" if v is _MISSING else json.dumps(v)


def _mismatch_error(cfg: TrainerConfig, path: Path, diffs: list[tuple[str, Any, Any]]) -> TrainerSetupError:
    listed = "; ".join(f"{k}: {_shown(old)} in the checkpoint, {_shown(new)} now" for k, old, new in diffs[:SHOWN])
    more = f" (+{len(diffs) - SHOWN} more)" if len(diffs) > SHOWN else ""
    return TrainerSetupError(
        f"resume: {path} was trained with a different config ({listed}{more}); refusing to continue it with this "
        f"one. To start fresh, use a new output directory (job.output_dir) or move {cfg.output_dir}/checkpoint-* "
        "away; to continue that training with this config anyway, set resume: force (train.args.resume in the "
        "spec). Fields that may change across a resume: " + ", ".join(MAY_CHANGE)
    )


def decide(cfg: TrainerConfig) -> ResumeDecision:
    """What this run does with its output_dir: start fresh, resume from a checkpoint, or nothing (complete)."""
    out = Path(cfg.output_dir)
    found = ckpt.list_checkpoints(out)
    if found and cfg.resume == "never":
        # a fresh run would overwrite (and prune, save_total_limit) the checkpoints that are there
        raise TrainerSetupError(
            f"resume: never, but {found[-1][1]} exists: a fresh run here would overwrite and prune the "
            f"checkpoints in {out}. Use a new output directory (job.output_dir) or move them away; to continue "
            "them, set resume: auto")
    if not found:
        return ResumeDecision(None)
    step, path = found[-1]
    refused = rerun.foreign(path, cfg.trainer)
    if refused is not None:
        raise TrainerSetupError(refused)
    state = json.loads((path / ckpt.STATE_FILE).read_text())
    saved = state.get(STATE_KEY)
    if isinstance(saved, dict):  # recorded before GRPO's options were GRPO's alone: every trainer wrote them
        saved = type(cfg).without_other_trainers_defaults(saved)
    note = None
    if saved is None:
        note = f"[launchgen] resume: {path} records no config (written before launchgen checked it): not compared"
    elif cfg.resume != "force":
        diffs = config_differences(saved, cfg)
        if diffs:
            raise _mismatch_error(cfg, path, diffs)
    elif config_differences(saved, cfg):
        note = f"[launchgen] resume: force: continuing {path} although the config differs"
    # With num_train_epochs the step count is known only once the data is loaded: the checkpoint recorded it.
    target = int(state.get("max_steps", cfg.max_steps)) if cfg.num_train_epochs is not None else cfg.max_steps
    if (out / ckpt.COMPLETE_MARKER).is_file() and step >= target:
        return ResumeDecision(path, complete=True,
                              note=rerun.complete_note(out / ckpt.COMPLETE_MARKER, step, target))
    return ResumeDecision(path, note=note)


def reopen(cfg: TrainerConfig) -> None:
    """Rank 0, resuming past a finished training (max_steps raised): the old complete marker is no longer true,
    and the job scripts read it to decide whether to requeue."""
    (Path(cfg.output_dir) / ckpt.COMPLETE_MARKER).unlink(missing_ok=True)
