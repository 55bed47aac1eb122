"""num_train_epochs, save_strategy and evaluation (eval_data, eval_strategy: steps), with hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from toy_runs import read_metrics, run_cfg, toy_cfg

HERE = Path(__file__).parent


def _cfg(tmp_path: Path, model: Path, out: str, **over: Any) -> dict[str, Any]:
    return toy_cfg(tmp_path, model, out, **{"trainer": "grpo", "num_generations": 4, "per_device_train_batch_size": 16,
                                            "learning_rate": 1e-6, **over})


@pytest.mark.parametrize("epochs,rows,rows_per_batch,ga,spg,it,expected", [
    (1, 16, 4, 1, 1, 1, 4),      # 4 prompts per step: 16 / 4
    (2, 16, 4, 1, 1, 1, 8),
    (0.25, 16, 4, 1, 1, 1, 1),
    (0.3, 16, 4, 1, 1, 1, 2),    # 1.2 steps -> 2
    (0.1, 30, 1, 1, 1, 1, 3),    # 3.0000000000000004 in floating point is still 3
    (1, 16, 4, 2, 2, 1, 4),      # GA 2: a step takes a whole generation batch of 4 prompts
    (1, 16, 4, 1, 2, 1, 8),      # spg 2, GA 1: a batch of 4 prompts serves 2 steps -> 2 prompts per step
    (1, 16, 4, 1, 1, 2, 8),      # num_iterations 2: each batch trains twice
])
def test_steps_for_epochs_hand_values(epochs: float, rows: int, rows_per_batch: int, ga: int, spg: int, it: int,
                                      expected: int) -> None:
    from launchgen.trainers.epochs import steps_for

    geometry = SimpleNamespace(ga=ga, generate_every=spg * it)
    assert steps_for(epochs, rows, rows_per_batch, geometry) == expected


def test_config_rules() -> None:
    from launchgen.trainers.declarations.config import TrainerConfig
    from pydantic import ValidationError

    base = {"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"}, "data": {"path": "d.jsonl"}}
    with pytest.raises(ValidationError, match="eval_strategy: steps needs eval_data"):
        TrainerConfig.model_validate({**base, "eval_strategy": "steps"})
    with pytest.raises(ValidationError, match="sft does not generate"):
        TrainerConfig.model_validate({**base, "trainer": "sft", "eval_data": {"path": "e.jsonl"}})
    with pytest.raises(ValidationError, match="num_train_epochs"):
        TrainerConfig.model_validate({**base, "num_train_epochs": 0})


def test_epochs_decide_the_steps_and_save_strategy_epoch(tmp_path: Path, tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # 16 prompts, 16 completions per step / 4 per prompt = 4 prompts per step: 4 steps per epoch, 2 epochs = 8
    monkeypatch.syspath_prepend(str(HERE))
    cfg = _cfg(tmp_path, tiny_model_dir, "ep", num_train_epochs=2, save_strategy="epoch", save_steps=1)
    assert run_cfg(cfg) == 0
    ms = read_metrics(tmp_path / "ep")
    assert [m["step"] for m in ms] == list(range(1, 9))
    assert [m["epoch"] for m in ms] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    # save_strategy epoch: a checkpoint where each pass ends (step 4) and the final one; save_steps is not used
    assert sorted(p.name for p in (tmp_path / "ep").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
    # a re-run of the finished job is "already complete" although max_steps (100 by default) was never reached
    assert run_cfg(cfg) == 0
    assert len(read_metrics(tmp_path / "ep")) == 8
    state = json.loads((tmp_path / "ep" / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["max_steps"] == 8


def test_save_strategy_no_keeps_only_the_final_checkpoint(tmp_path: Path, tiny_model_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    assert run_cfg(_cfg(tmp_path, tiny_model_dir, "no", max_steps=3, save_strategy="no", save_steps=1)) == 0
    assert sorted(p.name for p in (tmp_path / "no").glob("checkpoint-*")) == ["checkpoint-3"]


def test_eval_reward_metrics_hand_computed(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 eval prompts of 1, 3 and 2 characters, 4 completions each, reward = len(prompt) / 10: rewards 0.1, 0.3 and
    0.2 four times each; mean 0.2, Bessel std sqrt((4 * 0.01 + 4 * 0.01) / 11) = 0.0852803. With 8 completions per
    process and call (2 prompts), the second call carries one real prompt and one repeat that is dropped."""
    monkeypatch.syspath_prepend(str(HERE))
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a", "bbb", "cc")))
    cfg = _cfg(tmp_path, tiny_model_dir, "ev", max_steps=3, per_device_train_batch_size=8,
               rewards=[{"name": "toy_rewards:prompt_length", "weight": 2.0}, {"name": "toy_rewards:never"}],
               eval_data={"path": str(ev)}, eval_strategy="steps", eval_steps=2)
    assert run_cfg(cfg) == 0
    ms = read_metrics(tmp_path / "ev")
    assert [m["step"] for m in ms] == [1, 2, 3]
    assert "eval/reward" not in ms[0]  # evaluated at step 2 and after the last step (3)
    for m in ms[1:]:
        assert m["eval/rewards/prompt_length/mean"] == pytest.approx(0.2)
        assert m["eval/rewards/never/mean"] is None
        assert m["eval/reward"] == pytest.approx(0.4)  # weight 2
        assert m["eval/reward_std"] == pytest.approx(2 * math.sqrt(0.08 / 11), rel=1e-5)
        assert 1 <= m["eval/completions/mean_length"] <= 6
        assert m["time/eval"] > 0
