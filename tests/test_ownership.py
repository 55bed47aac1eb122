"""One table of which spec field owns which trainer argument and what launchgen writes into it
(`launchgen.kinds.ownership.OWNED`; the bundled loop's rows, `REFUSED`, here): each owned argument is one row that
says what launchgen writes into it or who sets it instead, and every written value lands on a field of the trainer's
config, so `train.args` can never fight launchgen over it."""

from __future__ import annotations

from typing import Any

import pytest
from launchgen.trainers.declarations.config import TrainerConfig

from launchgen.kinds.ownership import COPIED, NOT_COPIED, REFUSED, Owned, owned_args, owned_paths


def _under(path: str, owner: str) -> bool:
    return path == owner or path.startswith(owner + ".")


def _field(path: str) -> None:
    model: Any = TrainerConfig
    for part in path.split("."):
        assert part in model.model_fields, path
        model = model.model_fields[part].annotation


def test_each_owned_argument_is_one_row_that_says_what_becomes_of_it() -> None:
    assert len(owned_paths()) == len(set(owned_paths()))
    for o in REFUSED:
        assert all(_under(c.path, o.path) and c.path != o.path for c in o.fills), o.path
    assert [c.path for c in COPIED] == [c.path for o in REFUSED for c in o.copied]
    assert set(NOT_COPIED) == {o.path for o in REFUSED if o.set_by}
    with pytest.raises(ValueError, match="exactly one of value, fills, set_by"):
        Owned("x", "y", lambda f: 1, set_by="someone")
    with pytest.raises(ValueError, match="exactly one of value, fills, set_by"):
        Owned("x", "y")


def test_every_owned_and_copied_path_is_a_trainer_config_field() -> None:
    # a typo in the table would make the trainer refuse every config launchgen writes (extra keys are errors)
    for path in [*owned_paths(), *(c.path for c in COPIED)]:
        _field(path)


def test_owned_args_finds_each_owned_argument_the_user_set_in_table_order() -> None:
    args = {"model": {"revision": "main"}, "learning_rate": 1e-6,
            "generation": {"vllm_colocate": {"max_model_len": 512}, "vllm_server": {"base_url": "x", "port": 1},
                           "backend": "hf"}}
    assert owned_args(args) == [
        ("model", "model.* and train.attn_implementation / use_liger_kernel / gradient_checkpointing"),
        ("generation.backend", "vllm.mode (or no `vllm` section for plain generate)"),
        ("generation.vllm_server.port", "vllm.port"),
        ("generation.vllm_server.base_url", "vllm.port / vllm.bind"),
        ("generation.vllm_colocate.max_model_len", "vllm.max_model_len"),
    ]
    assert owned_args({"generation": "not a mapping", "output_dir": "o"}) == [("output_dir", "job.output_dir")]
