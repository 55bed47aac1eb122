"""RLOO advantages, KL reward penalty and sequence-level loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from launchgen.trainers.algorithms import grpo as g
from launchgen.trainers.algorithms import rloo as r


def test_leave_one_out_baseline() -> None:
    out = r.rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), 4)
    # b_i = (12 - R_i) / 3 = 11/3, 10/3, 3, 2
    assert out.advantages.tolist() == pytest.approx([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0])


def test_equals_g_over_g_minus_1_times_unscaled_grpo() -> None:
    rew = torch.tensor([0.2, 0.9, 0.4, 0.1, 1.0, 0.0])
    loo = r.rloo_advantages(rew, 3).advantages
    grpo = g.grpo_advantages(rew, 3, "none").advantages
    assert loo.tolist() == pytest.approx((grpo * 3 / 2).tolist(), abs=1e-6)


def test_nan_excluded_from_baseline() -> None:
    out = r.rloo_advantages(torch.tensor([1.0, float("nan"), 3.0, 5.0]), 4)
    # scorable {1, 3, 5}: baselines (9-1)/2 = 4, (9-3)/2 = 3, (9-5)/2 = 2 ; the NaN row gets 0
    assert out.advantages.tolist() == pytest.approx([-3.0, 0.0, 0.0, 3.0])


def test_normalized_advantages() -> None:
    out = r.rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), 4, normalize=True)
    a = [1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0]
    m = sum(a) / 4
    s = math.sqrt(sum((x - m) ** 2 for x in a) / 3)
    assert out.advantages.tolist() == pytest.approx([(x - m) / (s + 1e-4) for x in a], abs=1e-6)


def test_kl_penalty_is_k1_summed_per_sequence() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rew, kl = r.kl_penalized_rewards(torch.tensor([1.0, 2.0]), 0.1, old, ref, mask, reward_clip_range=(0.0, 1.5))
    # row 0: (0.5) + (-1.0) = -0.5 (third token masked) ; row 1: 0 + 0.5 + 1.5 = 2.0 ; rewards clamped first
    assert rew.tolist() == pytest.approx([1.0 + 0.05, 1.5 - 0.2])
    assert kl is not None


def test_sequence_level_clipped_loss() -> None:
    logps = torch.tensor([[-1.0, -1.0, -9.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    old = torch.tensor([-2.5, -1.5])
    adv = torch.tensor([1.0, -2.0])
    out = r.rloo_loss(logps, mask, old, adv, 0.2, 0.2)
    r0, r1 = math.exp(-2.0 + 2.5), math.exp(-1.5 + 1.5)
    l0 = -min(r0 * 1.0, min(max(r0, 0.8), 1.2) * 1.0)  # 1.6487 clipped to 1.2 (A > 0)
    l1 = -min(r1 * -2.0, min(max(r1, 0.8), 1.2) * -2.0)
    assert out.loss.item() == pytest.approx((l0 + l1) / 2)
    out.loss.backward()
    # row 0 is clipped -> no gradient; row 1 gradient -A/2 per unmasked token
    assert logps.grad is not None
    assert logps.grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
