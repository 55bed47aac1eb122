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

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

import torch
from toy_runs import read_metrics, toy_cfg

HERE = Path(__file__).parent


def _one_step(cfg_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """Gradients at the first optimizer step, the logged metrics and the number of loss passes."""
    from launchgen.trainers.config import TrainerConfig
    from launchgen.trainers.core import OnlineRLTrainer
    from launchgen.trainers.supervised import SFTTrainer

    cfg = TrainerConfig.model_validate(cfg_dict)
    trainer: OnlineRLTrainer = (SFTTrainer if cfg.trainer == "sft" else OnlineRLTrainer)(cfg)
    trainer.setup()
    grads: dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def capture(*a: Any, **k: Any) -> Any:
        if not grads:
            for name, p in trainer.model.named_parameters():
                if p.grad is not None:
                    grads[name] = p.grad.detach().clone()
        return step(*a, **k)

    trainer.optimizer.step = capture  # type: ignore[method-assign]
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
    from launchgen.trainers.config import TrainerConfig
    from launchgen.trainers.core import OnlineRLTrainer

    def trainer(limit: int | None) -> OnlineRLTrainer:
        cfg = TrainerConfig.model_validate({"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"},
                                            "data": {"path": "d"}, "max_tokens_per_forward": limit})
        return OnlineRLTrainer(cfg)

    assert trainer(None).rows_per_pass(1000, 64) == 64
    assert trainer(4096).rows_per_pass(1056, 64) == 3
    assert trainer(100).rows_per_pass(1056, 64) == 1  # never zero rows: one row over the limit still runs
    assert trainer(10**9).rows_per_pass(1056, 64) == 64
