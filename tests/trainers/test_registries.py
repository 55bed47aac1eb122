"""The trainer and generation-backend registries: one entry per name the config accepts, and the loop's decisions
follow the declared capabilities, not backend or trainer names."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import pytest
from generated import check_generated
from toy_runs import read_metrics, toy_cfg

HERE = Path(__file__).parent


def _cfg(**over: Any) -> Any:
    from launchgen.trainers.declarations.config import TrainerConfig

    d: dict[str, Any] = {"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"}, "data": {"path": "d"}}
    d.update(over)
    return TrainerConfig.model_validate(d)


def test_every_bundled_trainer_has_an_objective_and_an_entry_module() -> None:
    """Found, not listed: each declared config class of the bundled loop has the objective that names it and the
    entry module its facts name; a trainer with another runtime has only its entry module."""
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.configs import CONFIGS, TRAINER_NAMES
    from launchgen.trainers.objectives import OBJECTIVES

    assert list(CONFIGS) == list(TRAINER_NAMES) and {"grpo", "rloo", "online_dpo", "sft"} <= set(CONFIGS)
    bundled = [name for name, cls in CONFIGS.items() if issubclass(cls, TrainerConfig)]
    assert list(OBJECTIVES) == bundled
    for name, cls in CONFIGS.items():
        assert cls.trainer_name == name
        assert callable(importlib.import_module(cls.facts.entry_module).main)
        if name in OBJECTIVES:
            assert OBJECTIVES[name].config_class is cls and OBJECTIVES[name].name == name


def test_a_trainer_is_declared_once() -> None:
    from typing import ClassVar, Literal

    from launchgen.trainers.declarations.configs.grpo import GRPOConfig
    from launchgen.trainers.declarations.declaration import TrainerFacts

    with pytest.raises(TypeError, match="declared twice"):
        type("Again", (GRPOConfig,), {"__annotations__": {"trainer": Literal["grpo"],
                                                         "facts": ClassVar[TrainerFacts]},
                                     "facts": GRPOConfig.facts, "__module__": __name__})


def test_every_backend_name_has_a_spec() -> None:
    from launchgen.trainers.declarations.config import Backend
    from launchgen.trainers.generation.backends import BACKENDS

    assert sorted(BACKENDS) == sorted(get_args(Backend))
    assert not BACKENDS["hf"].capabilities.needs_weight_sync
    assert all(BACKENDS[k].capabilities.needs_weight_sync for k in ("vllm_server", "vllm_colocate"))


@pytest.mark.parametrize("shares,enabled,want", [(True, True, False), (False, True, True), (False, False, False)])
def test_grpo_importance_sampling_follows_the_backend_capability(
    monkeypatch: pytest.MonkeyPatch, shares: bool, enabled: bool, want: bool
) -> None:
    from launchgen.trainers.generation import backends
    from launchgen.trainers.objectives.grpo import GRPOObjective

    spec = backends.BACKENDS["hf"]
    caps = replace(spec.capabilities, shares_policy_weights=shares)
    monkeypatch.setitem(backends.BACKENDS, "hf", replace(spec, capabilities=caps))
    obj = GRPOObjective(_cfg(generation={"importance_sampling": {"enabled": enabled}}), num_processes=1)
    assert obj.uses_importance_sampling is want
    assert obj.keeps_old_logps is want  # GA = SPG = 1: only IS needs them


def test_importance_sampling_without_log_probs_is_refused_at_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    from launchgen.trainers.declarations.errors import TrainerSetupError
    from launchgen.trainers.generation import backends
    from launchgen.trainers.objectives import build_objective

    spec = backends.BACKENDS["vllm_server"]
    caps = replace(spec.capabilities, returns_logprobs=False)
    monkeypatch.setitem(backends.BACKENDS, "vllm_server", replace(spec, capabilities=caps))
    with pytest.raises(TrainerSetupError, match=r"generation\.importance_sampling\.enabled needs per-token log-probs"):
        build_objective(_cfg(generation={"backend": "vllm_server"}), 1)


def test_weight_sync_follows_the_capability(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `hf` backend declared as needing weight sync gets the full weights before the first generation (the
    engine's weights are not known to be the policy's) and after every optimizer step."""
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    monkeypatch.syspath_prepend(str(HERE))
    pushed: list[int] = []

    class Recording(HFGenerateBackend):
        def sync_weights(self, named_params: Any) -> None:
            pushed.append(sum(1 for _ in named_params))

    spec = backends.BACKENDS["hf"]
    caps = replace(spec.capabilities, needs_weight_sync=True)
    monkeypatch.setitem(backends.BACKENDS, "hf", replace(
        spec, capabilities=caps, factory=lambda cfg, acc, model, tok: Recording.from_config(cfg, acc, model, tok)))
    from toy_runs import run_cfg

    cfg = toy_cfg(tmp_path, tiny_model_dir, "sync", "grpo", num_generations=4, per_device_train_batch_size=8,
                  max_steps=2)
    assert run_cfg(cfg) == 0
    assert len(pushed) == 1 + 2 and pushed[0] > 0 and len(set(pushed)) == 1
    assert all("time/sync_weights" in m for m in read_metrics(tmp_path / "sync"))


