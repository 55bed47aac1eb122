"""What the loop asks of a trainer: the `Objective` protocol, and the pieces the online-RL objectives share.

An objective says what it needs (a reference model; for the RL ones, generation-time log-probs, the
importance-sampling correction, the temperature log-probs are scored at), how its batches are prepared (its
`make_source`: a rollout for the RL objectives, tokenized examples for SFT; an RL objective also turns a scored
rollout into its training rows in `prepare`), its loss and the share of it a forward pass carries, and its
metrics (through `StepStats` and the rollout's `metrics`). The loop (`core.Trainer`) never tests a trainer's name.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.stats import Stat, StepStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from launchgen.trainers.data import PromptSampler
    from launchgen.trainers.declarations.capabilities import Capabilities
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation.protocol import GenerationBackend
    from launchgen.trainers.passes import RowLayout

Batch = dict[str, Any]


@dataclass(frozen=True)
class Geometry:
    """TRL's batch arithmetic (see core's docstring): per-process and global generation batch sizes."""

    G: int  # completions per prompt
    ga: int  # gradient_accumulation_steps
    spg: int  # steps_per_generation: micro-batches per generation batch
    B: int  # per_device_train_batch_size
    num_iterations: int
    num_processes: int

    @classmethod
    def from_config(cls, cfg: TrainerConfig, num_processes: int) -> Geometry:
        ga = cfg.gradient_accumulation_steps
        return cls(G=int(cfg.num_generations or 2), ga=ga, spg=int(cfg.steps_per_generation or ga),
                   B=cfg.per_device_train_batch_size, num_iterations=cfg.num_iterations, num_processes=num_processes)

    @property
    def local_gen(self) -> int:
        return self.B * self.spg

    @property
    def global_gen(self) -> int:
        return self.local_gen * self.num_processes

    @property
    def generate_every(self) -> int:
        """Micro-batches one generation batch is used for."""
        return self.spg * self.num_iterations


class BatchSource(Protocol):
    """Where the loop's "generation batch" (the next `steps_per_generation` micro-batches) comes from."""

    layout: RowLayout
    sampler: PromptSampler
    rows_per_batch: int  # data rows one `next_batches` draws (prompts, or sft's examples): num_train_epochs
    backend: GenerationBackend | None
    needs_weight_sync: bool
    #: Step metrics the progress bar shows (a rollout's only on steps that generated).
    progress_keys: tuple[str, ...]

    def after_tokenizer(self, tokenizer: Any) -> None:
        """Cheap checks that need the tokenizer, before the model loads."""

    def start(self, model: Any, ref_model: Any, compiled_layers: bool) -> None:
        """Called once the (prepared) models exist: a rollout creates its generation backend here."""

    def next_batches(self) -> tuple[list[Batch], dict[str, float]]: ...

    def state_dict(self) -> dict[str, Any]:
        """Saved in the checkpoint's trainer state (the sampler's position at least)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def weight_push(self, version: int) -> AbstractContextManager[None]:
        """Entered around each push of the weights after `version` optimizer steps (generation ahead of it
        is finished or paused first)."""
        ...

    def close(self) -> None:
        """Stop what the source runs besides its backend (a generate-ahead thread)."""


class Objective(Protocol):
    #: The trainer's config class (its declaration: name, defaults, facts); `name` is its `trainer_name`.
    config_class: type[TrainerConfig]
    name: str
    cfg: TrainerConfig
    geometry: Geometry
    #: Rows kept together by the shuffle and the forward passes (Online DPO: a chosen/rejected pair).
    pair_size: int
    needs_reference: bool
    #: `clip_ratio/*` extremes every rank records, so every rank gathers them (the others only where present).
    always_extremes: tuple[str, ...]

    def validate(self) -> None:
        """Cross-field checks that need the process count; messages name the fields and the fix."""

    def make_source(self, accelerator: Any) -> BatchSource:
        """Loads the cheap, user-fixable inputs (data, reward functions) so their errors come before the model."""
        ...

    def loss(self, model: Any, mb: Batch, stats: StepStats) -> torch.Tensor:
        """The micro-batch's (or pass's) loss, already divided as TRL's Trainer divides it before backward."""
        ...

    def loss_share(self, part: Batch, mb: Batch) -> Stat:
        """What a pass's loss is multiplied by so the passes' gradients add up to the micro-batch's."""
        ...

    def end_step(self) -> dict[str, float]:
        """Called once per optimizer step, after it: state the objective updates per step (GRPO's adaptive entropy
        controller) and the metrics that state logs."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The objective's own state for a checkpoint (JSON values)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict` from a checkpoint's trainer state (keys it does not know are ignored)."""
        ...


