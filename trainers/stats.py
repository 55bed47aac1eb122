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
    """Per-optimizer-step accumulators (local), reduced over processes when logged.

    The loop starts a new frame per micro-batch (`next_micro_batch`; a micro-batch's passes share one): each
    metric is computed per micro-batch over all processes, then averaged over the step's micro-batches, as TRL
    logs one value per `compute_loss` call and averages them. `sums`, `mins` and `maxs` are the current frame's.
    """

    loss: Stat = 0.0
    sums: dict[str, Stat] = field(default_factory=dict)
    mins: dict[str, torch.Tensor] = field(default_factory=dict)
    maxs: dict[str, torch.Tensor] = field(default_factory=dict)
    done: list[tuple[dict[str, Stat], dict[str, torch.Tensor], dict[str, torch.Tensor]]] = field(default_factory=list)

    def next_micro_batch(self) -> None:
        self.done.append((self.sums, self.mins, self.maxs))
        self.sums, self.mins, self.maxs = {}, {}, {}

    def frames(self) -> list[tuple[dict[str, Stat], dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
        return [*self.done, (self.sums, self.mins, self.maxs)]

    def add(self, key: str, value: Stat) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + _detached(value)

    def add_mean(self, name: str, total: Stat, count: Stat) -> None:
        """Logged as `name` = sum of totals / sum of counts over the micro-batch and all processes (then averaged
        over the step's micro-batches)."""
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


def _frame_means(per_frame: list[dict[str, float]]) -> dict[str, float]:
    """Each metric per frame (micro-batch), then the mean over the frames that have it (NaN ignored)."""
    values: dict[str, list[float]] = {}
    for summed in per_frame:
        for name, num, den in RATIOS:
            if num in summed and den in summed:
                values.setdefault(name, []).append(summed[num] / max(summed[den], 1.0))  # TRL clamps at 1
        for key in summed:
            if key.startswith("mean:") and key.endswith(":sum"):
                name = key[len("mean:") : -len(":sum")]
                count = summed.get(f"mean:{name}:n", 0.0)
                values.setdefault(name, []).append(summed[key] / count if count > 0 else math.nan)
    return {name: mean_ignoring_nan(v) for name, v in values.items()}


def reduce_step(
    stats: StepStats, accelerator: Any, gather: Callable[[torch.Tensor], torch.Tensor], always_extremes: Iterable[str]
) -> dict[str, float]:
    """The step's metrics over all processes: one reduce of every frame's sums, one gather per extreme.

    An extreme is gathered when this process recorded it or when it is in `always_extremes` (keys the objective
    records on every rank), so every process takes the same collectives (every rank has the same frames: GA).
    """
    frames = stats.frames()
    keys = sorted(set().union(*(f[0] for f in frames)))
    dev = accelerator.device
    nan = torch.tensor(math.nan, dtype=torch.float64, device=dev)
    # A key absent from a frame is NaN here, so the reduced sum tells "absent everywhere" (NaN) from zero.
    cells = [as_f64(f[0][k], dev) if k in f[0] else nan for f in frames for k in keys]
    vals = torch.stack([as_f64(stats.loss, dev), *cells]) if cells else as_f64(stats.loss, dev).reshape(1)
    if accelerator.num_processes > 1:
        present = (~torch.isnan(vals)).to(torch.float64)
        both = accelerator.reduce(torch.stack([torch.nan_to_num(vals, nan=0.0), present]), reduction="sum")
        vals = torch.where(both[1] > 0, both[0], nan)
    flat = vals[1:].tolist()
    per_frame = [
        {k: v for k, v in zip(keys, flat[i * len(keys) : (i + 1) * len(keys)], strict=True) if not math.isnan(v)}
        for i in range(len(frames))
    ]
    out: dict[str, float] = {"loss": vals[0].item() / accelerator.num_processes}
    tokens = [f[STEP_TOKENS] for f in per_frame if STEP_TOKENS in f]
    if tokens:
        out[STEP_TOKENS] = sum(tokens)
    out.update(_frame_means(per_frame))
    always = set(always_extremes)
    for key, red in EXTREMES:
        stores = [f[1] if red == "min" else f[2] for f in frames]
        if not (key in always or any(key in st for st in stores)):
            continue
        local = torch.stack([as_f64(st.get(key, math.nan), dev) for st in stores])
        allv = gather(local).view(-1, len(frames))  # (processes, frames)
        fill = math.inf if red == "min" else -math.inf
        ext = torch.nan_to_num(allv, nan=fill)
        ext = ext.min(0).values if red == "min" else ext.max(0).values
        per = [v for v in ext.tolist() if math.isfinite(v)]
        if per:
            out[key] = sum(per) / len(per)  # TRL: the mean over micro-batches of each one's nanmin / nanmax
    return out