def test_unknown_trainer_is_a_setup_error() -> None:
    from launchgen.trainers import objectives
    from launchgen.trainers.declarations.errors import TrainerSetupError

    cfg = _cfg()
    object.__setattr__(cfg, "trainer", "ppo")  # past the config's Literal, as a new name without an entry would be
    with pytest.raises(TrainerSetupError, match="trainer 'ppo' is not one of grpo, rloo, ") as err:
        objectives.build_objective(cfg, 1)
    assert str(err.value).endswith(", ".join(objectives.OBJECTIVES))  # every declared trainer, none written here


def test_liger_support_is_declared_by_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from launchgen.trainers.declarations.configs.rloo import RLOOConfig
    from launchgen.trainers.declarations.errors import TrainerSetupError
    from launchgen.trainers.objectives import build_objective

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the CUDA check, to the trainer's support
    liger = {"name_or_path": "m", "use_liger_kernel": True}
    with pytest.raises(TrainerSetupError, match=r"supported for grpo, rloo, .*, not online_dpo") as err:
        build_objective(_cfg(trainer="online_dpo", model=liger), 1)
    assert "online_dpo," not in str(err.value)
    monkeypatch.setattr(RLOOConfig, "facts", replace(RLOOConfig.facts, supports_liger_kernel=False))
    with pytest.raises(TrainerSetupError, match=r"supported for grpo, .*, not rloo") as err:
        build_objective(_cfg(trainer="rloo", model=liger), 1)
    assert "rloo," not in str(err.value)
    assert build_objective(_cfg(model=liger), 1).name == "grpo"


def test_the_docs_table_is_the_declarations() -> None:
    from launchgen.trainers.declarations.declaration import trainers_markdown

    begin = "<!-- generated by launchgen.trainers.declarations.declaration.trainers_markdown() -->"
    check_generated(HERE.parents[1] / "docs" / "trainers.md", f"{begin}\n\n{trainers_markdown()}\n",
                    "LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/trainers/test_registries.py -k docs_table",
                    begin=begin, end="<!-- end of the generated table -->")
    page = (HERE.parents[1] / "docs" / "trainers.md").read_text()
    assert trainers_markdown() in page, "regenerate the table in docs/trainers.md from trainers_markdown()"


def test_no_trainer_name_is_compared_outside_its_declaration() -> None:
    """Code asks a trainer's facts (`cfg.facts`, `ctx.trainer_facts`), never its name: adding a trainer touches its
    own files only. A comparison with a declared name anywhere else in launchgen/ or trainers/ fails here."""
    import re

    from launchgen.trainers.declarations.configs import TRAINER_NAMES
    from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES, TRL_GONE

    root = HERE.parents[1]
    # TRL's trainers go by `trl.<name>` in a spec and by `<name>` in their entry (`entry.name`)
    short = {n for n in (*TRL_ENTRIES, *TRL_GONE)}
    names = "|".join(re.escape(n) for n in sorted({*TRAINER_NAMES, *short}, key=len, reverse=True))
    compare = re.compile(
        rf"""(trainer\w*|\bentry\w*\.name|\bname)\)?\s*(==|!=|\bnot in\b|\bin\b)\s*[(\[{{]?\s*["']({names})["']""")
    own = ({"trainers/declarations/configs", "trainers/objectives", "trainers/declarations/trl/entries.py"}
           | {f"trainers/{n}.py" for n in TRAINER_NAMES})
    assert compare.search('if cfg.trainer == "sft":') and compare.search("t.trainer in ('grpo', 'rloo')")
    assert compare.search('if entry.name == "gkd":') and compare.search('if trainer == "trl.grpo":')
    found = []
    for path in [*(root / "launchgen").rglob("*.py"), *(root / "trainers").rglob("*.py")]:
        rel = path.relative_to(root).as_posix()
        if any(rel == o or rel.startswith(o + "/") for o in own):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if compare.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert found == []
