"""TRL's own refusals that follow from values a spec holds, as one table: what TRL 1.16's config `__post_init__`
(GRPOConfig, RLOOConfig) and trainer `__init__` (GRPOTrainer, RLOOTrainer, OnlineDPOTrainer) raise for them, so
`check` refuses the spec before the queue instead of the job dying after its wait (LG930-LG941, checks/spec/trl.py).

Each row reads TRL's field values with TRL's defaults filled in (the generated field table), the trainer world
size and the number of reward functions. tests/trainers/test_trl_rules.py gives TRL itself both sides of every row
and requires it to raise exactly where the table says. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES
from launchgen.trainers.declarations.trl.fields import fields_of


@dataclass(frozen=True)
class Values:
    """What TRL will see: its config fields (defaults filled in), the trainer processes, the reward functions."""

    args: Mapping[str, Any]
    world: int
    rewards: int

    def __getitem__(self, field: str) -> Any:
        return self.args[field]

    @property
    def generation_batch(self) -> int:
        """TRL's generation_batch_size as its __post_init__ derives it (0 where the config is refused first)."""
        gbs, spg = self["generation_batch_size"], self["steps_per_generation"]
        if gbs is not None:
            return int(gbs)
        steps = spg if spg is not None else self["gradient_accumulation_steps"]
        return int(self["per_device_train_batch_size"]) * self.world * int(steps)


@dataclass(frozen=True)
class TrlRule:
    code: str
    trainers: tuple[str, ...]  # bare names of TRL_ENTRIES
    fields: tuple[str, ...]  # the TRL fields involved; the first the user wrote locates the issue
    stage: Literal["config", "trainer"]  # raised by the config's __post_init__, or by the trainer's __init__
    title: str
    broken: Callable[[Values], str | None]  # the message when TRL would refuse these values, else None
    fix: str


def _both_batch_knobs(v: Values) -> str | None:
    if v["generation_batch_size"] is not None and v["steps_per_generation"] is not None:
        return (f"generation_batch_size ({v['generation_batch_size']}) and steps_per_generation "
                f"({v['steps_per_generation']}) are both set; TRL derives one from the other")
    return None


def _generation_batch_per_step(v: Values) -> str | None:
    gbs, bs = v["generation_batch_size"], v["per_device_train_batch_size"]
    if gbs is not None and v["steps_per_generation"] is None and gbs % (bs * v.world):
        return (f"generation_batch_size {gbs} is not a multiple of the global batch: per_device_train_batch_size "
                f"{bs} x {v.world} trainer process(es) = {bs * v.world}")
    return None


def _groups_whole(v: Values) -> str | None:
    if _both_batch_knobs(v) or _generation_batch_per_step(v):
        return None  # TRL stops at those first
    batch, g = v.generation_batch, v["num_generations"]
    if g and batch % g:
        how = (f"generation_batch_size {batch}" if v["generation_batch_size"] is not None else
               f"per_device_train_batch_size {v['per_device_train_batch_size']} x {v.world} trainer process(es) x "
               f"steps_per_generation {v['steps_per_generation'] or v['gradient_accumulation_steps']} = {batch}")
        return f"the generation batch ({how}) is not a multiple of num_generations {g}"
    return None


def _two_generations(v: Values) -> str | None:
    g = v["num_generations"]
    if g is not None and g < 2:
        return f"num_generations is {g}; the advantages compare at least 2 completions of each prompt"
    return None


def _eval_groups_whole(v: Values) -> str | None:
    if v["eval_strategy"] == "no" or _both_batch_knobs(v) or _generation_batch_per_step(v):
        return None
    g = v["num_generations_eval"] or v["num_generations"]
    eb = v["per_device_eval_batch_size"]
    if g and (eb * v.world) % g:
        return (f"the eval batch (per_device_eval_batch_size {eb} x {v.world} trainer process(es) = {eb * v.world}) "
                f"is not a multiple of the evaluation's num_generations {g} (num_generations_eval, else "
                "num_generations)")
    return None


def _no_auto_batch(v: Values) -> str | None:
    if v["auto_find_batch_size"]:
        return "auto_find_batch_size would halve the batch on out-of-memory and split prompt groups"
    return None


def _hub_repo_needs_log(v: Values) -> str | None:
    if v["log_completions_hub_repo"] is not None and not v["log_completions"]:
        return "log_completions_hub_repo is set but log_completions is false: there is nothing to upload"
    return None


def _clip_order(v: Values) -> str | None:
    lo, hi = v["vllm_importance_sampling_clip_min"], v["vllm_importance_sampling_clip_max"]
    if lo is not None and hi is not None and lo >= hi:
        return f"vllm_importance_sampling_clip_min ({lo}) is not below vllm_importance_sampling_clip_max ({hi})"
    return None


def _truncate_needs_clip(v: Values) -> str | None:
    if (v["vllm_importance_sampling_correction"]
            and v["vllm_importance_sampling_mode"] in ("token_truncate", "sequence_truncate")
            and v["vllm_importance_sampling_clip_min"] is None and v["vllm_importance_sampling_clip_max"] is None):
        return (f"vllm_importance_sampling_mode {v['vllm_importance_sampling_mode']} truncates at a clip, but "
                "neither vllm_importance_sampling_clip_min nor _max is set")
    return None


