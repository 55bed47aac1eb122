"""GRPO advantages, IS correction and losses against values worked out by hand (plain Python, not our code)."""

from __future__ import annotations

import math

import pytest
import torch
from launchgen.trainers.algorithms import grpo as g

EPS = 1e-4


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# ------------------------------------------------------------------------------------------ advantages


def test_group_advantages_unbiased_std_plus_eps() -> None:
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    out = g.grpo_advantages(r, 4, "group")
    s = math.sqrt(5 / 3)  # unbiased std of 1..4 (population std would be sqrt(5/4))
    expected = [-1.5 / (s + EPS), -0.5 / (s + EPS), 0.5 / (s + EPS), 1.5 / (s + EPS), 0, 0, 0, 0]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.std_is_zero.tolist() == [False] * 4 + [True] * 4


def test_nan_rewards_excluded_and_zero_advantage() -> None:
    r = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    out = g.grpo_advantages(r, 4, "group")
    # mean and std over {1, 3, 5}: 3 and 2
    assert out.advantages.tolist() == pytest.approx([-2 / (2 + EPS), 0.0, 0.0, 2 / (2 + EPS)], abs=1e-6)
    assert not torch.isnan(out.advantages).any()


def test_single_scorable_in_group_gives_zero() -> None:
    out = g.grpo_advantages(torch.tensor([float("nan"), 2.0]), 2, "group")
    assert out.advantages.tolist() == [0.0, 0.0]


def test_batch_scaling_subtracts_group_mean_divides_global_std() -> None:
    r = torch.tensor([0.0, 1.0, 2.0, 5.0])
    out = g.grpo_advantages(r, 2, "batch")
    s = _std([0.0, 1.0, 2.0, 5.0])
    assert s == pytest.approx(math.sqrt(14 / 3))
    expected = [-0.5 / (s + EPS), 0.5 / (s + EPS), -1.5 / (s + EPS), 1.5 / (s + EPS)]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-6)


def test_no_scaling() -> None:
    out = g.grpo_advantages(torch.tensor([0.0, 1.0, 2.0, 5.0]), 2, "none")
    assert out.advantages.tolist() == pytest.approx([-0.5, 0.5, -1.5, 1.5])


def test_combine_rewards_weighted_and_unscorable() -> None:
    rpf = torch.tensor([[1.0, float("nan")], [float("nan"), float("nan")], [0.5, 2.0]])
    out = g.combine_rewards(rpf, torch.tensor([2.0, 0.5]))
    assert out[0].item() == pytest.approx(2.0)
    assert math.isnan(out[1].item())
    assert out[2].item() == pytest.approx(2.0)


def test_bad_group_size_rejected() -> None:
    with pytest.raises(ValueError, match="groups of 3"):
        g.grpo_advantages(torch.zeros(4), 3)


# ------------------------------------------------------------------------------------------ per-token loss

