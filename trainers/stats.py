"""Per-optimizer-step statistics: device-side accumulators, reduced over processes once per step.

Objectives add sums (`add`, `add_mean`) and running extremes (`min`, `max`) per micro-batch or pass; the loop
turns them into the logged metrics with `reduce_step`. Values may be device tensors: they are summed on the
device and read back once per optimizer step, so a micro-batch costs no host round trip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

Stat = float | torch.Tensor

#: Logged ratio metrics: name, numerator sum, denominator sum (each present only when an objective adds it).
RATIOS = (
    ("entropy", "entropy_sum", "entropy_count"),
    ("kl", "kl_sum", "kl_count"),
    ("clip_ratio/low_mean", "clip_low_sum", "clip_count"),
    ("clip_ratio/high_mean", "clip_high_sum", "clip_count"),
    ("clip_ratio/region_mean", "clip_region_sum", "clip_count"),
)
#: A sum the loop reads back and does not log: real tokens trained on in the step, all processes (tokens/s).
STEP_TOKENS = "step_tokens"
#: Logged extremes: key, reduction over processes.
EXTREMES = (("clip_ratio/low_min", "min"), ("clip_ratio/high_max", "max"))


def _detached(value: Stat) -> Stat:
    return value.detach().to(torch.float64) if isinstance(value, torch.Tensor) else value


def _extreme(prev: torch.Tensor | None, value: Stat, take_min: bool) -> torch.Tensor:
    """NaN-ignoring running min/max as a float64 tensor on the value's device (no host sync per micro-batch);
    non-finite values count as missing, and a key that only ever saw missing values reduces to nothing."""
    v = torch.as_tensor(_detached(value), dtype=torch.float64).reshape(())
    v = torch.where(torch.isfinite(v), v, torch.full_like(v, math.nan))
    if prev is None:
        return v
    p = prev.to(v.device)
    return torch.fmin(p, v) if take_min else torch.fmax(p, v)


@dataclass
class StepStats:
    """Per-optimizer-step accumulators (local), reduced over processes when logged."""

    loss: Stat = 0.0
    sums: dict[str, Stat] = field(default_factory=dict)
    mins: dict[str, torch.Tensor] = field(default_factory=dict)
    maxs: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, key: str, value: Stat) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + _detached(value)

    def add_mean(self, name: str, total: Stat, count: Stat) -> None:
        """Logged as `name` = sum of totals / sum of counts over the step's micro-batches and all processes."""
        self.add(f"mean:{name}:sum", total)
        self.add(f"mean:{name}:n", count)

    def min(self, key: str, value: Stat) -> None:
        self.mins[key] = _extreme(self.mins.get(key), value, take_min=True)

    def max(self, key: str, value: Stat) -> None:
        self.maxs[key] = _extreme(self.maxs.get(key), value, take_min=False)


def as_f64(value: Stat, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64).to(device).reshape(())


def mean_ignoring_nan(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


#: Running totals: a logging window reports the latest value, not the mean of its steps (TRL replaces, not appends).
LATEST_KEYS = frozenset({"num_tokens"})


def window_value(key: str, values: list[float]) -> float:
    """What a logging window reports for `key` from its steps' values (as TRL: the mean, NaN ignored)."""
    return values[-1] if key in LATEST_KEYS and values else mean_ignoring_nan(values)


def reduce_step(
    stats: StepStats, accelerator: Any, gather: Callable[[torch.Tensor], torch.Tensor], always_extremes: Iterable[str]
) -> dict[str, float]:
    """The step's metrics over all processes: one reduce of every sum, one gather per extreme.

    An extreme is gathered when this process recorded it or when it is in `always_extremes` (keys the objective
    records on every rank), so every process takes the same collectives.
    """
    keys = sorted(stats.sums)
    dev = accelerator.device
    vals = torch.stack([as_f64(stats.loss, dev)] + [as_f64(stats.sums[k], dev) for k in keys])
    if accelerator.num_processes > 1:
        vals = accelerator.reduce(vals, reduction="sum")
    summed = dict(zip(keys, vals[1:].tolist(), strict=True))
    out: dict[str, float] = {"loss": vals[0].item() / accelerator.num_processes}
    if STEP_TOKENS in summed:
        out[STEP_TOKENS] = summed[STEP_TOKENS]
    for name, num, den in RATIOS:
        if num in summed and den in summed:
            out[name] = summed[num] / max(summed[den], 1.0)
    for key in keys:
        if key.startswith("mean:") and key.endswith(":sum"):
            name = key[len("mean:") : -len(":sum")]
            count = summed.get(f"mean:{name}:n", 0.0)
            out[name] = summed[key] / count if count > 0 else math.nan
    always = set(always_extremes)
    for key, red in EXTREMES:
        store = stats.mins if red == "min" else stats.maxs
        if key in store or key in always:
            allv = gather(as_f64(store.get(key, math.nan), dev).reshape(1))
            allv = allv[~torch.isnan(allv)]
            if allv.numel():
                out[key] = (allv.min() if red == "min" else allv.max()).item()
    return out
