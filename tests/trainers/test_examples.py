"""Every example spec renders a trainer config that its trainer module accepts."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPECS = sorted(EXAMPLES.glob("*.yaml"))


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    """The examples run in bf16; accelerate's process-wide state must not leak into (or in from) fp32 tests."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _plan(text: str, name: str) -> Any:
    from launchgen.input.loader import load_spec_text
    from launchgen.planning.plan import build_plan

    return build_plan(load_spec_text(text, name))


def _variants() -> list[tuple[str, str]]:
    out = [(p.name, p.read_text()) for p in SPECS]
    # No example uses online_dpo yet: the colocate example with the trainer switched stands in for one.
    colocate = yaml.safe_load((EXAMPLES / "colocate.yaml").read_text())
    colocate["train"]["trainer"] = "online_dpo"
    colocate["train"].setdefault("args", {}).pop("num_generations", None)
    out.append(("colocate-online_dpo", yaml.safe_dump(colocate)))
    return out


@pytest.mark.parametrize("name,text", _variants(), ids=[n for n, _ in _variants()])
def test_rendered_trainer_config_validates_and_the_module_accepts_it(
    name: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.trl.config import TrlRunConfig

    plan = _plan(text, name)
    cfg = plan.trainer.config
    if isinstance(cfg, TrlRunConfig):  # TRL's trainer: the run config of `python -m launchgen.trainers.trl`
        assert type(cfg).model_validate(yaml.safe_load(plan.trainer.config_yaml)) == cfg
        assert plan.trainer.module == "launchgen.trainers.trl" == cfg.facts.entry_module
        return
    embedded = TrainerConfig.model_validate(yaml.safe_load(plan.trainer.config_yaml))
    assert embedded == cfg  # the file the job writes reads back as the plan's config
    assert plan.trainer.module == f"launchgen.trainers.{cfg.trainer}"
    module = importlib.import_module(plan.trainer.module)
    assert callable(module.main)
    if cfg.trainer not in ("sft", "online_dpo"):
        return
    # Run the module's main on it (output_dir set as the script's --set does); the example's data file does not
    # exist here, so the only acceptable failure is the missing-data config error, before any model is loaded.
    data = yaml.safe_load(plan.trainer.config_yaml)
    data["output_dir"] = str(tmp_path / "out")
    data["data"]["path"] = str(tmp_path / "no-such-data.jsonl")
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = module.main(["--config", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "data.path" in lines[0] and "file not found" in lines[0], err
