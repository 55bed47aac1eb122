"""`max_tokens_per_forward`: a micro-batch cut into several forward/backward passes gives the micro-batch's gradient.

Each case runs one optimizer step twice from the same seed (same completions, same rewards), once whole and once
in passes of a row or two, and compares the gradients the optimizer receives and the logged metrics. The loss
normalisers differ per loss type (per-sequence means, token means, global token counts, pair means), so each one
is a case of its own: a wrong share factor changes the gradient by the pass count.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import torch
from toy_runs import read_metrics, toy_cfg

HERE = Path(__file__).parent


def _one_step(cfg_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """Gradients at the first optimizer step, the logged metrics and the number of loss passes."""
    from launchgen.trainers.core import Trainer
    from launchgen.trainers.declarations.config import TrainerConfig

    cfg = TrainerConfig.model_validate(cfg_dict)
    trainer = Trainer(cfg)
    trainer.setup()
    grads: dict[str, torch.Tensor] = {}

    def capture(*_: Any) -> None:
        if not grads:
            for name, p in trainer.model.named_parameters():
                if p.grad is not None:
                    grads[name] = p.grad.detach().clone()

    # A pre-step hook on the torch optimizer accelerate wraps, not a replaced `step`: the LR scheduler wraps
    # `step` and warns when it is overridden.
    trainer.optimizer.optimizer.register_step_pre_hook(capture)
    passes = 0
    micro_loss = trainer.micro_loss

    def counting(*a: Any, **k: Any) -> torch.Tensor:
        nonlocal passes
        passes += 1
        return micro_loss(*a, **k)

    trainer.micro_loss = counting  # type: ignore[method-assign]
    try:
        assert trainer.train() == 0
    finally:
        trainer.close()
    return grads, read_metrics(Path(cfg.output_dir))[0], passes


CASES = [
    ("grpo", {"loss_type": "dapo"}),
    ("grpo", {"loss_type": "grpo"}),
    ("grpo", {"loss_type": "bnpo", "beta": 0.04}),
    ("grpo", {"loss_type": "dr_grpo"}),
    ("rloo", {}),
    ("online_dpo", {}),
]


@pytest.mark.parametrize("trainer,over", CASES, ids=[f"{t}-{o.get('loss_type', t)}" for t, o in CASES])
def test_passes_give_the_micro_batch_gradient(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, trainer: str, over: dict[str, Any]
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    common: dict[str, Any] = {
        "num_generations": 4 if trainer != "online_dpo" else 2,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_steps": 1,
        **over,
    }
    whole = _one_step(toy_cfg(tmp_path, tiny_model_dir, "whole", trainer, **common))
    # Rows are ~prompt + 6 tokens wide: 20 tokens -> passes of one row (online_dpo: one pair).
    split = _one_step(toy_cfg(tmp_path, tiny_model_dir, "split", trainer, max_tokens_per_forward=20, **common))
    g_whole, m_whole, n_whole = whole
    g_split, m_split, n_split = split
    assert n_whole == 2  # one pass per micro-batch
    assert n_split >= 8, n_split  # the split really happened
    assert g_whole.keys() == g_split.keys() and g_whole
    worst = max(float((g_whole[k] - g_split[k]).norm() / g_whole[k].norm().clamp(min=1e-12)) for k in g_whole)
    assert worst < 1e-4, worst
    for key in ("loss", "entropy", "kl", "clip_ratio/region_mean", "rewards/margins", "grad_norm"):
        if key in m_whole:
            a, b = m_whole[key], m_split[key]
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7), (key, a, b)


def test_sft_passes_give_the_micro_batch_gradient(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(
        json.dumps({"prompt": f"Question {i}?", "completion": " answer" * (1 + i % 4)}) for i in range(16)) + "\n")

    def cfg(out: str, **over: Any) -> dict[str, Any]:
        return {"trainer": "sft", "output_dir": str(tmp_path / out), "precision": "fp32",
                "model": {"name_or_path": str(tiny_model_dir)}, "data": {"path": str(data)},
                "per_device_train_batch_size": 8, "max_steps": 1, "save_steps": 0, "report_to": ["jsonl"],
                "save_final_model": False, **over}

    g_whole, m_whole, n_whole = _one_step(cfg("whole"))
    g_split, m_split, n_split = _one_step(cfg("split", max_tokens_per_forward=1))
    assert (n_whole, n_split) == (1, 8)
    worst = max(float((g_whole[k] - g_split[k]).norm() / g_whole[k].norm().clamp(min=1e-12)) for k in g_whole)
    assert worst < 1e-4, worst
    assert math.isclose(m_whole["loss"], m_split["loss"], rel_tol=1e-5)


def test_rows_per_pass_bounds() -> None:
    from launchgen.trainers.passes import rows_per_pass

    assert rows_per_pass(None, 1000, 64) == 64
    assert rows_per_pass(4096, 1056, 64) == 3
    assert rows_per_pass(100, 1056, 64) == 1  # never zero rows: one row over the limit still runs
    assert rows_per_pass(10**9, 1056, 64) == 64


class _GRPOSplitter:
    """The loop's pass splitting for a GRPO objective, without the loop."""

    def __init__(self, loss_type: str, limit: int) -> None:
        from launchgen.trainers.declarations.config import TrainerConfig
        from launchgen.trainers.objectives.grpo import GRPOObjective

        cfg = TrainerConfig.model_validate({"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"},
                                            "data": {"path": "d"}, "loss_type": loss_type,
                                            "max_tokens_per_forward": limit})
        self.limit, self.objective = limit, GRPOObjective(cfg, num_processes=1)

    def split_passes(self, mb: dict[str, Any]) -> Any:
        from launchgen.trainers.passes import split_passes
        from launchgen.trainers.rollout import RL_LAYOUT

        return split_passes(mb, self.limit, RL_LAYOUT, self.objective.pair_size, self.objective.loss_share)


