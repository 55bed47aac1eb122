"""The trainer kinds (`launchgen.kinds.registry`): the kind is told apart in one module, each kind takes the owned
rows of its policy from the one table, and one `check` resolves the trainer's config once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchgen.trainers.declarations.configs import CONFIGS

from launchgen.checks.runner import run_checks
from launchgen.input.loader import load_spec, load_spec_text
from launchgen.kinds import trainer_config, trl_config
from launchgen.kinds.ownership import MATCH, OWNED, REFUSE, rows
from launchgen.kinds.registry import BUNDLED, KINDS, SCRIPT, TRL, kind_of, trainer_kind

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: The one module that may tell the kinds apart.
HOME = ROOT / "launchgen" / "kinds" / "registry.py"
#: A kind test: the trainer's TRL facts, or the class of its config.
KIND_TEST = re.compile(r"trl_config is\b|\b(?:isinstance|issubclass)\([^()]*,\s*(?:TrlRunConfig|TrainerConfig)\)")
#: Where the config classes are declared, `TrainerConfig`'s own methods pick among its subclasses (the bundled
#: loop's); they sit below the kinds (a declaration imports no login-side code), so only TRL tests count there.
DECLARATIONS = ROOT / "trainers" / "declarations"
TRL_TEST = re.compile(r"trl_config is\b|\b(?:isinstance|issubclass)\([^()]*,\s*TrlRunConfig\)")


def _kind_tests(path: Path) -> list[str]:
    pattern = TRL_TEST if path.is_relative_to(DECLARATIONS) else KIND_TEST
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


def test_the_kind_is_told_apart_in_one_module() -> None:
    found = [hit for folder in ("launchgen", "trainers") for path in sorted((ROOT / folder).rglob("*.py"))
             if path != HOME for hit in _kind_tests(path)]
    assert found == [], "ask launchgen.kinds.registry (kind_of, Ctx.kind, as_bundled/as_trl) instead:\n" + "\n".join(found)
    assert len(_kind_tests(HOME)) >= 3  # the pattern does find a kind test where one is


def test_every_declared_trainer_has_its_kind() -> None:
    for name, cls in CONFIGS.items():
        assert trainer_kind(name) is (TRL if name.startswith("trl.") else BUNDLED), name
        assert trainer_kind(name).args_schema(cls, "t.")[0]["title"] == "train.args"
    assert {k.name for k in KINDS} == {"bundled", "trl", "script"}


def _spec(trainer: str, script: str | None = None) -> Any:
    train: dict[str, Any] = {"trainer": trainer, "args": {"data": {"path": "d.jsonl"}}}
    if script is not None:
        train["script"] = script
    spec = {"job": {"name": "k"}, "model": {"name_or_path": "m"}, "slurm": {"partition": "p", "gpus_per_node": 2},
            "vllm": {"mode": "server", "gpus": [0]}, "train": train}
    return load_spec_text(yaml.safe_dump(spec), "k.yaml").spec


def test_a_script_under_a_trl_trainer_is_its_own_kind() -> None:
    assert kind_of(_spec("grpo")) is BUNDLED
    assert kind_of(_spec("trl.grpo")) is TRL
    assert kind_of(_spec("trl.grpo", "train.py")) is SCRIPT
    assert kind_of(_spec("grpo", "train.py")) is BUNDLED  # LG922 reports the script without a TRL trainer
    assert SCRIPT.trl_rule_stages == ("config",) and TRL.trl_rule_stages == ("config", "trainer")


def test_one_table_of_owned_arguments_with_the_policy_as_data() -> None:
    assert {o.policy for o in OWNED} == {REFUSE, MATCH}
    assert rows(REFUSE) + rows(MATCH) == OWNED  # the bundled loop's rows, then TRL's
    assert (REFUSE.code, REFUSE.accepts_equal, MATCH.code, MATCH.accepts_equal) == ("LG902", False, "LG921", True)
    assert BUNDLED.owned == rows(REFUSE) and TRL.owned == SCRIPT.owned == rows(MATCH)
    args = {"output_dir": "o", "vllm_mode": "server"}
    assert BUNDLED.refused(args) == [("output_dir", "job.output_dir")]
    assert TRL.refused(args) == []  # compared with launchgen's value instead (LG921)


@pytest.mark.parametrize("example", ["trl-grpo-split.yaml", "single-node-split.yaml"])
def test_check_then_plan_resolves_the_trainer_config_once(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for module, name in ((trl_config, "build_trl_config"), (trainer_config, "build_trainer_config")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    plan, issues = run_checks(load_spec(EXAMPLES / example), env={})
    assert plan is not None, issues
    assert len(calls) == 1, calls
