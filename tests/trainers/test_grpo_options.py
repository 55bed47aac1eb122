"""GRPOConfig's loss options (GSPO, cispo/sapo/luspo/vespo, delta, entropy mask and bonus, off-policy mask,
normalize_then_sum) against values worked out by hand (plain Python `math`, not our code).

TRL parity of the same options (losses, gradients, logged metrics) is `benchmarks/trl_loss_parity.py`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from launchgen.trainers import modeling
from launchgen.trainers.algorithms import grpo as g
from launchgen.trainers.algorithms import grpo_loss as gl
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.objectives.grpo import GRPOObjective
from pydantic import ValidationError

EPS = 1e-4


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ------------------------------------------------------------------------------------------ ratios, loss types


def test_sequence_level_ratio_is_exp_of_masked_mean_log_ratio() -> None:
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.2, -2.1, 9.0], [-0.9, -1.0, -1.3]])  # row 0 third token is padding
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    p = gl.LossParams(importance_sampling_level="sequence", epsilon_low=0.2, epsilon_high=0.2)
    out = gl.grpo_per_token_loss(logps, adv, old_logps=old, mask=mask, params=p)
    r0 = math.exp((0.2 + 0.1) / 2)  # mean over the two real tokens only
    r1 = math.exp((-0.1 + 0.0 + 0.3) / 3)
    assert out.ratio.shape == (2, 1)
    assert out.ratio.squeeze(1).tolist() == pytest.approx([r0, r1], rel=1e-6)
    # row 0: A > 0, min(r A, clip(r) A) = min(r0, 1.2) ; row 1: A < 0, -min(-r1, -clip(r1)) = max(r1, clip) = r1
    assert out.loss.shape == (2, 1)  # broadcast over the tokens by the normaliser's mask
    assert out.loss.squeeze(1).tolist() == pytest.approx([-min(r0, 1.2), r1], rel=1e-6)


def test_sequence_level_needs_the_mask() -> None:
    with pytest.raises(ValueError, match="mask"):
        gl.grpo_per_token_loss(torch.zeros(1, 2), torch.zeros(1),
                               params=gl.LossParams(importance_sampling_level="sequence"))


def test_delta_caps_the_unclipped_ratio_of_negative_advantages() -> None:
    logps = torch.tensor([[math.log(1.5)]])
    old = torch.zeros(1, 1)
    neg, pos = torch.tensor([-1.0]), torch.tensor([1.0])
    plain = gl.LossParams(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2)
    two = gl.LossParams(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2, delta=1.3)
    # A = -1: -min(-1.5, -1.2) = 1.5 without delta; with delta coef_1 = min(1.5, 1.3): -min(-1.3, -1.2) = 1.3
    assert gl.grpo_per_token_loss(logps, neg, old_logps=old, params=plain).loss.item() == pytest.approx(1.5)
    assert gl.grpo_per_token_loss(logps, neg, old_logps=old, params=two).loss.item() == pytest.approx(1.3)
    # A = +1: the clipped branch (1.2) wins either way
    assert gl.grpo_per_token_loss(logps, pos, old_logps=old, params=two).loss.item() == pytest.approx(-1.2)


def test_cispo_is_detached_clamped_ratio_times_logp() -> None:
    logps = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.9, -1.8]])
    adv = torch.tensor([2.0])
    p = gl.LossParams(loss_type="cispo", epsilon_high=1.3)
    out = gl.grpo_per_token_loss(logps, adv, old_logps=old, params=p)
    r = [math.exp(0.4), math.exp(-0.2)]  # 1.49 -> clamped to 1.3; 0.82 kept
    w = [min(x, 1.3) for x in r]
    assert out.loss[0].tolist() == pytest.approx([-w[0] * 2 * -0.5, -w[1] * 2 * -2.0], rel=1e-6)
    out.loss.sum().backward()
    assert logps.grad is not None
    assert logps.grad[0].tolist() == pytest.approx([-w[0] * 2, -w[1] * 2], rel=1e-6)  # no d(ratio)/dl term


def test_sapo_soft_gate_with_sign_dependent_temperature() -> None:
    logps = torch.tensor([[0.1], [0.1]])
    old = torch.zeros(2, 1)
    adv = torch.tensor([1.5, -0.5])
    p = gl.LossParams(loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    out = gl.grpo_per_token_loss(logps, adv, old_logps=old, params=p)
    r = math.exp(0.1)
    pos = -_sig(1.0 * (r - 1)) * 4 / 1.0 * 1.5
    neg = -_sig(2.0 * (r - 1)) * 4 / 2.0 * -0.5
    assert out.loss.squeeze(1).tolist() == pytest.approx([pos, neg], rel=1e-6)


def test_vespo_gamma_weight_by_hand() -> None:
    log_ratio = torch.tensor([[0.1, 0.1, 5.0]])  # the masked token must not count
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    p = gl.LossParams(loss_type="vespo")
    lw = 0.2
    pos = gl.gamma_weights(torch.tensor([[1.0]]), log_ratio, mask, None, p).item()
    neg = gl.gamma_weights(torch.tensor([[-1.0]]), log_ratio, mask, None, p).item()
    assert pos == pytest.approx(math.exp(3.0 + 2.0 * lw - 3.0 * math.exp(lw)), rel=1e-6)  # k+ 2, lambda+ 3
    assert neg == pytest.approx(math.exp(2.0 + 3.0 * lw - 2.0 * math.exp(lw)), rel=1e-6)  # k- 3, lambda- 2
    # phi(1) = 1 (normalised), and the IS ratio is folded into w in log space
    assert gl.gamma_weights(torch.tensor([[1.0]]), torch.zeros(1, 2), torch.ones(1, 2), None, p).item() == \
        pytest.approx(1.0)
    isr = torch.tensor([[math.exp(0.1), math.exp(0.1), 1.0]])
    with_is = gl.gamma_weights(torch.tensor([[1.0]]), log_ratio, mask, isr, p).item()
    assert with_is == pytest.approx(math.exp(3.0 + 2.0 * 0.4 - 3.0 * math.exp(0.4)), rel=1e-6)


def test_vespo_loss_ignores_is_ratio_as_a_factor() -> None:
    logps = torch.tensor([[-1.0]])
    adv = torch.tensor([1.0])
    p = gl.LossParams(loss_type="vespo")
    isr = torch.tensor([[math.exp(0.3)]])
    out = gl.grpo_per_token_loss(logps, adv, old_logps=logps.clone(), is_ratio=isr, mask=torch.ones(1, 1), params=p)
    phi = math.exp(3.0 + 2.0 * 0.3 - 3.0 * math.exp(0.3))
    assert out.loss.item() == pytest.approx(-phi * 1.0 * -1.0, rel=1e-6)  # not multiplied by exp(0.3) again


def test_kl_term_is_bias_corrected_for_the_metric() -> None:
    logps = torch.tensor([[-1.0]])
    old = torch.tensor([[-1.2]])
    ref = torch.tensor([[-1.5]])
    k3 = math.exp(-0.5) - (-0.5) - 1
    r = math.exp(0.2)
    on = gl.grpo_per_token_loss(logps, torch.tensor([0.0]), old_logps=old, ref_logps=ref, beta=0.1)
    off = gl.grpo_per_token_loss(logps, torch.tensor([0.0]), old_logps=old, ref_logps=ref, beta=0.1,
                                 use_bias_correction_kl=False)
    assert on.kl is not None and off.kl is not None
    assert on.kl.item() == pytest.approx(k3 * r, rel=1e-6)  # what TRL logs as `kl`
    assert off.kl.item() == pytest.approx(k3, rel=1e-6)


@pytest.mark.parametrize("lt,expected", [("sapo", (1.5 + 4.0) / 2 / 2), ("luspo", (3.0 + 4.0) / 2 / 2),
                                         ("cispo", 7.0 / (5 / 1 * 2 / 2)), ("vespo", 7.0 / (5 / 1 * 2 / 2))])
def test_new_normalisers(lt: str, expected: float) -> None:
    ptl = torch.tensor([[1.0, 2.0, 9.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = g.normalize_loss(ptl, mask, lt, gradient_accumulation_steps=2, num_items_in_batch=5, steps_per_generation=2)
    assert out.item() == pytest.approx(expected)


# ------------------------------------------------------------------------------------------ masks and bonus


def test_off_policy_mask_drops_negative_advantage_far_from_the_sampler() -> None:
    logps = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    samp = torch.tensor([[-0.5, -0.7], [-0.5, -0.7], [-0.98, float("nan")]])
    mask = torch.ones(3, 2)
    adv = torch.tensor([1.0, -1.0, -1.0])
    keep = gl.off_policy_mask(adv, logps, samp, mask, threshold=0.1)
    # mean KL: rows 0/1 (0.5 + 0.3) / 2 = 0.4 > 0.1; row 2: (0.02 + 0 for the NaN) / 2 = 0.01 <= 0.1
    assert keep.squeeze(1).tolist() == [1.0, 0.0, 1.0]


def test_high_entropy_mask_quantile_over_all_tokens() -> None:
    ent = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    flat = ent[mask.bool()]  # 0.1 0.5 0.9 0.3 0.7 ; 50% quantile (linear) = 0.5
    out = gl.high_entropy_mask(ent, mask, flat, top_quantile=0.5)
    assert out.tolist() == [[False, True, True], [False, True, False]]
    top = gl.high_entropy_mask(ent, mask, flat, top_quantile=0.0)
    assert top.tolist() == [[False, False, True], [False, False, False]]


def test_entropy_bonus_is_a_token_mean_over_the_effective_mask() -> None:
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert gl.entropy_bonus(ent, m, 2).item() == pytest.approx((1 + 2 + 5 + 6) / 4 / 2)


# ------------------------------------------------------------------------------------------ several rewards


def test_normalize_then_sum_by_hand() -> None:
    nan = float("nan")
    rpf = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, nan], [2.0, 4.0]])
    w = torch.tensor([1.0, 0.5])
    adv, summed = g.normalize_then_sum_advantages(rpf, w, 2)
    s1 = math.sqrt(2.0)  # unbiased std of {1, 3} and of {0, 2}
    a = [(1 - 2) / (s1 + EPS), (3 - 2) / (s1 + EPS)]
    b = [(0 - 1) / (s1 + EPS), (2 - 1) / (s1 + EPS)]
    # group 2: reward 0 is {2, 2} (std 0 -> 0/(0+eps) = 0); reward 1 has one value (std NaN -> NaN, nansum skips)
    expected_sum = [a[0] + 0.5 * b[0], a[1] + 0.5 * b[1], 0.0, 0.0]
    assert summed.tolist() == pytest.approx(expected_sum, abs=1e-6)
    mean = sum(expected_sum) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in expected_sum) / 3)
    assert adv.advantages.tolist() == pytest.approx([(x - mean) / (std + EPS) for x in expected_sum], abs=1e-6)


def test_normalize_then_sum_unscorable_row_gets_zero() -> None:
    nan = float("nan")
    rpf = torch.tensor([[1.0], [nan], [0.0], [2.0]])
    adv, summed = g.normalize_then_sum_advantages(rpf, torch.tensor([1.0]), 2)
    assert math.isnan(summed[1].item())
    assert adv.advantages[1].item() == 0.0


# ------------------------------------------------------------------------------------------ config and setup


def _cfg(**over: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"trainer": "grpo", "output_dir": "/tmp/x", "model": {"name_or_path": "m"},
                                         "data": {"path": "d.jsonl"}, **over})


def test_grpo_options_refused_for_other_trainers() -> None:
    with pytest.raises(ValidationError, match="delta is a GRPO option"):
        _cfg(trainer="rloo", delta=2.0)
    assert _cfg(delta=2.0).delta == 2.0


def test_top_entropy_quantile_range() -> None:
    with pytest.raises(ValidationError, match="top_entropy_quantile"):
        _cfg(top_entropy_quantile=1.5)


@pytest.mark.parametrize("over", [{"loss_type": "sapo"}, {"delta": 1.5}, {"importance_sampling_level": "sequence"},
                                  {"top_entropy_quantile": 0.5}, {"entropy_coef": 0.1},
                                  {"use_adaptive_entropy": True}, {"off_policy_mask_threshold": 0.1}])
def test_liger_fused_loss_refuses_what_it_cannot_compute(over: dict[str, object]) -> None:
    cfg = _cfg(model={"name_or_path": "m", "use_liger_kernel": True, "liger_grpo_loss": True},
               per_device_train_batch_size=8, **over)
    with pytest.raises(TrainerSetupError, match=next(iter(over))):
        GRPOObjective(cfg, 1).validate()
    # without the fused loss (Liger's layer kernels only) the chunked head computes it
    GRPOObjective(_cfg(model={"name_or_path": "m", "use_liger_kernel": True}, **over), 1).validate()


def test_entropy_options_refused_with_passes() -> None:
    with pytest.raises(TrainerSetupError, match="entropy_coef"):
        GRPOObjective(_cfg(entropy_coef=0.1, max_tokens_per_forward=64), 1).validate()
    with pytest.raises(TrainerSetupError, match="use_adaptive_entropy"):
        GRPOObjective(_cfg(use_adaptive_entropy=True, max_tokens_per_forward=64), 1).validate()


def test_adaptive_entropy_controller_follows_trl() -> None:
    """TRL 1.16's controller: no bonus before the first measurement; the window's token-weighted world entropy
    moves the coefficient by delta inside [min, max]; the bonus applies while the last entropy <= target."""
    from launchgen.trainers.algorithms.adaptive_entropy import AdaptiveEntropy

    ctl = AdaptiveEntropy(coef=0.01, target=0.5, delta=0.02, coef_min=0.0, coef_max=0.04)
    assert ctl.applied_coef() == 0.0  # last world entropy inf
    # one step of two micro-batches, token-weighted: (0.2 + 0.8 + 4 x 0.3) / 6 tokens = 0.3667 <= 0.5 -> up (the
    # per-micro-batch means 0.5 and 0.3 would average to 0.4)
    ctl.add(torch.tensor([[0.2, 0.8]]), torch.tensor([[1, 1]]))
    ctl.add(torch.tensor([[0.3, 0.3, 9.0], [0.3, 0.3, 9.0]]), torch.tensor([[1, 1, 0], [1, 1, 0]]))
    assert ctl.end_step(lambda t: t) == pytest.approx(0.03)
    assert ctl.last_world_entropy == pytest.approx(2.2 / 6)
    assert ctl.applied_coef() == pytest.approx(0.03)
    ctl.add(torch.tensor([[0.1]]), torch.tensor([[1]]))
    assert ctl.end_step(lambda t: t) == pytest.approx(0.04)  # capped at coef_max
    ctl.add(torch.tensor([[0.9, 0.7]]), torch.tensor([[1, 1]]))
    assert ctl.end_step(lambda t: t) == pytest.approx(0.02)  # 0.8 > target -> down
    assert ctl.applied_coef() == 0.0  # entropy above target: no bonus this step
    # a step with no micro-batch measured (nothing added) leaves the controller as it was
    assert ctl.end_step(lambda t: t) == pytest.approx(0.02)
    # the state survives a checkpoint (JSON: inf is written as null)
    fresh = AdaptiveEntropy(coef=0.01, target=0.5, delta=0.02, coef_min=0.0, coef_max=0.04)
    fresh.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert (fresh.coef, fresh.last_world_entropy) == (ctl.coef, ctl.last_world_entropy)
    assert json.loads(json.dumps(AdaptiveEntropy(0.0, 0.2, 0.005, 0.0, 1.0).state_dict()))["last_world_entropy"] is None


def test_vespo_refuses_sequence_is_on_vllm() -> None:
    cfg = _cfg(loss_type="vespo", generation={"backend": "vllm_server"})
    with pytest.raises(TrainerSetupError, match="token_truncate"):
        GRPOObjective(cfg, 1).validate()
    ok = _cfg(loss_type="vespo", generation={"backend": "vllm_server",
                                             "importance_sampling": {"mode": "token_mask"}})
    GRPOObjective(ok, 1).validate()


# ------------------------------------------------------------------------------------------ entropy gradient


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_entropy_gradient_through_the_head(tiny_model_dir: Path, compiled: bool) -> None:
    """The entropy bonus needs d(entropy)/d(theta): the head's entropy must match full logits, with gradient."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    head = modeling.install_logp_head(model)
    head.compiled = compiled
    pid = torch.tensor([[0, 11, 12], [21, 22, 23]])
    pmask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    cid = torch.tensor([[31, 32, 3], [41, 42, 43]])
    cmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    _, ent = modeling.per_token_logps(model, pid, pmask, cid, cmask, 0.7, entropy_grad=True)
    assert ent.requires_grad
    (ent * cmask).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits = model(input_ids=torch.cat([pid, cid], 1), attention_mask=torch.cat([pmask, cmask], 1)).logits
    z = logits[:, pid.size(1) - 1 : -1].float() / 0.7
    lp = torch.log_softmax(z, -1)
    ref_ent = -(lp.exp() * lp).sum(-1)
    assert (ent.detach() * cmask).flatten().tolist() == pytest.approx(
        (ref_ent.detach() * cmask).flatten().tolist(), abs=1e-5)
    (ref_ent * cmask).sum().backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(ours[n], p.grad, atol=1e-5, rtol=1e-4), n
    _, no_grad = modeling.per_token_logps(model, pid, pmask, cid, cmask, 0.7)
    assert not no_grad.requires_grad  # the default keeps the entropy a logged quantity


def test_resolved_config_round_trips_for_every_trainer() -> None:
    """A resolved config writes every option of its trainer (at its default; GRPO's only for grpo): reading it
    back must not count that as set."""
    import yaml
    from launchgen.trainers.declarations.algorithm_options import AlgorithmOptions
    from launchgen.trainers.declarations.configs import CONFIGS

    for trainer in [n for n, c in CONFIGS.items() if issubclass(c, TrainerConfig)]:  # the bundled loop's
        cfg = _cfg(trainer=trainer)
        text = cfg.to_yaml()
        keys = list(yaml.safe_load(text))
        assert keys[0] == "trainer"
        i = keys.index("mask_truncated_completions")
        if isinstance(cfg, AlgorithmOptions):
            assert keys[i + 1] == "importance_sampling_level"  # next to the other algorithm knobs
        else:
            assert not set(AlgorithmOptions.model_fields) & set(keys), trainer
        assert TrainerConfig.model_validate(yaml.safe_load(text)) == cfg
