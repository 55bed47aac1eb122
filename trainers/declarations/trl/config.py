"""The run config of `python -m launchgen.trainers.trl`: which TRL trainer, the model, launchgen's data and reward
sections, the server address the job resolves at run time, and `args`, the keyword arguments of TRL's own config
class (GRPOConfig, ...) checked against the generated field table. pydantic and the standard library only.

    trainer: trl.grpo                  # `trl.` + a key of entries.TRL_ENTRIES
    model_name_or_path: /models/qwen
    data: {path: prompts.jsonl}        # launchgen.trainers.declarations.config.DataSection
    rewards: [{name: accuracy}]        # launchgen.trainers.declarations.config.RewardSpec (weights -> TRL's reward_weights)
    server: {host: node1, port: 8000, group_port: 51300}   # optional: TRL's vllm_server_* and vllm_group_port
    args: {output_dir: ..., learning_rate: 1.0e-6, ...}    # TRL's config fields, as TRL names them
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from launchgen.trainers.declarations.config import DataSection, RewardSpec, _Strict, apply_override, yaml_text
from launchgen.trainers.declarations.declaration import DeclaredConfig
from launchgen.trainers.declarations.trl.entries import LAUNCHGEN_KEYS, PREFIX, TRL_ENTRIES, TrlEntry
from launchgen.trainers.declarations.trl.fields import coerce, problems
from pydantic import Field, model_validator

#: TRL fields the `server` section fills; a run config sets them in one place only.
SERVER_FIELDS = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_group_port")


class ServerAddress(_Strict):
    host: str = Field(description="Address of the `vllm serve` process.")
    port: int = Field(ge=1, le=65535, description="Its HTTP port.")
    group_port: int = Field(ge=1, le=65535, description="Port trainer rank 0 binds for the weight-transfer group.")

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class TrlRunConfig(DeclaredConfig, _Strict):
    """The shared fields; each TRL trainer's declared class (`launchgen.trainers.declarations.configs.trl`) narrows `trainer`."""

    trainer: str = Field(description="TRL trainer: " + ", ".join(PREFIX + n for n in TRL_ENTRIES) + ".")
    model_name_or_path: str = Field(description="The policy model (Hub id or local folder), as TRL's ModelConfig.")
    data: DataSection | None = Field(
        default=None,
        description="Training rows (launchgen's data section; the prompt column becomes `prompt`); required unless "
        "`script` brings its own data.")
    eval_data: DataSection | None = Field(default=None, description="Evaluation rows (TRL's eval_dataset).")
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="accuracy")],
        description="Reward functions / models for trainers that take them (TRL's reward_funcs; weights become "
        "reward_weights).",
    )
    server: ServerAddress | None = Field(default=None, description="The vLLM server, filled in by the job script.")
    resume: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: resume from the newest checkpoint-<step> in output_dir (TRL's own checkpoint: model, "
        "optimizer, scheduler, RNG, data position); never: start fresh (refused where checkpoints exist).",
    )
    save_final_model: bool = Field(default=True, description="Write the final model to output_dir/final.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of TRL's config class.")
    script: str | None = Field(
        default=None,
        description="The user's own TRL script (a .py path, or `-m package.module`'s module) run instead of the "
        "bundled runner: `args` become its command-line flags (launchgen.trainers.trl.script).")
    script_args: list[str] = Field(default_factory=list, description="The script's own arguments, after launchgen's.")

    @property
    def entry(self) -> TrlEntry:
        return TRL_ENTRIES[self.trainer.removeprefix(PREFIX)]

    @model_validator(mode="before")
    @classmethod
    def _yaml11_numbers(cls, data: Any) -> Any:
        """`1e-5` in a float field is the float YAML 1.2 reads (PyYAML leaves it text): TRL gets the number."""
        trainer = data.get("trainer") if isinstance(data, dict) else None
        name = trainer.removeprefix(PREFIX) if isinstance(trainer, str) else None
        if name in TRL_ENTRIES and isinstance(data.get("args"), dict):
            return {**data, "args": coerce(name, data["args"])}
        return data

    @model_validator(mode="after")
    def _trl_fields(self) -> TrlRunConfig:
        if self.trainer.removeprefix(PREFIX) not in TRL_ENTRIES or not self.trainer.startswith(PREFIX):
            raise ValueError(f"trainer: {self.trainer!r} is not one of {', '.join(PREFIX + n for n in TRL_ENTRIES)}")
        name = self.trainer.removeprefix(PREFIX)
        misplaced = [k for k in LAUNCHGEN_KEYS if k in self.args]
        if misplaced:
            raise ValueError(f"args.{misplaced[0]}: launchgen's key, not a TRL field: write it at the top level")
        found = problems(name, self.args)
        if found:
            p = found[0]
            raise ValueError(f"args.{p.key}: {p.message}; {p.fix}")
        if "output_dir" not in self.args:
            raise ValueError("args.output_dir: required (checkpoints, metrics.jsonl and the completion marker go there)")
        if self.server is not None:
            both = [f for f in SERVER_FIELDS if f in self.args]
            if both:
                raise ValueError(f"args.{both[0]}: the `server` section sets the server address; set one of them")
        entry = self.entry
        if self.script is None and self.data is None:
            raise ValueError("data: required (the training rows), unless a `script` loads its own")
        if self.script is not None and (self.data is not None or self.eval_data is not None):
            raise ValueError("data: the script loads its own data; pass its data set in script_args")
        if entry.data == "prompt" and self.data is not None and self.data.max_prompt_length is not None:
            raise ValueError(f"data.max_prompt_length: TRL's {entry.config_class} has no prompt truncation; "
                             "shorten the prompts in the data")
        if entry.vllm == "server" and self.server is None and "vllm_server_base_url" not in self.args:
            raise ValueError(f"{self.trainer}: TRL's {entry.config_class} generates on a vLLM server only: set "
                             "`server` or args.vllm_server_base_url")
        return self

    @property
    def output_dir(self) -> Path:
        return Path(str(self.args["output_dir"]))

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> TrlRunConfig:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("expected a mapping at the top level")
        for item in overrides or []:
            apply_override(data, item)
        return cls.model_validate(data)

    def to_yaml(self) -> str:
        return yaml_text(self.model_dump(mode="json", exclude_none=True), sort_keys=False)
