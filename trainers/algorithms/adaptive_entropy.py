"""GRPOConfig's `use_adaptive_entropy` (Skywork-OR1's entropy controller), as TRL 1.16's GRPOTrainer runs it.

Each optimizer step's micro-batches add their entropy sums and token counts (over the tokens the loss acts on) to
a window; at the step's end the window is summed over processes into the step's world entropy, and the coefficient
moves by `entropy_coef_delta` towards more bonus when that entropy is at or below `entropy_target`, towards less
otherwise, inside [`entropy_coef_min`, `entropy_coef_max`]. The bonus a micro-batch applies is decided by the
previous step's world entropy (none before the first measurement), so every micro-batch of a step applies the same
one. The coefficient and the last world entropy are part of a checkpoint, so a resumed run continues the controller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AdaptiveEntropy:
    coef: float
    target: float
    delta: float
    coef_min: float
    coef_max: float
    #: the previous optimizer step's world entropy; inf until one is measured, so the first step applies no bonus
    last_world_entropy: float = math.inf
    _window: torch.Tensor | None = field(default=None, repr=False)

    def applied_coef(self) -> float:
        """The coefficient this step's micro-batches multiply the entropy bonus by."""
        return self.coef if self.last_world_entropy <= self.target else 0.0

    def add(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        """One micro-batch's (or pass's) entropies over the tokens the loss acts on."""
        m = mask.to(entropy.dtype)
        stats = torch.stack([(entropy.detach() * m).sum(), m.sum()]).to(torch.float64)
        self._window = stats if self._window is None else self._window + stats

    def end_step(self, reduce_sum: Any) -> float:
        """At the optimizer step's end: the window's world entropy (`reduce_sum` sums a tensor over processes)
        moves the coefficient for the next step; returns the new coefficient."""
        if self._window is not None:
            total = reduce_sum(self._window)
            world = float(total[0] / total[1].clamp(min=1.0))
            if world <= self.target:
                self.coef = min(self.coef + self.delta, self.coef_max)
            else:
                self.coef = max(self.coef - self.delta, self.coef_min)
            self.last_world_entropy = world
            self._window = None
        return self.coef

    def state_dict(self) -> dict[str, Any]:
        last = self.last_world_entropy
        return {"entropy_coef": self.coef, "last_world_entropy": None if math.isinf(last) else last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "entropy_coef" in state:
            self.coef = float(state["entropy_coef"])
            last = state.get("last_world_entropy")
            self.last_world_entropy = math.inf if last is None else float(last)
