"""CPU runs of the loop with GRPOConfig's loss options and the TRL metrics they log (tiny model, toy task)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.objectives import base
from launchgen.trainers.stats import StepStats, reduce_step, window_value
from toy_runs import read_metrics, run_cfg, toy_cfg

HERE = Path(__file__).parent


def _fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM-like backend (separate sampler, returns log-probs slightly off the trainer's)."""
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    class FakeServer:
        def __init__(self, inner: HFGenerateBackend) -> None:
            self.inner = inner

        def generate(self, prompt_ids: Any, params: Any) -> Any:
            out = self.inner.generate(prompt_ids, params)
            out.logprobs = [[x - 0.3 * (i % 2) for x in row] for i, row in enumerate(out.logprobs)]
            return out

        def sync_weights(self, named_params: Any) -> None:
            for _ in named_params:
                pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(backends, "make_backend",
                        lambda cfg, acc, model, tok: FakeServer(HFGenerateBackend.from_config(cfg, acc, model, tok)))


def _prompt_tokens(model_dir: Path, data: Path) -> list[int]:
    import json

    from launchgen.trainers.data import build_prompt, tokenize_prompt
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    return [len(tokenize_prompt(build_prompt(r["prompt"], tok, None), tok, None)) for r in rows]


def test_grpo_with_every_option_runs_and_logs_trl_metrics(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    _fake_vllm(monkeypatch)
    cfg = toy_cfg(
        tmp_path, tiny_model_dir, "opts", "grpo", max_steps=3, per_device_train_batch_size=8, num_generations=4,
        beta=0.04, loss_type="grpo", importance_sampling_level="sequence", delta=1.5, top_entropy_quantile=0.5,
        entropy_coef=0.01, off_policy_mask_threshold=0.1, multi_objective_aggregation="normalize_then_sum",
        rewards=[{"name": "toy_rewards:target_fraction"}, {"name": "length", "weight": 0.5}],
        generation={"backend": "vllm_server", "max_completion_length": 6,
                    "importance_sampling": {"mode": "token_truncate", "clip_max": 2.0}},
        logging_steps=1,
    )
    assert run_cfg(cfg) == 0
    ms = read_metrics(tmp_path / "opts")
    assert len(ms) == 3
    for m in ms:
        for key in ("kl", "entropy", "policy_loss", "entropy_coef", "clip_ratio/low_min", "num_tokens",
                    "completions/mean_terminated_length", "completions/min_terminated_length",
                    "completions/max_terminated_length", "sampling/importance_sampling_ratio/mean"):
            assert key in m and m[key] is not None, key
        assert m["entropy_coef"] == pytest.approx(0.01)
        assert m["loss"] == pytest.approx(m["policy_loss"] - 0.01 * m["entropy"], abs=0.05)  # the bonus is small
    # num_tokens: every prompt + completion token so far (8 completions a step, 2 prompts x 4)
    assert ms[0]["num_tokens"] < ms[1]["num_tokens"] < ms[2]["num_tokens"]
    lengths = _prompt_tokens(tiny_model_dir, Path(cfg["data"]["path"]))
    assert min(lengths) * 8 + 8 <= ms[0]["num_tokens"] <= max(lengths) * 8 + 8 * 6


def test_num_tokens_window_reports_the_latest_value() -> None:
    assert window_value("num_tokens", [100.0, 250.0]) == 250.0
    assert window_value("reward", [1.0, 2.0]) == 1.5


def test_rloo_clip_extremes_by_hand() -> None:
    ratio = torch.tensor([0.5, 0.7, 1.5, 1.0])
    adv = torch.tensor([-1.0, -1.0, 1.0, -1.0])
    stats = StepStats()
    base.clip_counts(ratio, adv, 0.2, 0.2, stats)
    # low flags 1, 1, 0, 0 -> min 0; high flags 0, 0, 1, 0 -> max 1
    out = reduce_step(stats, _One(), lambda t: t, ("clip_ratio/low_min", "clip_ratio/high_max"))
    assert out["clip_ratio/low_min"] == 0.0
    assert out["clip_ratio/high_max"] == 1.0
    all_low = StepStats()
    base.clip_counts(torch.tensor([0.5, 0.6]), torch.tensor([-1.0, -2.0]), 0.2, 0.2, all_low)
    out = reduce_step(all_low, _One(), lambda t: t, ("clip_ratio/low_min", "clip_ratio/high_max"))
    assert out["clip_ratio/low_min"] == 1.0 and out["clip_ratio/high_max"] == 0.0
    assert out["clip_ratio/low_mean"] == 1.0


class _One:
    num_processes = 1
    device = torch.device("cpu")


def test_rloo_run_logs_clip_extremes(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    cfg = toy_cfg(tmp_path, tiny_model_dir, "rloo", "rloo", max_steps=2, per_device_train_batch_size=8,
                  num_generations=4, gradient_accumulation_steps=2, steps_per_generation=1, num_iterations=2)
    assert run_cfg(cfg) == 0
    for m in read_metrics(tmp_path / "rloo"):
        assert m["clip_ratio/low_min"] in (0.0, 1.0) and m["clip_ratio/high_max"] in (0.0, 1.0)
        assert "num_tokens" in m


def test_off_policy_mask_on_the_plain_backend_compares_with_the_old_policy_as_trl(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's transformers path has no sampler log-probs: its off-policy mask compares the policy with the old policy
    (itself, within one optimizer step), so nothing is dropped. The plain backend's own log-probs come after top-k
    renormalisation (far above the policy's at top_k 3); comparing with them would drop every negative-advantage row."""
    monkeypatch.syspath_prepend(str(HERE))
    common: dict[str, Any] = dict(max_steps=2, per_device_train_batch_size=8, num_generations=4, logging_steps=1,
                                  generation={"backend": "hf", "max_completion_length": 6, "top_k": 3})
    runs = {}
    for name, extra in (("plain", {}), ("masked", {"off_policy_mask_threshold": 1e-6})):
        cfg = toy_cfg(tmp_path, tiny_model_dir, name, "grpo", **common, **extra)
        assert run_cfg(cfg) == 0
        runs[name] = read_metrics(tmp_path / name)
    # some group must have unequal rewards, so that negative advantages exist for the mask to drop: the loss of a
    # first iteration is -mean(advantage) = 0 when all rows count, and < 0 once negative-advantage rows are dropped
    assert any(m["frac_reward_zero_std"] < 1.0 for m in runs["plain"])
    for plain, masked in zip(runs["plain"], runs["masked"], strict=True):
        assert masked["loss"] == pytest.approx(plain["loss"], abs=1e-6)
        assert masked["reward"] == pytest.approx(plain["reward"])


def test_adaptive_entropy_run_moves_the_coefficient_and_resumes_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's adaptive control in the loop: the first step applies no bonus (nothing measured yet); with a target
    above any entropy the coefficient rises by delta each step up to its cap, and each later step subtracts the
    previous step's coefficient x the entropy; a resumed run continues from the checkpointed coefficient."""
    monkeypatch.syspath_prepend(str(HERE))
    common: dict[str, Any] = dict(per_device_train_batch_size=8, num_generations=4, logging_steps=1,
                                  use_adaptive_entropy=True, entropy_coef=0.01, entropy_coef_delta=0.02,
                                  entropy_coef_max=0.05, entropy_target=100.0, save_steps=2,
                                  generation={"max_completion_length": 6})
    cfg = toy_cfg(tmp_path, tiny_model_dir, "ae", "grpo", max_steps=2, **common)
    assert run_cfg(cfg) == 0
    cfg = toy_cfg(tmp_path, tiny_model_dir, "ae", "grpo", max_steps=4, **common)
    assert run_cfg(cfg) == 0  # resumes from checkpoint-2
    ms = read_metrics(tmp_path / "ae")
    assert [m["entropy_coef"] for m in ms] == pytest.approx([0.03, 0.05, 0.05, 0.05])
    assert ms[0]["loss"] == pytest.approx(ms[0]["policy_loss"], abs=1e-6)  # no bonus before a measurement
    for prev, m in itertools.pairwise(ms):
        assert m["loss"] == pytest.approx(m["policy_loss"] - prev["entropy_coef"] * m["entropy"], abs=1e-5)
