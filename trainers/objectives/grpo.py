"""GRPO (TRL 1.16's GRPOTrainer): group-normalised advantages, clipped token ratios, optional k3 KL, four loss
normalisers, the vLLM importance-sampling correction, and Liger's fused loss when asked for."""

from __future__ import annotations

from typing import Any

import torch
from launchgen.trainers.algorithms import grpo as grpo_alg
from launchgen.trainers.config import TrainerConfig
from launchgen.trainers.errors import TrainerSetupError
from launchgen.trainers.generation.backends import capabilities
from launchgen.trainers.objectives import base
from launchgen.trainers.stats import Stat, StepStats


def keeps_old_logps(use_is: bool, ga: int, spg: int, num_iterations: int) -> bool:
    """TRL's rule: omit generation-time policy log-probs when the batch is consumed within one optimizer step and
    IS is off (the policy cannot have changed, so the ratio is exp(l - l.detach()))."""
    return use_is or ga % (spg * num_iterations) != 0


class GRPOObjective:
    name = "grpo"
    pair_size = 1
    supports_liger = True

    def __init__(self, cfg: TrainerConfig, num_processes: int) -> None:
        self.cfg = cfg
        self.geometry = base.Geometry.from_config(cfg, num_processes)
        self.caps = capabilities(cfg)
        self.beta = float(cfg.beta or 0.0)
        self.eps_lo, self.eps_hi = base.clip_range(cfg)
        isc = cfg.generation.importance_sampling
        self.uses_importance_sampling = base.uses_separate_engine(self.caps) and isc.enabled
        g = self.geometry
        self.keeps_old_logps = keeps_old_logps(self.uses_importance_sampling, g.ga, g.spg, cfg.num_iterations)
        self.needs_reference = self.beta != 0.0
        self.logp_temperature = cfg.generation.temperature
        self.use_liger = cfg.model.use_liger_kernel and cfg.model.liger_grpo_loss
        self.always_extremes: tuple[str, ...] = () if self.use_liger else ("clip_ratio/low_min", "clip_ratio/high_max")
        self._liger_loss: Any = None

    def validate(self) -> None:
        base.validate_rollout(self.geometry)
        if self.uses_importance_sampling and not self.caps.returns_logprobs:
            raise TrainerSetupError(
                f"generation.importance_sampling.enabled needs per-token log-probs, which generation.backend "
                f"{self.cfg.generation.backend} does not return: disable the correction"
            )

    def make_source(self, accelerator: Any) -> base.BatchSource:
        return base.make_rollout(self, accelerator)

    def prepare(self, batch: base.ScoredRollout) -> torch.Tensor:
        adv = grpo_alg.grpo_advantages(batch.rewards, self.geometry.G, self.cfg.scale_rewards)
        batch.t["advantages"] = adv.advantages[batch.local]
        return adv.std_is_zero

    def loss_share(self, part: base.Batch, mb: base.Batch) -> Stat:
        """Follows the normaliser (see grpo.normalize_loss)."""
        if self.cfg.loss_type == "dapo":
            return 1.0  # normalised by the whole generation batch's token count already
        if self.cfg.loss_type == "bnpo":
            return part["completion_mask"].sum().float() / mb["completion_mask"].sum().float().clamp(min=1.0)
        return base.row_share(part, mb)  # grpo / dr_grpo: per-sequence terms over rows

    def loss(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        if self.use_liger:
            return self._liger(model, mb, stats)
        cfg, g = self.cfg, self.geometry
        mask = mb["completion_mask"]
        adv = mb["advantages"]
        logps, m = base.policy_logps(model, mb, self.logp_temperature, stats)
        ptl = grpo_alg.grpo_per_token_loss(
            logps, adv, old_logps=mb.get("old_logps"), ref_logps=mb.get("ref_logps"), epsilon_low=self.eps_lo,
            epsilon_high=self.eps_hi, beta=self.beta, use_bias_correction_kl=cfg.use_bias_correction_kl,
            is_ratio=mb.get("is_ratio"),
        )
        loss = grpo_alg.normalize_loss(
            ptl.loss, mask, cfg.loss_type, gradient_accumulation_steps=g.ga,
            max_completion_length=cfg.generation.max_completion_length, num_items_in_batch=mb["num_items_in_batch"],
            num_processes=g.num_processes, steps_per_generation=g.spg,
        )
        if ptl.kl is not None:
            stats.add("kl_sum", (ptl.kl.detach() * m).sum())
            stats.add("kl_count", m.sum())
        cs = grpo_alg.clip_stats(ptl.ratio.detach(), adv, mask, self.eps_lo, self.eps_hi)
        stats.add("clip_low_sum", cs.low)
        stats.add("clip_high_sum", cs.high)
        stats.add("clip_region_sum", cs.region)
        stats.add("clip_count", cs.count)
        stats.min("clip_ratio/low_min", cs.low_seq_min)
        stats.max("clip_ratio/high_max", cs.high_seq_max)
        return loss

    def _liger(self, model: Any, mb: base.Batch, stats: StepStats) -> torch.Tensor:
        from launchgen.trainers.modeling import liger_grpo_loss, make_liger_grpo_loss

        if self._liger_loss is None:
            self._liger_loss = make_liger_grpo_loss(self.cfg)
        cfg, g = self.cfg, self.geometry
        mask = mb["completion_mask"]
        n_items = mb["num_items_in_batch"]
        loss, lmetrics = liger_grpo_loss(
            model, self._liger_loss, mb["prompt_ids"], mb["prompt_mask"], mb["completion_ids"], mask,
            advantages=mb.get("advantages"), ref_per_token_logps=mb.get("ref_logps"),
            old_per_token_logps=mb.get("old_logps"), vllm_is_ratio=mb.get("is_ratio"),
            # Liger divides by num_items / world_size; TRL's dapo also multiplies by GA / SPG.
            num_items_in_batch=(n_items * g.ga / g.spg) if cfg.loss_type == "dapo" else None,
        )
        if cfg.loss_type != "dapo":
            loss = loss / g.ga
        tokens = mask.sum().to(torch.float64)
        if self.beta != 0.0 and lmetrics:
            stats.add("kl_sum", lmetrics[0].detach().to(torch.float64) * tokens)
            stats.add("kl_count", tokens)
        if lmetrics:
            stats.add("clip_region_sum", lmetrics[-1].detach().to(torch.float64) * tokens)
            stats.add("clip_count", tokens)
        return loss
