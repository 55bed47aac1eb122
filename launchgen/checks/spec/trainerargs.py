"""LG901: `train.args` (with what the spec fills in) does not validate as the trainer's own `TrainerConfig`.

The config is resolved once per check run (`Ctx.trainer_cfg`, `launchgen.kinds.trainer_config`); this check reports
its validation errors, each naming the `train.args` field and its YAML line. Arguments the spec owns are left
out of that config (LG902 reports them); a vllm section for a trainer that does not generate is LG503's.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

_doc("LG901", "error", "train.args does not validate as the trainer's config (unknown key, wrong type, missing "
     "`data`).", "Fix the trainer argument (fields of launchgen.trainers.declarations.config.TrainerConfig; `launchgen schema "
     "--format json` has their schema).")


@check("LG901")
def trainer_args_validate(ctx: Ctx) -> Iterator[Issue]:
    if ctx.spec.vllm is not None and not ctx.trainer_facts.online:
        return  # LG503: the fix is to delete the vllm section, which the trainer config refuses too
    yield from (i for i in ctx.trainer_config_issues if i.code == "LG901")


_doc("LG920", "error", "A trl.* trainer cannot run this topology (async_grpo without a vLLM server, on a CPU, "
     "or with train.attn_implementation / use_liger_kernel; several server replicas: TRL's client talks to one "
     "server).", "Change the vllm or train section, or use the bundled trainer.")
_doc("LG921", "error", "A TRL field in train.args contradicts what the topology decides (output_dir, precision, "
     "use_vllm/vllm_mode, the server's address and ports, colocate's settings, model loading).",
     "Remove the field from train.args (launchgen sets it) or change the spec field it names.")


_doc("LG924", "error", "A launchgen data option that the trl.* trainer has no counterpart for (data.max_prompt_length: "
     "TRL's online trainers do not truncate prompts).",
     "Remove the option (shorten the data instead), or keep the bundled trainer, which has it.")


@check("LG920", "LG921", "LG924")
def trl_args_match_topology(ctx: Ctx) -> Iterator[Issue]:
    """A TRL trainer's run config (launchgen.kinds.trl_config): what TRL's fields say against the topology."""
    yield from (i for i in ctx.trainer_config_issues if i.code in ("LG920", "LG921", "LG924"))


def without_echo(issues: list[Issue]) -> list[Issue]:
    """LG901 at `train.args` itself is the trainer config's own cross-field refusal (it has no one field to name).
    The checks name the same rules with their fields (LG350-LG352 staleness, LG343/LG344 peft, ...), so where
    another error is reported on a `train` field, that echo is dropped: one message per mistake (what the config
    still refuses is reported once the others are fixed). A train.script with a bundled trainer (LG922) gets no
    LG901 at all."""
    def on_train(i: Issue) -> bool:
        return i.code != "LG901" and i.severity == "error" and (i.path == "train" or i.path.startswith("train."))

    if any(i.code == "LG922" and i.path == "train.trainer" for i in issues):
        # a script's train.args are TRL flags: the bundled trainer's LG901 advice about them would mislead
        return [i for i in issues if i.code != "LG901"]
    if not any(on_train(i) for i in issues):
        return issues
    return [i for i in issues if not (i.code == "LG901" and i.path == "train.args")]
