"""Online DPO: pairing, loss against hand-computed values, config defaults, and CPU runs on the tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import torch
from toy_runs import read_metrics, run_cfg, toy_cfg, toy_data

HERE = Path(__file__).parent


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_pairs_chosen_first_ties_and_unscorable_get_zero_weight() -> None:
    from launchgen.trainers.algorithms.online_dpo import pair_preferences

    r = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.3, 0.3, float("nan"), 1.0])
    p = pair_preferences(r)
    assert p.order.tolist() == [1, 0, 2, 3, 4, 5, 6, 7]
    assert p.weights.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert p.chosen_rewards[:3].tolist() == pytest.approx([0.9, 0.5, 0.3])
    assert p.rejected_rewards[:3].tolist() == pytest.approx([0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        pair_preferences(torch.zeros(3))


def test_sigmoid_and_ipo_loss_match_hand_computed_values() -> None:
    from launchgen.trainers.algorithms.online_dpo import dpo_loss

    pc = torch.tensor([-3.0, -5.0], requires_grad=True)
    pr = torch.tensor([-4.0, -2.0])
    rc = torch.tensor([-3.5, -4.0])
    rr = torch.tensor([-3.5, -3.0])
    beta = 0.1
    # logits = (pc - pr) - (rc - rr): pair 0: 1 - 0 = 1; pair 1: -3 - (-1) = -2
    res = dpo_loss(pc, pr, rc, rr, beta, "sigmoid")
    l0, l1 = -math.log(_sig(0.1)), -math.log(_sig(-0.2))
    assert res.losses.tolist() == pytest.approx([l0, l1], abs=1e-6)
    assert res.loss.item() == pytest.approx((l0 + l1) / 2, abs=1e-6)
    assert res.chosen_rewards.tolist() == pytest.approx([0.05, -0.1], abs=1e-6)
    assert res.rejected_rewards.tolist() == pytest.approx([-0.05, 0.1], abs=1e-6)
    res.loss.backward()
    # d/dpc of -log sigmoid(beta z) / 2 = -beta (1 - sigmoid(beta z)) / 2
    assert pc.grad is not None
    assert pc.grad.tolist() == pytest.approx([-0.1 * (1 - _sig(0.1)) / 2, -0.1 * (1 - _sig(-0.2)) / 2], abs=1e-6)

    ipo = dpo_loss(pc.detach(), pr, rc, rr, beta, "ipo")
    assert ipo.losses.tolist() == pytest.approx([(1 - 5.0) ** 2, (-2 - 5.0) ** 2], abs=1e-5)
    # a zero-weight (tied) pair adds nothing but still counts in the mean's denominator
    w = dpo_loss(pc.detach(), pr, rc, rr, beta, "sigmoid", torch.tensor([1.0, 0.0]))
    assert w.loss.item() == pytest.approx(l0 / 2, abs=1e-6)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(pc, pr, rc, rr, beta, "hinge")


def _base(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"trainer": "online_dpo", "output_dir": "o", "model": {"name_or_path": "m"}, "data": {"path": "d"}}
    d.update(over)
    return d


def test_config_defaults_follow_trl_only_where_unset() -> None:
    import yaml
    from launchgen.trainers.declarations.config import TrainerConfig
    from pydantic import ValidationError

    c = TrainerConfig.model_validate(_base())
    assert (c.beta, c.loss_type, c.num_generations, c.learning_rate) == (0.1, "sigmoid", 2, 5e-7)
    assert c.generation.temperature == 0.9
    assert TrainerConfig.model_validate(yaml.safe_load(c.to_yaml())) == c  # the resolved config reads back as is
    explicit = TrainerConfig.model_validate(_base(generation={"temperature": 1.0}, beta=0.2, loss_type="ipo"))
    assert (explicit.generation.temperature, explicit.beta, explicit.loss_type) == (1.0, 0.2, "ipo")
    g = TrainerConfig.model_validate(_base(trainer="grpo"))
    assert (g.generation.temperature, g.beta, g.loss_type, g.learning_rate) == (1.0, 0.0, "dapo", 1e-6)
    for bad, needle in (
        (_base(num_generations=4), "num_generations must be 2"),
        (_base(beta=0.0), "beta must be > 0"),
        (_base(loss_type="dapo"), "sigmoid or ipo"),
        (_base(per_device_train_batch_size=3), "must be even"),
        (_base(trainer="grpo", loss_type="sigmoid"), "is for online_dpo"),
    ):
        with pytest.raises(ValidationError, match=needle):
            TrainerConfig.model_validate(bad)


_data = toy_data
_metrics = read_metrics
_run = run_cfg


def _cfg(tmp_path: Path, model: Path, out: str, **over: Any) -> dict[str, Any]:
    return toy_cfg(tmp_path, model, out, **{"trainer": "online_dpo", **over})




TRL_KEYS = (
    "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
    "logps/rejected", "objective/scores", "objective/scores_margin", "objective/kl", "objective/entropy",
    "objective/non_score_reward", "objective/rlhf_reward", "val/contain_eos_token", "beta",
)


def test_learns_toy_task_and_step_one_is_exact(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reward = fraction of "7" characters in a 6-token completion (a random-init model starts near 0.04)."""
    monkeypatch.syspath_prepend(str(HERE))
    assert _run(_cfg(tmp_path, tiny_model_dir, "learn")) == 0
    ms = _metrics(tmp_path / "learn")
    first = ms[0]
    for key in TRL_KEYS:
        assert key in first, key
    # Step 1: the policy equals the reference (same path), so every implicit reward is 0 and each usable pair's
    # loss is -log sigmoid(0) = log 2; tied pairs weigh 0 but count in the mean.
    assert first["objective/kl"] == 0.0 and first["rewards/margins"] == 0.0 and first["rewards/accuracies"] == 0.0
    assert first["loss"] == pytest.approx(math.log(2) * (1 - first["objective/tied_pairs"]), abs=1e-6)
    assert first["beta"] == 0.1
    rewards = [m["reward"] for m in ms]
    assert len(rewards) == 12
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert start < 0.1
    assert end > 0.15 and end > 3 * start, rewards
    assert ms[-1]["objective/kl"] > 0  # the policy moved away from the reference