# Two rows, three positions, the last position of row 0 is padding.
LOGPS = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]]
OLD = [[-1.1, -1.5, -0.5], [-0.5, -1.2, -2.0]]
REF = [[-0.9, -2.1, -0.4], [-0.2, -1.0, -2.5]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [0.7, -1.3]


def _hand_per_token(eps_lo: float, eps_hi: float, beta: float, bias_corr: bool, is_ratio: list[list[float]] | None):
    rows = []
    for i in range(2):
        row = []
        for t in range(3):
            r = math.exp(LOGPS[i][t] - OLD[i][t])
            c = min(max(r, 1 - eps_lo), 1 + eps_hi)
            loss = -min(r * ADV[i], c * ADV[i])
            if is_ratio is not None:
                loss *= is_ratio[i][t]
            if beta:
                d = REF[i][t] - LOGPS[i][t]
                k = math.exp(d) - d - 1
                loss += beta * (k * r if bias_corr else k)
            row.append(loss)
        rows.append(row)
    return rows


def _ours(**kw):
    return g.grpo_per_token_loss(
        torch.tensor(LOGPS, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        old_logps=torch.tensor(OLD, dtype=torch.float64),
        ref_logps=torch.tensor(REF, dtype=torch.float64),
        **kw,
    )


@pytest.mark.parametrize("beta,bias_corr", [(0.0, True), (0.04, True), (0.04, False)])
def test_per_token_loss_matches_hand(beta: float, bias_corr: bool) -> None:
    out = _ours(epsilon_low=0.2, epsilon_high=0.28, beta=beta, use_bias_correction_kl=bias_corr)
    expected = _hand_per_token(0.2, 0.28, beta, bias_corr, None)
    assert out.loss.tolist()[0] == pytest.approx(expected[0], rel=1e-12)
    assert out.loss.tolist()[1] == pytest.approx(expected[1], rel=1e-12)


def test_clipping_values() -> None:
    # r = e^{0.5} = 1.6487 with eps 0.2: A > 0 -> clipped to 1.2; A < 0 -> unclipped r (the pessimistic side)
    lp = torch.tensor([[0.5], [0.5]])
    out = g.grpo_per_token_loss(lp, torch.tensor([1.0, -1.0]), old_logps=torch.zeros(2, 1))
    assert out.loss[:, 0].tolist() == pytest.approx([-1.2, math.exp(0.5)])


def test_is_ratio_multiplies_policy_term_before_kl() -> None:
    is_ratio = [[0.0, 0.5, 1.0], [2.0, 0.0, 1.0]]
    out = _ours(beta=0.1, is_ratio=torch.tensor(is_ratio, dtype=torch.float64))
    expected = _hand_per_token(0.2, 0.2, 0.1, True, is_ratio)
    assert out.loss.tolist()[0] == pytest.approx(expected[0], rel=1e-12)
    assert out.loss.tolist()[1] == pytest.approx(expected[1], rel=1e-12)
    # where the IS ratio is 0 only the (not IS-weighted) KL term remains
    d = REF[0][0] - LOGPS[0][0]
    k = math.exp(d) - d - 1
    assert out.loss[0, 0].item() == pytest.approx(0.1 * k * math.exp(LOGPS[0][0] - OLD[0][0]))


def test_bias_corrected_kl_gradient_on_policy() -> None:
    # On-policy (old = None): r == 1 in value, so the loss value is unchanged, but d(k r)/dl = dk/dl + k.
    ref = torch.tensor([[-0.4]])
    grads = {}
    for corr in (False, True):
        lp = torch.tensor([[-1.0]], requires_grad=True)
        out = g.grpo_per_token_loss(lp, torch.tensor([0.0]), ref_logps=ref, beta=1.0, use_bias_correction_kl=corr)
        out.loss.sum().backward()
        grads[corr] = lp.grad.item()
    d = -0.4 - -1.0
    k = math.exp(d) - d - 1
    dk = -math.exp(d) + 1
    assert grads[False] == pytest.approx(dk)
    assert grads[True] == pytest.approx(dk + k)


def test_on_policy_policy_gradient_is_minus_advantage() -> None:
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = g.grpo_per_token_loss(lp, torch.tensor([0.5]))
    assert out.ratio.tolist() == [[1.0, 1.0]]
    out.loss.sum().backward()
    assert lp.grad.tolist() == [[-0.5, -0.5]]


# ------------------------------------------------------------------------------------------ normalisers

PTL = [[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]]  # the 100 is under the mask and must never count


def _norm(loss_type: str, **kw) -> float:
    return g.normalize_loss(torch.tensor(PTL), torch.tensor(MASK), loss_type, **kw).item()


def test_grpo_normaliser() -> None:
    # mean over sequences of per-sequence token means, / GA
    assert _norm("grpo", gradient_accumulation_steps=1) == pytest.approx(((1 + 2) / 2 + (3 + 4 + 5) / 3) / 2)
    assert _norm("grpo", gradient_accumulation_steps=4) == pytest.approx(((1 + 2) / 2 + (3 + 4 + 5) / 3) / 2 / 4)


def test_bnpo_normaliser() -> None:
    assert _norm("bnpo", gradient_accumulation_steps=2) == pytest.approx(15 / 5 / 2)


def test_dr_grpo_uses_config_max_length_not_width() -> None:
    assert _norm("dr_grpo", gradient_accumulation_steps=2, max_completion_length=10) == pytest.approx(15 / (2 * 10) / 2)


def test_dapo_normaliser() -> None:
    # N = 40 tokens over the generation batch, 2 processes, GA 4, SPG 2: 15 / (40 / 2 * 4 / 2)
    v = _norm("dapo", gradient_accumulation_steps=4, num_items_in_batch=40, num_processes=2, steps_per_generation=2)
    assert v == pytest.approx(15 / 40)


def test_dapo_equals_bnpo_single_process_ga1() -> None:
    dapo = _norm("dapo", gradient_accumulation_steps=1, num_items_in_batch=5, num_processes=1, steps_per_generation=1)
    assert dapo == _norm("bnpo", gradient_accumulation_steps=1)


def test_split_invariance_dapo_vs_bnpo() -> None:
    # Two micro-batches of one row each (GA = SPG = 2): dapo's parts sum to the whole-batch value, bnpo's do not.
    ptl, mask = torch.tensor(PTL), torch.tensor(MASK)
    whole = g.normalize_loss(ptl, mask, "dapo", gradient_accumulation_steps=1, num_items_in_batch=5, steps_per_generation=1)
    parts = sum(
        g.normalize_loss(ptl[i : i + 1], mask[i : i + 1], "dapo", gradient_accumulation_steps=2, num_items_in_batch=5, steps_per_generation=2)
        for i in range(2)
    )
    assert parts.item() == pytest.approx(whole.item())
    b_whole = g.normalize_loss(ptl, mask, "bnpo", gradient_accumulation_steps=1)
    b_parts = sum(g.normalize_loss(ptl[i : i + 1], mask[i : i + 1], "bnpo", gradient_accumulation_steps=2) for i in range(2))
    assert b_whole.item() == pytest.approx(3.0)
    assert b_parts.item() == pytest.approx((1.5 + 4.0) / 2)


def test_unknown_loss_type() -> None:
    with pytest.raises(ValueError, match="loss_type"):
        _norm("gspo", gradient_accumulation_steps=1)


# ------------------------------------------------------------------------------------------ IS correction

IS_OLD = [[-1.0, -2.0, -0.7], [-0.5, -0.5, 0.0]]
IS_SAMP = [[-1.1, -1.8, 0.0], [-0.5, float("nan"), 0.0]]  # row 0: padding at t=2; row 1: vLLM gave no value at t=1
IS_MASK = [[1, 1, 0], [1, 1, 0]]


def _is(mode: str, lo: float | None, hi: float | None, red: str = "sum") -> g.ISResult:
    return g.importance_sampling_ratio(
        torch.tensor(IS_OLD), torch.tensor(IS_SAMP), torch.tensor(IS_MASK), mode, lo, hi, red
    )


def test_is_token_truncate() -> None:
    out = _is("token_truncate", None, 1.1)
    # deltas: row0 0.1 -> e^0.1 = 1.105 -> 1.1 ; -0.2 -> 0.8187 ; padding -> 1 ; row1: 0 -> 1, NaN -> 1
    assert out.ratio.tolist()[0] == pytest.approx([1.1, math.exp(-0.2), 1.0])
    assert out.ratio.tolist()[1] == pytest.approx([1.0, 1.0, 1.0])


def test_is_token_mask() -> None:
    out = _is("token_mask", 0.85, 1.1)
    assert out.ratio.tolist()[0] == pytest.approx([0.0, 0.0, 1.0])  # 1.105 > 1.1 and 0.8187 < 0.85 -> 0
    assert out.ratio.tolist()[1] == pytest.approx([1.0, 1.0, 1.0])


def test_is_sequence_modes_use_sum_of_log_ratios() -> None:
    out = _is("sequence_truncate", 0.95, None)
    assert out.ratio.shape == (2, 1)
    assert out.ratio[:, 0].tolist() == pytest.approx([0.95, 1.0])  # e^{-0.1} = 0.905 clamped up to 0.95
    out = _is("sequence_mask", 0.95, 3.0)
    assert out.ratio[:, 0].tolist() == pytest.approx([0.0, 1.0])
    out = _is("sequence_mask", None, 3.0)
    assert out.ratio[:, 0].tolist() == pytest.approx([math.exp(-0.1), 1.0])


def test_is_sequence_mean_option() -> None:
    out = _is("sequence_truncate", None, 3.0, red="mean")
    assert out.ratio[:, 0].tolist() == pytest.approx([math.exp(-0.1 / 2), 1.0])


def test_is_metrics() -> None:
    out = _is("token_truncate", None, 1.1)
    # |old - samp| over masked, non-NaN tokens: 0.1, 0.2, 0.0
    assert out.logp_diff_mean.item() == pytest.approx(0.1, abs=1e-6)
    assert out.logp_diff_max.item() == pytest.approx(0.2, abs=1e-6)
    # token modes: over the 4 masked tokens
    assert out.ratio_min.item() == pytest.approx(math.exp(-0.2))
    assert out.ratio_max.item() == pytest.approx(1.1)
    assert out.ratio_mean.item() == pytest.approx((1.1 + math.exp(-0.2) + 1 + 1) / 4)


def test_clip_stats() -> None:
    ratio = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.5, 1.0]])
    cs = g.clip_stats(ratio, torch.tensor([-1.0, 1.0]), torch.tensor(MASK), 0.2, 0.2)
    # row 0 (A<0): t0 low-clipped; t2 is padding. row 1 (A>0): t1 high-clipped.
    assert (cs.low.item(), cs.high.item(), cs.region.item(), cs.count.item()) == (1.0, 1.0, 2.0, 5.0)
    assert cs.low_seq_min.item() == pytest.approx(0.0)
    assert cs.high_seq_max.item() == pytest.approx(1 / 3)
