"""Dynamo's recompile budget for the compiled decode functions, and the no-compile stance during graph capture."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: Compiled variants allowed per compiled function: one per (batch, cache capacity, length bucket) seen, which a
#: training run with varying prompt lengths can push past dynamo's default of 8.
_RECOMPILE_LIMIT = 64


def _no_recompile() -> contextlib.AbstractContextManager[Any]:
    """Make a would-be compile during graph capture raise (caught, falls back) instead of compiling there."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        return contextlib.nullcontext()
    try:
        ctx: contextlib.AbstractContextManager[Any] = set_stance("fail_on_recompile")
    except Exception:
        return contextlib.nullcontext()
    return ctx
