"""What a trainer declares about itself, once: its config class carries its name, its defaults and its facts.

A trainer is a config class (a pydantic model whose `trainer` field is a one-value `Literal`, its name) with a
`facts: ClassVar[TrainerFacts]`. Declaring the class registers it; `launchgen.trainers.declarations.configs` imports every module
of its package, so the registry is complete whenever a config class exists, and `configs.TRAINER_NAMES`,
`configs.AnyTrainerConfig` (the discriminated union) and every capability question (`names_where`, `facts_of`)
derive from it. Nothing outside a trainer's own declaration compares trainer names.

Pydantic and the standard library only: `launchgen check` reads these facts on a login node.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

#: What a row of the trainer's `data` is: a prompt to generate from, or a finished example to learn.
DataRows = Literal["prompts", "examples", "pairs"]  # pairs: prompt / chosen / rejected (offline preference)


@dataclass(frozen=True)
class TrainerFacts:
    """The fixed facts of one trainer: what launchgen's checks, plan and schema ask about it instead of its name."""

    #: `python -m <entry_module> --config run.yaml` runs it (the plan's trainer command).
    entry_module: str
    #: Generates completions while it trains (rewards, a vLLM server or colocated engine, generation batches).
    online: bool
    #: A row of `data`.
    data: DataRows
    #: Its loss corrects samples drawn from older weights (importance sampling): `generation.max_staleness`.
    corrects_stale_samples: bool = False
    #: Evaluates on `eval_data` (generating completions for held-out prompts).
    takes_eval_data: bool = False
    #: Runs with `model.use_liger_kernel` (Liger's patched layers).
    supports_liger_kernel: bool = False
    #: Computes its loss with Liger's fused linear loss (`model.liger_grpo_loss`) where asked.
    supports_liger_loss: bool = False
    #: A frozen reference model beside the policy: `always` (DPO's), `with_beta` (the KL term, when beta != 0) or
    #: `never` (the memory estimate counts it).
    reference: Literal["never", "with_beta", "always"] = "never"
    #: Where it is listed among the trainers (messages, the spec's `train.trainer` type, docs): lower first.
    listed: int = 100
    #: TRL's config class whose fields `train.args` takes (a TRL trainer run by `launchgen.trainers.trl`); None:
    #: the bundled loop's config. Checks that read the bundled config's arguments stand down where it is set.
    trl_config: str | None = None


_REGISTRY: dict[str, type[DeclaredConfig]] = {}


class DeclaredConfig(BaseModel):
    """Base of every trainer's config class. A subclass that sets `facts` is a trainer, named by its `trainer`
    field's one `Literal` value; one that does not (a shared base such as `config.TrainerConfig`) is not."""

    # A verb validates one trainer's config, if any: building every declared class's validator when its module is
    # imported (as `spec` does, for the trainer names) cost `check` ~100 ms of pydantic on a login node.
    model_config = ConfigDict(defer_build=True)

    facts: ClassVar[TrainerFacts]
    #: The trainer's name (the value of its `trainer` field), set when the class is declared.
    trainer_name: ClassVar[str]
    #: Defaults that differ from the shared fields' (TRL's per-trainer defaults), by dotted field path. Applied by
    #: `config.TrainerConfig` where the user left the field unset or null.
    defaults: ClassVar[dict[str, Any]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "facts" not in cls.__dict__:
            return
        values = get_args(cls.model_fields["trainer"].annotation)
        if len(values) != 1 or not isinstance(values[0], str):
            raise TypeError(f"{cls.__name__}: a trainer's `trainer` field is a Literal of its one name")
        name = values[0]
        if name in _REGISTRY and _REGISTRY[name].__qualname__ != cls.__qualname__:
            raise TypeError(f"trainer {name!r} is declared twice ({_REGISTRY[name].__name__}, {cls.__name__})")
        cls.trainer_name = name
        _REGISTRY[name] = cls


#: The package whose modules declare the trainers (plugin-style: loaded by name on first use, so that a shared
#: base such as `config.TrainerConfig` can ask the registry without importing its own subclasses' modules).
CONFIGS_PACKAGE = "launchgen.trainers.declarations.configs"


def _registry() -> dict[str, type[DeclaredConfig]]:
    if CONFIGS_PACKAGE not in sys.modules:
        importlib.import_module(CONFIGS_PACKAGE)
    return _REGISTRY


def declared() -> list[type[DeclaredConfig]]:
    """Every declared trainer's config class, in listing order."""
    return sorted(_registry().values(), key=lambda c: (c.facts.listed, c.trainer_name))


def config_class(name: str) -> type[DeclaredConfig] | None:
    return _registry().get(name)


def facts_of(name: str) -> TrainerFacts | None:
    cls = _registry().get(name)
    return cls.facts if cls is not None else None


def names_where(test: Callable[[TrainerFacts], bool]) -> list[str]:
    """The trainers whose facts pass `test`, in listing order."""
    return [c.trainer_name for c in declared() if test(c.facts)]


@cache
def _adapter(classes: tuple[type[DeclaredConfig], ...]) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[Union[classes], Field(discriminator="trainer")])  # type: ignore[arg-type]  # noqa: UP007


def any_config_adapter() -> TypeAdapter[Any]:
    """The discriminated union of every declared trainer's config: `trainer` picks the class."""
    return _adapter(tuple(declared()))


def spoken_list(names: list[str], last: str = "and") -> str:
    """`a, b and c`: trainer names in a message."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def trainers_markdown() -> str:
    """The trainers table of docs/trainers.md, generated from the declarations (`tests/trainers/test_registries.py`
    keeps the page equal to it)."""
    yes = {True: "yes", False: "no"}
    rows = ["| `trainer` | config class | entry module | online | `data` rows | stale samples | `eval_data` "
            "| Liger kernel | Liger loss |", "|---|---|---|---|---|---|---|---|---|"]
    for c in declared():
        f = c.facts
        rows.append(f"| `{c.trainer_name}` | `{c.__module__}.{c.__name__}` | `{f.entry_module}` | {yes[f.online]} "
                    f"| {f.data} | {yes[f.corrects_stale_samples]} | {yes[f.takes_eval_data]} "
                    f"| {yes[f.supports_liger_kernel]} | {yes[f.supports_liger_loss]} |")
    return "\n".join(rows) + "\n"
