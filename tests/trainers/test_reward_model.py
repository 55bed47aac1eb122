"""`rewards: [{model: PATH}]`: a sequence-classification reward model scores prompt + completion, batched; and a
GRPO run with a reward model, evaluation, num_train_epochs and wandb offline completes on CPU with the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from toy_runs import read_metrics, run_cfg, toy_cfg
from wandb_records import history, wait_closed

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from launchgen.trainers.tiny import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


def test_batched_scores_are_each_texts_own_last_token_logit(reward_model_dir: Path) -> None:
    from launchgen.trainers.reward_model import ModelReward
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    prompts = ["Say 7", "What is 2 + 2? Answer briefly please", "x", "Say 7", "a b c"]
    completions = ["7 7 7", "4", "a much longer completion than the others", "", "d"]
    rm = ModelReward(str(reward_model_dir), None, batch_size=2, field="rewards.0.model")  # 3 padded batches
    got = rm(prompts=prompts, completions=completions)
    # reference: each text alone, unpadded, its last token's score (the model's own pooling, no batching involved)
    tok = AutoTokenizer.from_pretrained(str(reward_model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(reward_model_dir), dtype=torch.float32)
    hidden: list[torch.Tensor] = []
    model.model.register_forward_hook(lambda _m, _i, out: hidden.append(out.last_hidden_state))
    for p, c, g in zip(prompts, completions, got, strict=True):
        ids = tok(p + c, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            want = model(**ids).logits[0, 0].item()
        # by hand: the score head (no bias) applied to the final hidden state of the last token
        by_hand = (hidden[-1][0, -1] @ model.score.weight[0]).item()
        assert g == pytest.approx(want, abs=1e-5) and want == pytest.approx(by_hand, abs=1e-5)
    assert len(set(round(x, 6) for x in got if x is not None)) >= 4  # the texts do get different scores
    assert rm.__name__ == reward_model_dir.name


def test_conversational_prompts_use_the_chat_template(reward_model_dir: Path) -> None:
    from launchgen.trainers.reward_model import ModelReward

    rm = ModelReward(str(reward_model_dir), None, batch_size=8, field="rewards.0.model")
    msgs = [{"role": "user", "content": "Say 7"}]
    text = rm.texts([msgs], [[{"role": "assistant", "content": "7"}]])[0]
    assert text == rm.tokenizer.apply_chat_template([*msgs, {"role": "assistant", "content": "7"}], tokenize=False)
    assert "Say 7" in text
    assert rm.texts(["Say "], ["7"]) == ["Say 7"]  # plain text: prompt + completion


def test_bad_reward_model_path_is_a_setup_error_naming_the_field(tmp_path: Path) -> None:
    from launchgen.trainers.declarations.config import RewardSpec
    from launchgen.trainers.declarations.errors import TrainerSetupError
    from launchgen.trainers.declarations.rewards import load_rewards
    from pydantic import ValidationError

    with pytest.raises(TrainerSetupError, match=r"rewards\.1\.model: cannot load reward model"):
        load_rewards([RewardSpec(name="accuracy"), RewardSpec(model=str(tmp_path / "missing"))])
    with pytest.raises(ValidationError, match=r"`name` .* or `model`"):
        RewardSpec.model_validate({"weight": 1.0})


def test_grpo_with_reward_model_eval_epochs_and_wandb_offline_on_cpu(
    tmp_path: Path, tiny_model_dir: Path, reward_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"prompt": f"Say {i}"}) + "\n" for i in range(3)))
    cfg = toy_cfg(tmp_path, tiny_model_dir, "all", trainer="grpo", num_generations=4, per_device_train_batch_size=8,
                  rewards=[{"model": str(reward_model_dir), "batch_size": 5}, {"name": "toy_rewards:target_fraction"}],
                  num_train_epochs=0.5,  # 16 prompts, 2 per step: 4 steps
                  eval_data={"path": str(ev)}, eval_strategy="steps", eval_steps=2,
                  report_to=["jsonl", "wandb"], save_steps=2)
    assert run_cfg(cfg) == 0
    out = tmp_path / "all"
    ms = read_metrics(out)
    name = reward_model_dir.name
    assert [m["step"] for m in ms] == [1, 2, 3, 4]
    assert all(math.isfinite(m[f"rewards/{name}/mean"]) for m in ms)
    assert [m["step"] for m in ms if "eval/reward" in m] == [2, 4]
    assert all(math.isfinite(m[f"eval/rewards/{name}/mean"]) for m in ms if "eval/reward" in m)
    assert ms[-1]["epoch"] == 0.5
    assert (out / "launchgen-complete.json").is_file()
    run_id = (out / "wandb-run-id").read_text().strip()
    (run_file,) = out.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    wait_closed(run_file)
    rows = history(run_file)
    assert [r["_step"] for r in rows] == [1, 2, 3, 4]
    assert rows[3]["eval/reward"] == pytest.approx(ms[3]["eval/reward"])