def test_passes_pack_longest_first_and_drop_right_padding() -> None:
    lengths = [10, 3, 7, 1, 0, 5]
    rows, width = len(lengths), 10
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ids = torch.arange(rows * width).reshape(rows, width)
    mb = {"prompt_ids": torch.ones(rows, 4, dtype=torch.long), "prompt_mask": torch.ones(rows, 4, dtype=torch.long),
          "completion_ids": ids, "completion_mask": mask, "old_logps": ids.float(),
          "advantages": torch.arange(rows, dtype=torch.float32), "num_items_in_batch": torch.tensor(26.0)}
    parts = _GRPOSplitter("grpo", 30).split_passes(mb)
    # Longest first, greedy: [10, 7] at width 14, [5, 3, 1] at width 9, [0] at width 5 (one column kept).
    assert [p["advantages"].tolist() for p, _ in parts] == [[0.0, 2.0], [1.0, 3.0, 5.0], [4.0]]
    assert [p["completion_ids"].shape[1] for p, _ in parts] == [10, 5, 1]
    for p, _ in parts:
        assert p["prompt_ids"].numel() + p["completion_ids"].numel() <= 30
        assert p["num_items_in_batch"] is mb["num_items_in_batch"]
        rows_idx = p["advantages"].long()
        keep = p["completion_ids"].shape[1]
        assert torch.equal(p["completion_ids"], ids[rows_idx, :keep])
        assert torch.equal(p["old_logps"], ids[rows_idx, :keep].float())
        assert int(p["completion_mask"].sum()) == sum(lengths[int(r)] for r in rows_idx)
    assert sum(float(s) for _, s in parts) == pytest.approx(1.0)  # row shares of the grpo loss
    bnpo = _GRPOSplitter("bnpo", 30).split_passes(mb)
    assert [float(s) for _, s in bnpo] == pytest.approx([17 / 26, 9 / 26, 0.0])
    assert _GRPOSplitter("grpo", 10**6).split_passes(mb) == [(mb, 1.0)]


def test_agreed_pass_count_cuts_passes_and_keeps_the_gradient_shares() -> None:
    """FSDP: every rank runs the count `agree` returns (the max over ranks), even a rank whose micro-batch fits in
    one pass; the extra passes come from cutting the largest, at pair boundaries, within the limit."""
    from launchgen.trainers.passes import split_passes
    from launchgen.trainers.rollout import RL_LAYOUT

    lengths = [10, 3, 7, 1, 0, 5]
    rows, width = len(lengths), 10
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    mb = {"prompt_ids": torch.ones(rows, 4, dtype=torch.long), "prompt_mask": torch.ones(rows, 4, dtype=torch.long),
          "completion_ids": torch.arange(rows * width).reshape(rows, width), "completion_mask": mask,
          "advantages": torch.arange(rows, dtype=torch.float32), "num_items_in_batch": torch.tensor(26.0)}
    splitter = _GRPOSplitter("bnpo", 10**6)
    asked: list[int] = []

    def agree_to(n: int) -> Any:
        def agree(mine: int) -> int:
            asked.append(mine)
            return n
        return agree

    def split(limit: int, unit: int, n: int) -> list[tuple[dict[str, Any], Any]]:
        return split_passes(mb, limit, RL_LAYOUT, unit, splitter.objective.loss_share, agree_to(n))

    assert split(10**6, 1, 1) == [(mb, 1.0)] and asked == [1]  # fits, and so do all other ranks'
    parts = split(10**6, 1, 4)  # fits here, another rank needs 4 passes
    assert asked[-1] == 1 and len(parts) == 4
    assert sorted(r for p, _ in parts for r in p["advantages"].tolist()) == [float(r) for r in range(rows)]
    assert sum(float(s) for _, s in parts) == pytest.approx(1.0)
    parts = split(30, 1, 5)  # 3 passes of its own (see the packing test), cut to 5, each still within the limit
    assert asked[-1] == 3 and len(parts) == 5
    assert all(p["prompt_ids"].numel() + p["completion_ids"].numel() <= 30 for p, _ in parts)
    assert sum(float(s) for _, s in parts) == pytest.approx(1.0)
    pairs = split(10**6, 2, 3)  # online_dpo's unit: a pair never spans two passes
    assert [p["advantages"].tolist() for p, _ in pairs] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(ValueError, match="too few rows"):
        split(10**6, 2, 4)


