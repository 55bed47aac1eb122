"""TRL's own trainers, declared: one config class per row of `launchgen.trainers.declarations.trl.entries.TRL_ENTRIES`, named
`trl.<name>` (`train.trainer: trl.grpo`). Their runtime is TRL's trainer class run by `launchgen.trainers.trl`,
not the bundled loop, so they have no objective; `train.args` takes TRL's config fields (`facts.trl_config`)."""

from __future__ import annotations

from typing import Any, Literal

from launchgen.trainers.declarations.declaration import TrainerFacts
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.declarations.trl.entries import PREFIX, TRL_ENTRIES
from pydantic import Field

ENTRY_MODULE = "launchgen.trainers.trl"


def _declare(name: str, position: int) -> type[TrlRunConfig]:
    entry = TRL_ENTRIES[name]
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"`trl.{name}`: {entry.doc}.",
        "__annotations__": {"trainer": Literal[PREFIX + name]},
        "trainer": Field(description=f"`{PREFIX}{name}`: {entry.doc}."),
        "facts": TrainerFacts(entry_module=ENTRY_MODULE, online=entry.data == "prompt",
                              data={"prompt": "prompts", "sft": "examples", "preference": "pairs"}[entry.data],
                              supports_liger_kernel=True, listed=200 + position, trl_config=entry.config_class),
    }
    cls_name = "Trl" + "".join(part.title() for part in name.split("_")) + "Config"
    return type(cls_name, (TrlRunConfig,), namespace)


TRL_CONFIGS: dict[str, type[TrlRunConfig]] = {
    PREFIX + name: _declare(name, i) for i, name in enumerate(TRL_ENTRIES)
}
