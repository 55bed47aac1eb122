"""`max_tokens_per_forward`: a micro-batch cut into forward/backward passes whose gradients add up to its own.

The batch's source owns its row layout (`RowLayout`: which columns are right-padded and may be trimmed per pass);
the objective owns how many rows stay together (Online DPO: a pair) and each pass's share of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from launchgen.trainers.stats import Stat

Batch = dict[str, Any]


@dataclass(frozen=True)
class RowLayout:
    """Where a micro-batch's rows, widths and trimmable (right-padded) columns are."""

    ids_key: str  # (rows, trimmable width) token ids
    mask_key: str  # its 0/1 mask: a row's length is its sum
    trim_keys: tuple[str, ...]  # per-row tensors aligned with the trimmable columns
    fixed_key: str | None = None  # (rows, width) columns kept whole (left-padded prompts)
    fixed_mask_key: str | None = None  # the 0/1 mask of `fixed_key`

    def tokens(self, mb: Batch) -> Stat:
        """Real (unpadded) tokens of the micro-batch, as a device scalar (no host sync)."""
        n = mb[self.mask_key].sum()
        return n + mb[self.fixed_mask_key].sum() if self.fixed_mask_key else n

    def rows(self, mb: Batch) -> int:
        return int(mb[self.ids_key].size(0))

    def trim_width(self, mb: Batch) -> int:
        return int(mb[self.ids_key].size(1))

    def width(self, mb: Batch) -> int:
        fixed = int(mb[self.fixed_key].size(1)) if self.fixed_key else 0
        return fixed + self.trim_width(mb)


def rows_per_pass(limit: int | None, width: int, rows: int) -> int:
    """Rows of `width` tokens one forward pass may take under `max_tokens_per_forward` (at least one)."""
    if limit is None:
        return rows
    return max(1, min(rows, limit // max(1, width)))


def _pack(lengths: list[int], rows: int, unit: int, fixed: int, limit: int) -> list[list[int]]:
    """Units of rows sorted longest first (stable), packed greedily into passes of at most `limit` tokens."""
    units = [list(range(i, min(i + unit, rows))) for i in range(0, rows, unit)]
    units.sort(key=lambda u: -max(lengths[r] for r in u))
    groups: list[list[int]] = []
    width = 0
    for u in units:
        u_width = fixed + max(1, max(lengths[r] for r in u))
        if groups and (len(groups[-1]) + len(u)) * width <= limit:
            groups[-1].extend(u)
        else:
            groups.append(list(u))
            width = u_width  # the first unit of a pass is its widest
    return groups


def _split_to(groups: list[list[int]], count: int, unit: int) -> list[list[int]]:
    """`groups` with the largest ones halved (at a unit boundary) until there are `count`: more, smaller passes
    are always within the token limit. Possible whenever `count` is at most the number of units."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        g = groups[i]
        cut = (len(g) + unit - 1) // unit // 2 * unit
        if cut == 0:
            raise ValueError(f"cannot cut {len(groups)} passes into {count}: too few rows")
        groups[i:i + 1] = [g[:cut], g[cut:]]
    return groups


def split_passes(
    mb: Batch, limit: int | None, layout: RowLayout, unit: int, share: Callable[[Batch, Batch], Stat],
    agree: Callable[[int], int] | None = None,
) -> list[tuple[Batch, Stat]]:
    """The micro-batch as passes of at most `limit` tokens, each with the factor (`share(part, mb)`) that turns its
    loss (normalised over the pass) into its share of the micro-batch's loss, so the summed gradient is the
    micro-batch's.

    Rows (`unit` at a time: a pair never spans passes) are sorted by length, longest first, and packed greedily;
    each pass drops the right padding beyond its longest row (causal attention: the kept positions compute exactly
    what they did with it). Scalars are kept as they are.

    `agree` (sharded parameters: FSDP): given this rank's pass count, the count every rank must run (the max over
    ranks). Each forward pass all-gathers the layers' parameters, a collective, so a rank with fewer passes than
    another would leave it waiting forever; a rank below the agreed count cuts its largest passes in two. Every
    rank has the same rows per micro-batch, so the count never exceeds what a rank can cut to.
    """
    rows = layout.rows(mb)
    if limit is None:
        return [(mb, 1.0)]
    whole = rows * layout.width(mb) <= limit
    if whole and agree is None:
        return [(mb, 1.0)]
    row_lengths = mb[layout.mask_key].sum(1)
    lengths = row_lengths.tolist()  # one host sync per micro-batch, only when passes are on
    fixed = layout.width(mb) - layout.trim_width(mb)
    groups = [list(range(rows))] if whole else _pack(lengths, rows, unit, fixed, limit)
    if agree is not None:
        count = agree(len(groups))
        if count == 1:
            return [(mb, 1.0)]
        groups = _split_to(groups, count, unit)
    parts: list[tuple[Batch, Stat]] = []
    for g in groups:
        idx = torch.tensor(sorted(g), dtype=torch.long, device=row_lengths.device)
        keep = max(1, max(lengths[r] for r in g))
        part: Batch = {}
        for k, v in mb.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                v = v.index_select(0, idx)
                if k in layout.trim_keys and v.dim() == 2:
                    v = v[:, :keep]
            part[k] = v
        parts.append((part, share(part, mb)))
    return parts
