"""The TRL trainers launchgen runs, one row each: TRL's config and trainer classes, the data they read, whether
they take reward functions and whether they generate (and so may use a vLLM server). Standard library only.

The name in a spec is `trl.<name>` (`train.trainer: trl.grpo`); `python -m launchgen.trainers.trl` reads the bare
name from its run config's `trainer` field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The TRL release the field table (`fields.json`) was generated from and the tests run against.
TRL_VERSION = "1.16.0"

DataKind = Literal["prompt", "sft", "preference"]


@dataclass(frozen=True)
class TrlEntry:
    name: str  # `trl.<name>` in a spec
    config: str  # `module:Class` of TRL's config dataclass
    trainer: str  # `module:Class` of TRL's trainer
    data: DataKind  # prompt rows (online RL), SFT rows (text / messages / prompt+completion), preference pairs
    rewards: bool  # takes launchgen's `rewards` (TRL's reward_funcs)
    vllm: Literal["no", "optional", "server"]  # `server`: TRL's trainer only runs against a vLLM server
    doc: str
    needs_tokenizer: bool = False  # TRL's trainer does not load the tokenizer from the model id itself
    cuda_only: str | None = None  # why TRL's trainer cannot train on a CPU (`train.device: cpu` is refused)
    #: the config field naming a teacher model that TRL's trainer takes as its `teacher_model` argument
    teacher_field: str | None = None
    #: spec fields (`train.<field>`) TRL's trainer refuses or overrides when set, and why
    refuses: tuple[tuple[str, str], ...] = ()

    @property
    def config_class(self) -> str:
        return self.config.rpartition(":")[2]


TRL_ENTRIES: dict[str, TrlEntry] = {e.name: e for e in (
    TrlEntry("grpo", "trl:GRPOConfig", "trl:GRPOTrainer", "prompt", True, "optional",
             "GRPO (TRL's GRPOTrainer)"),
    TrlEntry("rloo", "trl:RLOOConfig", "trl:RLOOTrainer", "prompt", True, "optional",
             "RLOO (TRL's RLOOTrainer)"),
    TrlEntry("online_dpo", "trl.experimental.online_dpo:OnlineDPOConfig",
             "trl.experimental.online_dpo:OnlineDPOTrainer", "prompt", True, "optional",
             "online DPO (TRL's experimental OnlineDPOTrainer): pairs of completions judged by the rewards",
             needs_tokenizer=True),
    TrlEntry("sft", "trl:SFTConfig", "trl:SFTTrainer", "sft", False, "no", "supervised fine-tuning (TRL's SFTTrainer)"),
    TrlEntry("dpo", "trl:DPOConfig", "trl:DPOTrainer", "preference", False, "no",
             "offline DPO on prompt/chosen/rejected rows (TRL's DPOTrainer)"),
    TrlEntry("gkd", "trl.experimental.gkd:GKDConfig", "trl.experimental.gkd:GKDTrainer", "sft", False, "no",
             "generalized knowledge distillation from `teacher_model_name_or_path` (TRL's experimental GKDTrainer)",
             needs_tokenizer=True, teacher_field="teacher_model_name_or_path"),
    TrlEntry("async_grpo", "trl.experimental.async_grpo:AsyncGRPOConfig",
             "trl.experimental.async_grpo:AsyncGRPOTrainer", "prompt", True, "server",
             "asynchronous GRPO (TRL's experimental AsyncGRPOTrainer): generation on a vLLM server runs ahead of "
             "training",
             cuda_only="its training forward runs TRL's tree attention (`tree_fa3`) on the Hub kernel "
                       "kernels-community/flash-attn3, which is CUDA-only and fetched from the Hub at run time, and "
                       "its weight sync is vLLM's NCCL engine",
             refuses=(("attn_implementation", "AsyncGRPOTrainer loads the model with its own tree attention "
                       "(`tree_fa3`); a second attn_implementation in model_init_kwargs is a TypeError"),
                      ("use_liger_kernel", "AsyncGRPOTrainer raises NotImplementedError for use_liger_kernel"))),
)}

#: Trainers the seeds name that the pinned TRL no longer ships: `check` refuses them with this reason.
TRL_GONE: dict[str, str] = {
    "nash_md": f"TRL {TRL_VERSION} no longer ships NashMDTrainer (removed from trl and trl.experimental)",
    "xpo": f"TRL {TRL_VERSION} no longer ships XPOTrainer (removed from trl and trl.experimental)",
}

#: The spec's prefix for TRL's trainers (`train.trainer: trl.grpo`).
PREFIX = "trl."

#: Keys of the spec's `train.args` that are launchgen's, not TRL's config fields (`generation` is translated).
LAUNCHGEN_KEYS = ("data", "eval_data", "rewards", "resume", "save_final_model", "generation")

#: The bundled trainers' `generation.<key>` settings that are TRL config fields, so one spec switches between
#: `grpo` and `trl.grpo` by its trainer line: key -> TRL's field (per trainer where TRL names it otherwise).
GENERATION_FIELDS: dict[str, dict[str, str]] = {
    "max_completion_length": {"online_dpo": "max_new_tokens", "gkd": "max_new_tokens"},
    "temperature": {}, "top_p": {}, "top_k": {}, "min_p": {}, "repetition_penalty": {}, "generation_kwargs": {},
}


def generation_field(key: str, trainer: str) -> str | None:
    """TRL's field for the bundled `generation.<key>` with `trainer`; None when there is none."""
    names = GENERATION_FIELDS.get(key)
    return None if names is None else names.get(trainer, key)
