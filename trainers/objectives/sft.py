"""SFT: token-level cross entropy over the step's trained tokens (data side: `launchgen.trainers.supervised`)."""

from __future__ import annotations

from typing import Any

import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.configs.sft import SFTConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.objectives.base import Batch, BatchSource, Geometry, NoStepState
from launchgen.trainers.stats import Stat, StepStats
from launchgen.trainers.supervised import ExampleSource, make_liger_ce_loss, sequence_nll


class SFTObjective(NoStepState):
    config_class = SFTConfig
    name = SFTConfig.trainer_name
    pair_size = 1
    needs_reference = False
    always_extremes: tuple[str, ...] = ()

    def __init__(self, cfg: TrainerConfig, num_processes: int) -> None:
        self.cfg = cfg
        self.geometry = Geometry.from_config(cfg, num_processes)
        self._liger: Any = None

    def validate(self) -> None:
        cfg = self.cfg
        if cfg.steps_per_generation not in (None, cfg.gradient_accumulation_steps) or cfg.num_iterations != 1:
            raise TrainerSetupError(
                "steps_per_generation and num_iterations are online-RL settings: leave them unset for sft"
            )

    def make_source(self, accelerator: Any) -> BatchSource:
        source = ExampleSource(self.cfg, accelerator, self.geometry)
        if self.cfg.model.use_liger_kernel:
            self._liger = make_liger_ce_loss()
        return source

    def loss_share(self, part: Batch, mb: Batch) -> Stat:
        return 1.0  # the loss is a token sum over the step's global token count: passes just add up

    def loss(self, model: Any, mb: Batch, stats: StepStats) -> torch.Tensor:
        nll, entropy = sequence_nll(model, mb["input_ids"], mb["attention_mask"], mb["loss_mask"], self._liger)
        m = mb["loss_mask"][:, 1:].float()
        if entropy is not None:
            stats.add_mean("entropy", (entropy * m).sum(), m.sum())
        # Divided by the step's trained tokens on all processes / n_proc: DDP's gradient mean makes it the global mean.
        return nll / (mb["num_items_in_batch"].to(nll.dtype) / self.geometry.num_processes)