def _weights_per_reward(v: Values) -> str | None:
    w = v["reward_weights"]
    if isinstance(w, (list, tuple)) and len(w) != v.rewards:
        return f"reward_weights has {len(w)} value(s) for {v.rewards} reward function(s) (train.args.rewards)"
    return None


def _sync_needs_reference(v: Values) -> str | None:
    if v["sync_ref_model"] and v["beta"] == 0.0:
        return "sync_ref_model is true but beta is 0: TRL keeps no reference model to synchronize"
    return None


def _vespo_mode(v: Values) -> str | None:
    if (v["loss_type"] == "vespo" and v["use_vllm"] and v["vllm_importance_sampling_correction"]
            and v["vllm_importance_sampling_mode"] not in ("token_truncate", "token_mask")):
        return (f"loss_type vespo with vLLM's importance sampling needs vllm_importance_sampling_mode "
                f"token_truncate or token_mask, not {v['vllm_importance_sampling_mode']}")
    return None


_RL = ("grpo", "rloo")
_BATCH_FIX = ("Make the generation batch (per_device_train_batch_size x trainer processes x steps_per_generation, "
              "or generation_batch_size) a multiple of num_generations.")

TRL_RULES: tuple[TrlRule, ...] = (
    TrlRule("LG930", _RL, ("generation_batch_size", "steps_per_generation"), "config",
            "generation_batch_size and steps_per_generation are both set for a trl.* trainer.", _both_batch_knobs,
            "Set one of generation_batch_size and steps_per_generation."),
    TrlRule("LG931", _RL, ("generation_batch_size", "per_device_train_batch_size"), "config",
            "A trl.* trainer's generation_batch_size is not a multiple of its global batch.",
            _generation_batch_per_step,
            "Make generation_batch_size a multiple of per_device_train_batch_size x trainer processes."),
    TrlRule("LG932", _RL, ("num_generations", "per_device_train_batch_size", "generation_batch_size",
                           "steps_per_generation", "gradient_accumulation_steps"), "config",
            "A trl.* trainer's generation batch is not a multiple of num_generations.", _groups_whole, _BATCH_FIX),
    TrlRule("LG933", _RL, ("num_generations",), "config",
            "A trl.* trainer's num_generations is below 2.", _two_generations, "Set num_generations: 2 or more."),
    TrlRule("LG934", _RL, ("per_device_eval_batch_size", "num_generations_eval", "num_generations", "eval_strategy"),
            "config", "A trl.* trainer's eval batch is not a multiple of the evaluation's num_generations.",
            _eval_groups_whole,
            "Make per_device_eval_batch_size x trainer processes a multiple of num_generations_eval (or "
            "num_generations)."),
    TrlRule("LG935", _RL, ("auto_find_batch_size",), "config",
            "auto_find_batch_size with trl.grpo or trl.rloo.", _no_auto_batch,
            "Remove auto_find_batch_size and lower per_device_train_batch_size instead."),
    TrlRule("LG936", ("grpo",), ("log_completions_hub_repo", "log_completions"), "config",
            "log_completions_hub_repo without log_completions.", _hub_repo_needs_log,
            "Set log_completions: true, or remove log_completions_hub_repo."),
    TrlRule("LG937", ("grpo",), ("vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"),
            "config", "vllm_importance_sampling_clip_min is not below vllm_importance_sampling_clip_max.",
            _clip_order, "Make vllm_importance_sampling_clip_min smaller than vllm_importance_sampling_clip_max."),
    TrlRule("LG938", ("grpo",), ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                                 "vllm_importance_sampling_clip_min"), "config",
            "A truncating vllm_importance_sampling_mode without a clip.", _truncate_needs_clip,
            "Set vllm_importance_sampling_clip_max (or _min), or pick a *_mask mode."),
    TrlRule("LG939", (*_RL, "online_dpo"), ("reward_weights",), "trainer",
            "reward_weights does not have one value per reward function.", _weights_per_reward,
            "Give each reward its `weight` in train.args.rewards instead of reward_weights (launchgen passes them "
            "in order), or one reward_weights value per reward."),
    TrlRule("LG940", _RL, ("sync_ref_model", "beta"), "trainer",
            "sync_ref_model with beta 0 (no reference model).", _sync_needs_reference,
            "Set sync_ref_model: false, or a beta above 0."),
    TrlRule("LG941", ("grpo",), ("loss_type", "vllm_importance_sampling_mode"), "trainer",
            "loss_type vespo with a vllm_importance_sampling_mode it does not take.", _vespo_mode,
            "Set vllm_importance_sampling_mode: token_truncate or token_mask, or another loss_type."),
)


def values_of(name: str, args: Mapping[str, Any], world: int, rewards: int) -> Values:
    """TRL's view of a run config's `args` (TRL's defaults where unset) for trainer `name`."""
    fields = fields_of(name)
    merged = {f: row.get("default") for f, row in fields.items()}
    merged.update({k: v for k, v in args.items() if k in fields})
    return Values(merged, world, rewards)


def broken_rules(name: str, args: Mapping[str, Any], world: int, rewards: int,
                 stages: tuple[str, ...] = ("config", "trainer")) -> list[tuple[TrlRule, str]]:
    """Each row of `name`'s that these values break, with its message."""
    if name not in TRL_ENTRIES:
        return []
    v = values_of(name, args, world, rewards)
    out = []
    for rule in TRL_RULES:
        if name in rule.trainers and rule.stage in stages and (message := rule.broken(v)) is not None:
            out.append((rule, message))
    return out
