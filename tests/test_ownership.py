"""One table of which spec field owns which trainer argument and what launchgen writes into it
(`launchgen.ownership`): every owned argument is written (COPIED) or says who sets it (NOT_COPIED), and every
written value lands on an owned argument, so `train.args` can never fight launchgen over it."""

from __future__ import annotations

from launchgen.trainers.config import TrainerConfig

from launchgen.ownership import COPIED, NOT_COPIED, owned_paths


def _under(path: str, owner: str) -> bool:
    return path == owner or path.startswith(owner + ".")


def test_owned_and_copied_are_one_table() -> None:
    owned = owned_paths()
    copied = [c.path for c in COPIED]
    assert [p for p in copied if not any(_under(p, o) for o in owned)] == []
    assert [o for o in owned if o not in NOT_COPIED and not any(_under(p, o) for p in copied)] == []
    assert set(NOT_COPIED) <= set(owned)


def test_every_copied_path_is_a_trainer_config_field() -> None:
    # a typo in the table would make the trainer refuse every config launchgen writes (extra keys are errors)
    for c in COPIED:
        model: type = TrainerConfig
        for part in c.path.split("."):
            assert part in model.model_fields, c.path
            model = model.model_fields[part].annotation  # type: ignore[assignment]
