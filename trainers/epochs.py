"""`num_train_epochs`: the step count of a number of passes over the data, and where a pass ends.

An epoch is a pass over the data's rows in the sampler's order (prompts for the online trainers, examples for
sft), counted as rows are drawn: one generation batch draws `rows_per_batch` rows and serves
`spg * num_iterations` micro-batches, an optimizer step takes `gradient_accumulation_steps` of them.
"""

from __future__ import annotations

import math
from typing import Any


def steps_for(num_epochs: float, n_rows: int, rows_per_batch: int, geometry: Any) -> int:
    """ceil(epochs x rows / rows per optimizer step), at least 1."""
    rows_per_step = rows_per_batch * geometry.ga / geometry.generate_every
    # round() first: 0.1 * 30 is 3.0000000000000004 in floating point, which must not become 4 steps
    return max(1, math.ceil(round(num_epochs * n_rows / rows_per_step, 9)))


def completed(sampler: Any) -> int:
    """Whole passes over the data drawn so far (the sampler turns its epoch only at the next draw)."""
    return int(sampler.epoch + sampler.index // max(1, sampler.n))
