"""`--set dotted.key=value`: one parser (`config.apply_override`) for the trainers' CLI and `TrainerConfig.from_yaml`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


def _base(tmp_path: Path) -> dict[str, Any]:
    return {"trainer": "sft", "output_dir": str(tmp_path / "o"), "model": {"name_or_path": "m"},
            "data": {"path": str(tmp_path / "missing.jsonl")}}


@pytest.mark.parametrize("item,want", [
    ("max_steps=7", {"max_steps": 7}),
    ("generation.vllm_server.port=8123", {"generation": {"vllm_server": {"port": 8123}}}),
    ("output_dir='/a b/c'", {"output_dir": "/a b/c"}),
    ("data.system_prompt=", {"data": {"system_prompt": None}}),  # an empty YAML scalar is null
    ("data.system_prompt=''", {"data": {"system_prompt": ""}}),
    (" max_steps =3", {"max_steps": 3}),
    ("report_to=[jsonl, tensorboard]", {"report_to": ["jsonl", "tensorboard"]}),
    ("data.system_prompt=a=b", {"data": {"system_prompt": "a=b"}}),  # only the first `=` separates
])
def test_override_values_are_yaml(item: str, want: dict[str, Any]) -> None:
    from launchgen.trainers.declarations.config import apply_override

    data: dict[str, Any] = {}
    apply_override(data, item)
    assert data == want


@pytest.mark.parametrize("item,needle", [
    ("nonsense", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("max_steps.x=3", "max_steps is not a mapping"),
])
def test_bad_overrides_name_the_item(item: str, needle: str) -> None:
    from launchgen.trainers.declarations.config import apply_override

    with pytest.raises(ValueError, match=needle):
        apply_override({"max_steps": 3}, item)


def test_empty_value_clears_a_nullable_field_through_from_yaml(tmp_path: Path) -> None:
    from launchgen.trainers.declarations.config import TrainerConfig

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_base(tmp_path)))
    cfg = TrainerConfig.from_yaml(path, ["max_length=", "max_tokens_per_forward=64"])
    assert cfg.max_length is None and cfg.max_tokens_per_forward == 64


def test_cli_set_uses_the_same_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`max_length=` reaches validation as null (not ""), so the run goes on to set-up and stops at the data file."""
    from launchgen.trainers.sft import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_base(tmp_path)))
    assert main(["--config", str(path), "--set", "max_length=", "--set", "precision=fp32"]) == 2
    err = capsys.readouterr().err
    assert "max_length" not in err and "missing.jsonl" in err, err
