"""launchgen's GRPO objective vs TRL 1.16's `_compute_loss` for every GRPOConfig loss option (CPU, fp32).

Verification tooling only (launchgen never imports trl); run by `benchmarks/trl_loss_parity.py`, same set-up.
Unlike the base cases (the pure loss functions), these go through `objectives.grpo.GRPOObjective.loss`, so the
wiring is compared too (masks, the entropy bonus with its gradient through the log-prob head) and so are the
logged metrics: every metric TRL logs in `_compute_loss` must be logged by launchgen under the same name with the
same value (after `stats.reduce_step`).

Options: importance_sampling_level sequence (GSPO) with each clipped loss type, loss types cispo / sapo / luspo /
vespo (with and without the vLLM IS ratio), delta, top_entropy_quantile, entropy_coef (alone and with the entropy
mask), off_policy_mask_threshold (with the sampler's log-probs and without), beta > 0 with each.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

#: Metrics launchgen logs in the loss that TRL does not (none today); TRL-only keys fail the case.
_OURS_ONLY: frozenset[str] = frozenset()


@dataclass
class Fixture:
    model_dir: str
    out: str
    temperature: float
    batch: dict[str, torch.Tensor]
    old: torch.Tensor
    ref: torch.Tensor
    isr: torch.Tensor
    samp: torch.Tensor
    ds: Any
    reward: Callable[..., list[float]]
    mine: torch.nn.Module
    grads: Callable[[torch.nn.Module], dict[str, torch.Tensor]]
    rel: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], float]


@dataclass(frozen=True)
class Case:
    name: str
    opts: dict[str, Any]
    beta: float = 0.0
    with_is: bool = False
    with_samp: bool = False
    ga: int = 1  # 2: two micro-batches of one optimizer step (metrics averaged over them, as TRL)


def cases() -> Iterator[Case]:
    for lt in ("grpo", "dapo", "bnpo", "dr_grpo", "luspo"):
        for beta, with_is in itertools.product((0.0, 0.04), (False, True)):
            yield Case(f"gspo {lt}", {"loss_type": lt, "importance_sampling_level": "sequence"}, beta, with_is)
    for lt in ("cispo", "sapo", "luspo", "vespo"):
        for beta, with_is in itertools.product((0.0, 0.04), (False, True)):
            yield Case(f"loss {lt}", {"loss_type": lt}, beta, with_is)
    yield Case("sapo temps", {"loss_type": "sapo", "sapo_temperature_pos": 0.7, "sapo_temperature_neg": 2.0})
    yield Case("vespo k/lambda", {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5,
                                  "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5}, 0.04, True)
    yield Case("cispo seq", {"loss_type": "cispo", "importance_sampling_level": "sequence"}, 0.04)
    for lt, beta in itertools.product(("grpo", "dapo"), (0.0, 0.04)):
        yield Case(f"delta {lt}", {"loss_type": lt, "delta": 1.1}, beta, True)
    yield Case("delta gspo", {"loss_type": "grpo", "delta": 1.05, "importance_sampling_level": "sequence"}, 0.04)
    for q, lt in itertools.product((0.5, 0.0), ("grpo", "dapo")):
        yield Case(f"entropy mask q={q} {lt}", {"loss_type": lt, "top_entropy_quantile": q}, 0.04, True)
    for lt in ("grpo", "dapo", "bnpo"):
        yield Case(f"entropy_coef {lt}", {"loss_type": lt, "entropy_coef": 0.05}, 0.04)
    yield Case("entropy_coef + mask", {"loss_type": "grpo", "entropy_coef": 0.05, "top_entropy_quantile": 0.5})
    for with_samp, beta in itertools.product((False, True), (0.0, 0.04)):
        yield Case("off-policy mask", {"loss_type": "grpo", "off_policy_mask_threshold": 0.05}, beta, True, with_samp)
    yield Case("off-policy + gspo + mask", {"loss_type": "dapo", "off_policy_mask_threshold": 0.05,
                                             "importance_sampling_level": "sequence", "top_entropy_quantile": 0.5},
               0.04, True, True)
    # GA 2: the metrics of two micro-batches with different token counts (TRL averages per call)
    yield Case("GA2 grpo", {"loss_type": "grpo"}, 0.04, True, ga=2)
    yield Case("GA2 dapo entropy_coef", {"loss_type": "dapo", "entropy_coef": 0.05, "top_entropy_quantile": 0.5},
               0.04, ga=2)
    yield Case("GA2 cispo", {"loss_type": "cispo"}, 0.04, ga=2)
    yield Case("GA2 vespo gspo-free", {"loss_type": "vespo"}, 0.0, True, ga=2)
    yield Case("GA2 gspo bnpo", {"loss_type": "bnpo", "importance_sampling_level": "sequence"}, 0.04, ga=2)


def _rows(fx: Fixture, case: Case) -> list[slice]:
    """The micro-batches of the case: the whole batch, or (GA 2) rows 0-1 and 2-3 (different token counts)."""
    b = fx.batch["completion_mask"].size(0)
    return [slice(0, b)] if case.ga == 1 else [slice(0, b // 2), slice(b // 2, b)]


def _trl_side(fx: Fixture, case: Case) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=fx.out, use_cpu=True, bf16=False, per_device_train_batch_size=4 // case.ga,
                      num_generations=4, beta=case.beta, epsilon=0.2, epsilon_high=0.28, temperature=fx.temperature,
                      max_completion_length=10, report_to=[], gradient_checkpointing=False,
                      steps_per_generation=case.ga, gradient_accumulation_steps=case.ga,
                      vllm_importance_sampling_mode="token_truncate", **case.opts)
    tr = GRPOTrainer(model=fx.model_dir, reward_funcs=fx.reward, args=args, train_dataset=fx.ds)
    tr.model.train()
    tr.current_gradient_accumulation_steps = case.ga
    tr.use_vllm = case.with_is  # TRL applies the IS ratio only with vLLM + correction on
    tr.vllm_importance_sampling_correction = case.with_is
    tr.model.zero_grad()
    total = 0.0
    for sl in _rows(fx, case):
        inputs: dict[str, Any] = {k: v[sl] for k, v in fx.batch.items()}
        inputs.update(num_items_in_batch=fx.batch["completion_mask"].sum(), old_per_token_logps=fx.old[sl])
        if case.beta:
            inputs["ref_per_token_logps"] = fx.ref[sl]
        if case.with_is:
            inputs["importance_sampling_ratio"] = fx.isr[sl]
        if case.with_samp:
            inputs["sampling_per_token_logps"] = fx.samp[sl]
        loss = tr._compute_loss(tr.model, inputs)
        loss.backward()
        total += loss.item()
    # TRL's log(): the mean of the values appended per _compute_loss call (NaN ignored)
    metrics = {k: sum(x for x in v if not math.isnan(x)) / max(1, sum(not math.isnan(x) for x in v))
               for k, v in tr._metrics["train"].items() if v}
    return total, fx.grads(tr.model), metrics


class _OneProcess:
    num_processes = 1
    process_index = 0
    device = torch.device("cpu")


def _our_side(fx: Fixture, case: Case) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.objectives.grpo import GRPOObjective
    from launchgen.trainers.stats import StepStats, reduce_step

    cfg = TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": fx.out, "model": {"name_or_path": fx.model_dir}, "data": {"path": "x.jsonl"},
        "per_device_train_batch_size": 4 // case.ga, "gradient_accumulation_steps": case.ga,
        "num_generations": 4, "beta": case.beta, "epsilon": 0.2,
        "epsilon_high": 0.28, "generation": {"temperature": fx.temperature, "max_completion_length": 10},
        **case.opts,
    })
    obj = GRPOObjective(cfg, 1)
    obj._accelerator = _OneProcess()
    fx.mine.zero_grad()
    stats = StepStats()
    for i, sl in enumerate(_rows(fx, case)):
        if i:
            stats.next_micro_batch()  # as the loop does between micro-batches
        mb: dict[str, Any] = {k: v[sl] for k, v in fx.batch.items()}
        mb.update(num_items_in_batch=fx.batch["completion_mask"].sum(), old_logps=fx.old[sl])
        if case.beta:
            mb["ref_logps"] = fx.ref[sl]
        if case.with_is:
            mb["is_ratio"] = fx.isr[sl]
        if case.with_samp:
            mb["sampling_logps"] = fx.samp[sl]
        loss = obj.loss(fx.mine, mb, stats)
        loss.backward()
        stats.loss = stats.loss + loss.detach()
    metrics = reduce_step(stats, _OneProcess(), lambda t: t, obj.always_extremes)
    total = float(metrics.pop("loss"))
    return total, fx.grads(fx.mine), metrics


def _metric_diff(trl: dict[str, float], ours: dict[str, float]) -> tuple[float, list[str]]:
    missing = sorted(set(trl) - set(ours))
    extra = sorted(set(ours) - set(trl) - _OURS_ONLY)
    worst = 0.0
    for k in set(trl) & set(ours):
        a, b = trl[k], ours[k]
        if math.isnan(a) and math.isnan(b):
            continue
        worst = max(worst, abs(a - b) / max(1.0, abs(a)))
    problems = [f"missing {k}" for k in missing] + [f"not in TRL {k}" for k in extra]
    return worst, problems


def run(fx: Fixture) -> tuple[float, float, int]:
    """Every case; prints one line each. Returns (worst gradient rel. diff, worst metric diff, failed cases)."""
    worst_g = worst_m = 0.0
    bad = 0
    for case in cases():
        l_trl, g_trl, m_trl = _trl_side(fx, case)
        l_me, g_me, m_me = _our_side(fx, case)
        gd = fx.rel(g_trl, g_me)
        md, problems = _metric_diff(m_trl, m_me)
        ld = abs(l_trl - l_me) / max(1e-6, abs(l_trl))
        ok = gd < 1e-5 and md < 1e-5 and ld < 1e-5 and not problems
        bad += not ok
        worst_g, worst_m = max(worst_g, gd), max(worst_m, md)
        print(f"{'PASS' if ok else 'FAIL'} {case.name:26s} ga={case.ga} beta={case.beta} is={case.with_is!s:5} "
              f"samp={case.with_samp!s:5} loss trl={l_trl:+.8f} ours={l_me:+.8f} grad rel={gd:.1e} "
              f"metrics {len(m_trl)} worst={md:.1e} {' '.join(problems)}")
    return worst_g, worst_m, bad
