"""The torch-free TRL field table (`launchgen/trainers/declarations/trl/fields.json`) is what the installed TRL's config
dataclasses say, and its checks find the mistakes they are for."""

from __future__ import annotations

import pytest
from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES, TRL_VERSION
from launchgen.trainers.declarations.trl.fields import fields_of, problems, table
from launchgen.trainers.trl import fieldgen


def test_the_table_equals_the_installed_trls_dataclasses() -> None:
    import trl

    assert trl.__version__ == TRL_VERSION == table()["trl_version"]
    assert fieldgen.TABLE.read_text() == fieldgen.render(fieldgen.build_table()), (
        "fields.json is stale: python -m launchgen.trainers.trl.fieldgen")


def test_every_entry_has_its_config_in_the_table() -> None:
    for name in TRL_ENTRIES:
        fields = fields_of(name)
        assert "output_dir" in fields and "learning_rate" in fields, name


@pytest.mark.parametrize(("args", "expected"), [
    ({"num_generation": 4}, "did you mean `num_generations`"),
    ({"learning_rate": "fast"}, "GRPOConfig.learning_rate takes float, got str 'fast'"),
    ({"bf16": "yes"}, "GRPOConfig.bf16 takes bool or null"),
    ({"reward_weights": 2}, "GRPOConfig.reward_weights takes list or null, got int 2"),
])
def test_problems_name_the_field(args: dict[str, object], expected: str) -> None:
    found = problems("grpo", args)
    assert len(found) == 1
    assert expected in f"{found[0].message}; {found[0].fix}"


def test_right_values_and_launchgen_keys_pass() -> None:
    ok = {"learning_rate": 1, "num_generations": 4, "bf16": None, "report_to": ["wandb"], "data": {"path": "x"},
          "rewards": [{"name": "accuracy"}], "model_init_kwargs": {"dtype": "bfloat16"}}
    assert problems("grpo", ok) == []
    assert problems("sft", {"max_length": 128, "packing": True}) == []