class NoStepState:
    """The `Objective` methods of an objective with no state of its own across optimizer steps."""

    def end_step(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass
class ScoredRollout:
    """A generation batch after scoring, as an `RLObjective.prepare` sees it (this process's rows in `t`)."""

    t: Batch  # per-row tensors of this process's completions; prepare adds its training columns
    rewards: torch.Tensor  # combined rewards of the whole generation batch (all processes)
    old: torch.Tensor | None  # this process's generation-time policy log-probs
    ref: torch.Tensor | None  # and the reference model's
    mask: torch.Tensor  # completion mask
    truncated_all: torch.Tensor  # 1.0 where a completion (of any process) hit max_completion_length
    rank: int
    metrics: dict[str, float]
    accelerator: Any
    gather: Callable[[torch.Tensor], torch.Tensor]
    rewards_per_func: torch.Tensor  # (N, K) every reward function's score (all processes), NaN where it gave None
    reward_weights: torch.Tensor  # (K,)

    @property
    def local(self) -> slice:
        n = self.mask.size(0)
        return slice(self.rank * n, (self.rank + 1) * n)


class RLObjective(Objective, Protocol):
    keeps_old_logps: bool
    uses_importance_sampling: bool
    #: Keep the sampler's own per-token log-probs as `sampling_logps` (GRPO's off-policy mask reads them).
    keeps_sampling_logps: bool
    #: Temperature the policy's log-probs are scored at.
    logp_temperature: float

    def prepare(self, batch: ScoredRollout) -> torch.Tensor | None:
        """Adds the objective's columns (advantages, ...) to `batch.t`; returns the per-group zero-std flags
        behind `frac_reward_zero_std`, or None when the objective logs its own."""
        ...


def validate_rollout(geometry: Geometry) -> None:
    """A generation batch must hold whole groups of num_generations completions."""
    if geometry.global_gen % geometry.G:
        raise TrainerSetupError(
            f"generation batch = per_device_train_batch_size ({geometry.B}) x processes ({geometry.num_processes}) "
            f"x steps_per_generation ({geometry.spg}) = {geometry.global_gen} completions, not divisible by "
            f"num_generations ({geometry.G}): change per_device_train_batch_size, steps_per_generation or "
            "num_generations"
        )


def clip_range(cfg: TrainerConfig) -> tuple[float, float]:
    """(epsilon_low, epsilon_high) of the clipped ratio; epsilon_high defaults to epsilon."""
    return cfg.epsilon, float(cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon)


def uses_separate_engine(caps: Capabilities) -> bool:
    """The sampler is not the policy: its log-probs can differ from the trainer's (what IS corrects)."""
    return not caps.shares_policy_weights


def policy_logps_entropy(
    model: Any, mb: Batch, temperature: float, stats: StepStats, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the completions under the policy (with gradient), their entropies (with gradient
    only when `entropy_grad`) and the float mask; logs the entropy."""
    from launchgen.trainers.modeling import per_token_logps

    mask = mb["completion_mask"]
    logps, entropy = per_token_logps(model, mb["prompt_ids"], mb["prompt_mask"], mb["completion_ids"], mask,
                                     temperature, entropy_grad)
    m = mask.float()
    stats.add("entropy_sum", (entropy.detach() * m).sum())
    stats.add("entropy_count", m.sum())
    return logps, entropy, m


def policy_logps(model: Any, mb: Batch, temperature: float, stats: StepStats) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of the completions under the policy (with gradient) and the float mask; logs entropy."""
    logps, _, m = policy_logps_entropy(model, mb, temperature, stats)
    return logps, m


def row_share(part: Batch, mb: Batch) -> Stat:
    """A pass's share of a loss that is a mean over rows (or pairs)."""
    return int(part["completion_ids"].size(0)) / int(mb["completion_ids"].size(0))


def clip_counts(ratio: torch.Tensor, adv: torch.Tensor, eps_lo: float, eps_hi: float, stats: StepStats) -> None:
    """Sequence-level clip statistics (RLOO's ratio is one per row); low_min / high_max are TRL's nanmin / nanmax
    of the per-sequence flags (1 only when every sequence of the micro-batch was clipped on that side)."""
    low = ((ratio < 1 - eps_lo) & (adv < 0)).float()
    high = ((ratio > 1 + eps_hi) & (adv > 0)).float()
    stats.add("clip_low_sum", low.sum())
    stats.add("clip_high_sum", high.sum())
    stats.add("clip_region_sum", torch.maximum(low, high).sum())
    stats.add("clip_count", float(ratio.numel()))
    if ratio.numel():
        stats.min("clip_ratio/low_min", low.min())
        stats.max("clip_ratio/high_max", high.max())