def test_loss_uses_untempered_logps_of_the_chosen_first_pairs(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step recomputed independently: chosen = higher reward, log-probs summed at T = 1 (TRL scores the raw
    logits while sampling at 0.9), logps/chosen as logged."""
    from launchgen.trainers import core, modeling
    from transformers import AutoModelForCausalLM

    monkeypatch.syspath_prepend(str(HERE))
    import toy_rewards

    seen: list[dict[str, Any]] = []
    orig = core.Trainer.micro_loss

    def spy(self: Any, mb: dict[str, Any], stats: Any) -> Any:
        seen.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in mb.items()})
        return orig(self, mb, stats)

    monkeypatch.setattr(core.Trainer, "micro_loss", spy)
    assert _run(_cfg(tmp_path, tiny_model_dir, "one", max_steps=1, per_device_train_batch_size=8)) == 0
    (mb,) = seen
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    modeling.install_logp_head(model)
    args = (mb["prompt_ids"], mb["prompt_mask"], mb["completion_ids"], mb["completion_mask"])
    with torch.no_grad():
        lp1, _ = modeling.per_token_logps(model, *args, 1.0)
        lp09, _ = modeling.per_token_logps(model, *args, 0.9)
    seq1, seq09 = lp1.sum(1), lp09.sum(1)
    logged = _metrics(tmp_path / "one")[0]
    assert logged["logps/chosen"] == pytest.approx(seq1[0::2].mean().item(), abs=1e-4)
    assert abs(logged["logps/chosen"] - seq09[0::2].mean().item()) > 1e-2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    texts = tok.batch_decode(mb["completion_ids"], skip_special_tokens=True)
    r = toy_rewards.target_fraction([], texts)
    for i in range(0, len(r), 2):
        assert r[i] >= r[i + 1]  # type: ignore[operator]
        assert mb["pair_weights"][i].item() == (1.0 if r[i] != r[i + 1] else 0.0)


def test_vllm_like_backend_gets_weights_after_every_step(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    monkeypatch.syspath_prepend(str(HERE))
    synced: list[int] = []
    temps: list[float] = []

    class FakeServer:
        def __init__(self, inner: HFGenerateBackend) -> None:
            self.inner = inner

        def generate(self, prompt_ids: Any, params: Any) -> Any:
            temps.append(params.temperature)
            return self.inner.generate(prompt_ids, params)

        def sync_weights(self, named_params: Any) -> None:
            synced.append(sum(1 for _ in named_params))

        def close(self) -> None:
            pass

    monkeypatch.setattr(
        backends, "make_backend", lambda cfg, acc, model, tok: FakeServer(HFGenerateBackend.from_config(cfg, acc, model, tok))
    )
    cfg = _cfg(tmp_path, tiny_model_dir, "fake", max_steps=2, per_device_train_batch_size=8,
               generation={"backend": "vllm_server", "max_completion_length": 6})
    assert _run(cfg) == 0
    assert len(synced) == 3 and synced[0] > 0  # before the first generation, then after each step
    assert temps == [0.9, 0.9]  # OnlineDPOConfig's default temperature (the field was left unset)
    assert "sampling/importance_sampling_ratio/mean" not in _metrics(tmp_path / "fake")[0]  # GRPO-only correction


def test_signal_mid_generation_batch_resumes_bit_identical(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    import toy_rewards

    common = dict(rewards=[{"name": "toy_rewards:target_fraction_signal"}], per_device_train_batch_size=4,
                  steps_per_generation=2, max_steps=3)
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert _run(_cfg(tmp_path, tiny_model_dir, "a", **common)) == 0
    full = _metrics(tmp_path / "a")
    monkeypatch.setattr(toy_rewards, "_calls", 0)
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 1)
    assert _run(_cfg(tmp_path, tiny_model_dir, "b", **common)) == 75
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert _run(_cfg(tmp_path, tiny_model_dir, "b", **common)) == 0
    resumed = _metrics(tmp_path / "b")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for a, b in zip(full, resumed, strict=True):
        assert (a["loss"], a["grad_norm"], a["rewards/margins"]) == (b["loss"], b["grad_norm"], b["rewards/margins"])


def test_cli_two_steps(tmp_path: Path, tiny_model_dir: Path) -> None:
    import os

    import yaml

    cfg = _cfg(tmp_path, tiny_model_dir, "cli", max_steps=2, per_device_train_batch_size=8)
    del cfg["learning_rate"]  # OnlineDPOConfig's 5e-7 then
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "launchgen.trainers.online_dpo", "--config", str(path), "--set", "beta=0.2"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "cli"
    ms = _metrics(out)
    assert [m["step"] for m in ms] == [1, 2] and ms[0]["beta"] == 0.2 and ms[0]["learning_rate"] == 5e-7
    assert json.loads((out / "launchgen-complete.json").read_text())["trainer"] == "online_dpo"
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()


def test_wrong_module_is_a_one_line_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml
    from launchgen.trainers.grpo import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_base()))
    assert main(["--config", str(path)]) == 2
    assert "python -m launchgen.trainers.online_dpo" in capsys.readouterr().err
