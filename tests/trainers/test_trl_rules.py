"""launchgen.trainers.declarations.trl.rules agrees with TRL itself: both sides of every row go to TRL 1.16's own config class
(its __post_init__, at the row's world size) or trainer (its __init__, with the tiny model built in code), and TRL
refuses exactly the values the table refuses, for every trainer the row names (issue 35, item 2). `check` then
reports the row before the queue (test_trl_checks.py)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES
from launchgen.trainers.declarations.trl.rules import TRL_RULES, TrlRule, broken_rules

#: Per row: (TRL args, world size, reward functions) that keep the rule, then values that break it. Everything else
#: is TRL's default, except the small batch every case shares (_BASE).
CASES: dict[str, tuple[tuple[dict[str, Any], int, int], tuple[dict[str, Any], int, int]]] = {
    "LG930": (({"steps_per_generation": 2}, 1, 1), ({"steps_per_generation": 2, "generation_batch_size": 8}, 1, 1)),
    "LG931": (({"generation_batch_size": 16}, 2, 1), ({"generation_batch_size": 12}, 2, 1)),
    "LG932": (({"per_device_train_batch_size": 2}, 2, 1), ({"per_device_train_batch_size": 3}, 1, 1)),
    "LG933": (({"num_generations": 2}, 1, 1), ({"num_generations": 1}, 1, 1)),
    "LG934": (({"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 2}, 2, 1),
              ({"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 3}, 1, 1)),
    "LG935": (({"auto_find_batch_size": False}, 1, 1), ({"auto_find_batch_size": True}, 1, 1)),
    "LG936": (({"log_completions_hub_repo": "me/completions", "log_completions": True}, 1, 1),
              ({"log_completions_hub_repo": "me/completions"}, 1, 1)),
    "LG937": (({"vllm_importance_sampling_clip_min": 0.5}, 1, 1), ({"vllm_importance_sampling_clip_min": 3.0}, 1, 1)),
    "LG938": (({"vllm_importance_sampling_mode": "token_truncate"}, 1, 1),
              ({"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": None}, 1, 1)),
    "LG939": (({"reward_weights": [1.0, 0.5]}, 1, 2), ({"reward_weights": [1.0, 0.5]}, 1, 1)),
    "LG940": (({"sync_ref_model": True, "beta": 0.1}, 1, 1), ({"sync_ref_model": True, "beta": 0.0}, 1, 1)),
    "LG941": (({"loss_type": "vespo", "use_vllm": True, "vllm_importance_sampling_mode": "token_mask"}, 1, 1),
              ({"loss_type": "vespo", "use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask"}, 1, 1)),
}
#: A small batch (4 completions of each prompt, one prompt per step) that every trainer takes.
_BASE = {"grpo": {"num_generations": 4, "per_device_train_batch_size": 4},
         "rloo": {"num_generations": 4, "per_device_train_batch_size": 4}, "online_dpo": {}}


def _rows() -> list[tuple[str, str, bool]]:
    return [(r.code, name, side) for r in TRL_RULES for name in r.trainers for side in (False, True)]


def test_every_row_has_both_sides_and_every_case_a_row() -> None:
    assert sorted(CASES) == sorted(r.code for r in TRL_RULES)
    for rule in TRL_RULES:
        assert set(rule.trainers) <= set(TRL_ENTRIES), rule.code


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


def _trl_refuses(rule: TrlRule, name: str, args: dict[str, Any], world: int, rewards: int, tmp_path: Path,
                 model: Path, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether TRL's own config (and, for a trainer row, its trainer) raises for these values."""
    entry = TRL_ENTRIES[name]
    cls = _load(entry.config)
    monkeypatch.setattr(cls, "world_size", property(lambda self: world))
    kw = {"output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "report_to": [], "max_steps": 1,
          **args}
    try:
        cfg = cls(**kw)
    except ValueError:
        return True
    if rule.stage == "config":
        return False
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    data = datasets.Dataset.from_list([{"prompt": f"Say {i}"} for i in range(8)])
    trainer = _load(entry.trainer)
    extra = {"processing_class": tok} if entry.needs_tokenizer else {}
    try:
        trainer(model=str(model), reward_funcs=[_reward] * rewards, args=cfg, train_dataset=data, **extra)
    except (ValueError, NotImplementedError):
        return True
    except ImportError as e:  # the row's own check passed; the trainer then wants vLLM (not installed here)
        assert "vLLM" in str(e) or "vllm" in str(e), e
    return False


@pytest.mark.parametrize(("code", "name", "broken"), _rows(),
                         ids=[f"{c}-{n}-{'breaks' if b else 'keeps'}" for c, n, b in _rows()])
def test_trl_refuses_exactly_what_the_table_refuses(code: str, name: str, broken: bool, tmp_path: Path,
                                                   tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rule = next(r for r in TRL_RULES if r.code == code)
    args, world, rewards = CASES[code][broken]
    args = {**_BASE[name], **args}
    found = [r.code for r, _ in broken_rules(name, args, world, rewards)]
    assert found == ([code] if broken else []), found
    assert _trl_refuses(rule, name, args, world, rewards, tmp_path, tiny_model_dir, monkeypatch) is broken
