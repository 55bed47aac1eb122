"""`launchgen schema` types `train.args` as the trainer's config (editor completion and validation of the
most-edited section): every field the trainer takes, none the spec owns, no unknown key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from launchgen.trainers.declarations.algorithm_options import AlgorithmOptions
from launchgen.trainers.declarations.configs import CONFIGS

from launchgen.cli import main
from launchgen.kinds.ownership import owned_paths

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _schema() -> dict[str, Any]:
    r = CliRunner().invoke(main, ["schema"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _object(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    for cand in [node, *node.get("anyOf", []), *node.get("allOf", [])]:
        if "$ref" in cand:
            return defs[cand["$ref"].removeprefix("#/$defs/")]
    return node if "properties" in node else None


def _unknown_keys(value: Any, node: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    """Keys of `value` the schema does not allow (a key-level validator: enough to see completion would work)."""
    obj = _object(node, defs)
    if obj is None or not isinstance(value, dict):
        return []
    props = obj.get("properties", {})
    out = []
    for k, v in value.items():
        if k not in props:
            if obj.get("additionalProperties") is False:
                out.append(f"{path}{k}")
            continue
        out += _unknown_keys(v, props[k], defs, f"{path}{k}.")
    return out


def _args_of(schema: dict[str, Any], trainer: str | None) -> dict[str, Any]:
    """The `train.args` schema that applies when `train.trainer` is `trainer` (None: not written)."""
    defs = schema["$defs"]
    found = []
    for branch in defs["TrainSpec"]["allOf"]:
        when = branch["if"]
        cases = when.get("anyOf", [when])
        if any(("not" in c and trainer is None) or c.get("properties", {}).get("trainer", {}).get("const") == trainer
               for c in cases):
            found.append(branch["then"]["properties"]["args"])
    assert len(found) == 1, (trainer, found)
    return _object(found[0], defs) or {}


def test_train_args_follow_the_trainer() -> None:
    """GRPO's options are offered under `trainer: grpo` (and with no trainer written: grpo is the default) only."""
    schema = _schema()
    grpo_only = set(AlgorithmOptions.model_fields)
    assert grpo_only <= set(_args_of(schema, "grpo")["properties"])
    assert _args_of(schema, None) == _args_of(schema, "grpo")
    for name in ("rloo", "online_dpo", "sft"):
        assert not grpo_only & set(_args_of(schema, name)["properties"]), name
    assert _args_of(schema, "online_dpo")["properties"]["num_generations"]["default"] == 2


@pytest.mark.parametrize("trainer", sorted(n for n, c in CONFIGS.items() if c.facts.trl_config is None))
def test_train_args_is_the_trainer_config_without_owned_fields(trainer: str) -> None:
    schema = _schema()
    defs = schema["$defs"]
    args = _args_of(schema, trainer)
    assert args["additionalProperties"] is False
    owned_top = {p for p in owned_paths() if "." not in p}
    assert set(args["properties"]) == set(CONFIGS[trainer].model_fields) - owned_top
    for path in owned_paths():  # none of the arguments the spec owns is offered
        *parents, leaf = path.split(".")
        node: dict[str, Any] | None = args
        for part in parents:
            node = _object(node["properties"][part], defs) if node is not None else None
        assert node is not None and leaf not in node.get("properties", {}), path
    assert "learning_rate" in args["properties"] and "max_completion_length" in _object(
        args["properties"]["generation"], defs)["properties"]


def test_a_trl_trainers_args_are_its_trl_configs_fields() -> None:
    """`trl.*`: TRL's own field names (the generated table) beside launchgen's data/rewards sections."""
    schema = _schema()
    args = _args_of(schema, "trl.grpo")
    assert args["additionalProperties"] is False
    assert {"num_generations", "beta", "loss_type", "data", "rewards", "generation"} <= set(args["properties"])
    assert args["properties"]["num_generations"]["default"] == 8
    # the bundled generation.max_completion_length is OnlineDPOConfig's max_new_tokens (default 64)
    dpo = _args_of(schema, "trl.online_dpo")["properties"]
    assert dpo["generation"]["properties"]["max_completion_length"] == dpo["max_new_tokens"]


def test_examples_train_args_validate_and_a_typo_does_not() -> None:
    schema = _schema()
    defs, args = schema["$defs"], _args_of(schema, None)
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        own = _args_of(schema, spec["train"].get("trainer"))
        assert _unknown_keys(spec["train"].get("args", {}), own, defs, "train.args.") == [], path.name
    bad = {"learnig_rate": 1e-6, "generation": {"max_completion_lenght": 8}}
    assert _unknown_keys(bad, args, defs, "train.args.") == [
        "train.args.learnig_rate", "train.args.generation.max_completion_lenght"]