class _VariedLengths:
    """Generation stand-in: completion i has 1 + (i * 5) % 7 tokens, the last one EOS, so passes must trim."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    def generate(self, prompt_ids: list[list[int]], params: Any) -> Any:
        from launchgen.trainers.generation.protocol import GenerationOutput

        comps = [[5 + (i + j) % 50 for j in range((i * 5) % 7)] + [self.eos] for i in range(len(prompt_ids))]
        return GenerationOutput(prompt_ids=[list(p) for p in prompt_ids], completion_ids=comps,
                                logprobs=None, finished=[True] * len(comps))

    def sync_weights(self, named_params: Any) -> None:
        for _ in named_params:
            pass

    def close(self) -> None:
        return None


@pytest.mark.parametrize("trainer,over", [("grpo", {"loss_type": "bnpo"}), ("grpo", {"loss_type": "grpo"}),
                                          ("online_dpo", {})], ids=["bnpo", "grpo", "online_dpo"])
def test_trimmed_passes_of_varied_lengths_give_the_micro_batch_gradient(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, trainer: str, over: dict[str, Any]
) -> None:
    from launchgen.trainers import core
    from launchgen.trainers.generation import backends

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setattr(backends, "make_backend", lambda cfg, acc, model, tok: _VariedLengths(tok.eos_token_id))
    widths: list[tuple[int, int]] = []
    split = core.Trainer.split_passes

    def recording(self: Any, mb: dict[str, Any]) -> Any:
        parts = split(self, mb)
        widths.extend((p["completion_ids"].shape[1], mb["completion_ids"].shape[1]) for p, _ in parts)
        return parts

    monkeypatch.setattr(core.Trainer, "split_passes", recording)
    common: dict[str, Any] = {"num_generations": 4 if trainer != "online_dpo" else 2,
                              "per_device_train_batch_size": 8, "max_steps": 1, **over}
    g_whole, m_whole, _ = _one_step(toy_cfg(tmp_path, tiny_model_dir, "whole", trainer, **common))
    widths.clear()
    g_split, m_split, n_split = _one_step(
        toy_cfg(tmp_path, tiny_model_dir, "split", trainer, max_tokens_per_forward=24, **common))
    assert n_split >= 3 and any(w < full for w, full in widths), widths  # several passes, some trimmed
    worst = max(float((g_whole[k] - g_split[k]).norm() / g_whole[k].norm().clamp(min=1e-12)) for k in g_whole)
    assert worst < 1e-4, worst
    assert math.isclose(m_whole["loss"], m_split["loss"], rel_tol=1e-4, abs_tol=1e-7)


def test_passes_are_refused_under_deepspeed() -> None:
    from types import SimpleNamespace

    from accelerate.utils import DistributedType
    from launchgen.trainers.core import Trainer
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.errors import TrainerSetupError

    def cfg(limit: int | None) -> TrainerConfig:
        return TrainerConfig.model_validate({"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"},
                                             "data": {"path": "/nonexistent/prompts.jsonl"}, "precision": "fp32",
                                             "max_tokens_per_forward": limit})

    acc = SimpleNamespace(num_processes=1, distributed_type=DistributedType.DEEPSPEED)
    with pytest.raises(TrainerSetupError, match="max_tokens_per_forward is not supported under DeepSpeed"):
        Trainer(cfg(4096), accelerator=acc).setup()
    # Without passes set-up goes on (and stops later, at the missing data file, for another reason).
    with pytest.raises(Exception) as other:
        Trainer(cfg(None), accelerator=acc).setup()
    assert "DeepSpeed" not in str(other.value)
