"""`memory_budget_gib`: a lower budget picks leaner memory knobs (more, smaller passes; then smaller head tiles),
the choice is printed at start and applied to the run, and a budget the static state alone exceeds is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from launchgen.trainers import memory_budget
from launchgen.trainers.core import Trainer
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from toy_runs import toy_cfg

GIB = 2**30


def _cfg(budget: float | None, **over: Any) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m", "gradient_checkpointing": True},
        "data": {"path": "d.jsonl"}, "memory_budget_gib": budget, **over})


def test_lower_budgets_pick_leaner_knobs() -> None:
    static, per_token = 4 * GIB, 60 * 2**10  # ~ the 0.5B shape's state and activations per token
    picks = [memory_budget.choose(_cfg(b), static, per_token) for b in (40.0, 10.0, 6.0, 4.9)]
    tokens = [c.max_tokens_per_forward for c in picks]
    assert tokens == sorted(tokens, reverse=True) and len(set(tokens)) == 4, tokens
    assert all(t is not None and t % memory_budget.TOKEN_STEP == 0 for t in tokens)
    chunks = [c.logits_chunk_mib for c in picks]
    assert chunks[:3] == [256] * 3 and chunks[3] == memory_budget.LEAN_LOGITS_CHUNK_MIB  # tight: smaller tiles too
    for c in picks:  # each choice fits its budget by the estimate, with the margin kept back
        assert c.peak_bytes_at_limit <= c.budget_gib * GIB * (1 - memory_budget.MARGIN)
    assert "max_tokens_per_forward" in picks[1].report() and "memory_budget_gib 10" in picks[1].report()


def test_a_user_limit_is_kept_when_lower_and_a_budget_below_the_static_state_is_refused() -> None:
    per_token = 60 * 2**10
    assert memory_budget.choose(_cfg(40.0, max_tokens_per_forward=2048), 4 * GIB, per_token
                                ).max_tokens_per_forward == 2048
    with pytest.raises(TrainerSetupError, match=r"memory_budget_gib 3: .* 4.00 GiB"):
        memory_budget.choose(_cfg(3.0), 4 * GIB, per_token)
    assert memory_budget.choose(_cfg(40.0), 4 * GIB, per_token, passes_available=False).max_tokens_per_forward is None


def test_activations_per_token_follow_checkpointing_and_precision() -> None:
    from types import SimpleNamespace

    text = SimpleNamespace(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                           head_dim=64, intermediate_size=4864)
    ckpt = memory_budget.bytes_per_token(_cfg(None), text)
    full = memory_budget.bytes_per_token(_cfg(None, model={"name_or_path": "m"}), text)
    fp32 = memory_budget.bytes_per_token(_cfg(None, precision="fp32",
                                              model={"name_or_path": "m", "gradient_checkpointing": True}), text)
    assert ckpt < full and fp32 == 2 * ckpt


@pytest.mark.parametrize("entropy", [False, True])
def test_the_trainer_applies_and_reports_the_choice(tmp_path: Path, tiny_model_dir: Path,
                                                    capsys: pytest.CaptureFixture[str], entropy: bool) -> None:
    from launchgen.trainers import modeling

    chosen = []
    budgets = [0.5]
    while budgets:
        budget = budgets.pop()
        over: dict[str, Any] = {"memory_budget_gib": budget, "num_generations": 4, "max_steps": 2}
        if entropy:
            over["entropy_coef"] = 0.01
        t = Trainer(TrainerConfig.model_validate(toy_cfg(tmp_path, tiny_model_dir, f"b{budget}", "grpo", **over)))
        t.setup()
        try:
            assert f"[launchgen] memory_budget_gib {budget:g}:" in capsys.readouterr().out
            c = t.memory_choice
            assert c is not None
            chosen.append(t.cfg.max_tokens_per_forward)
            assert modeling.get_logp_head(t.model).chunk_elements == t.cfg.model.logits_chunk_mib * 2**20 // 4
            assert t.train() == 0  # the run trains with the chosen passes
        finally:
            t.close()
        if len(chosen) == 1:  # a budget this model's estimate puts at ~300 tokens per pass (256 chosen)
            budgets.append((c.static_bytes + c.head_bytes + 300 * c.bytes_per_token) / (1 - memory_budget.MARGIN)
                           / GIB)
    if entropy:  # GRPO's entropy terms need the whole micro-batch in one pass: no passes chosen
        assert chosen == [None, None]
    else:
        assert chosen[0] is not None and chosen[1] is not None and chosen[1] < chosen[0], chosen
        assert chosen[1] == memory_budget.TOKEN_STEP  # under the micro-batch of 16 rows: two passes or more


def test_a_trainer_without_grpos_entropy_options_gets_passes_too(tmp_path: Path, tiny_model_dir: Path) -> None:
    """RLOO's config has no entropy fields (they are GRPO's): the budget still chooses passes for it."""
    cfg = toy_cfg(tmp_path, tiny_model_dir, "rloo", "rloo", memory_budget_gib=0.5, num_generations=4, max_steps=1)
    t = Trainer(TrainerConfig.model_validate(cfg))
    t.setup()
    try:
        assert t.memory_choice is not None and t.cfg.max_tokens_per_forward == t.memory_choice.max_tokens_per_forward
        assert t.cfg.max_tokens_per_forward is not None
        assert t.train() == 0
    finally:
        t.close()
