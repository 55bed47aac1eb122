"""The one piece of torch dynamo's process-wide config the trainers rely on: the per-code-object recompile limit.

torch's config module answers `delattr` (what `unittest.mock.patch` and pytest's monkeypatch undo do when they
believe a setting was absent) by *hiding* the setting; from then on every compile in the process raises
`AttributeError: torch._dynamo.config.recompile_limit does not exist`. Code that ran before training (a user's
script, a test) can leave it so; `recompile_limit_name()` finds the hidden setting, restores its default with a
warning, and so compilation is neither lost silently nor turned into a crash.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)

#: `recompile_limit` from torch 2.7, `cache_size_limit` before (the trainers support torch >= 2.6).
_NAMES = ("recompile_limit", "cache_size_limit")


def _config() -> Any:
    try:
        import torch._dynamo.config as dynamo_config
    except Exception:  # no dynamo: nothing is compiled either
        return None
    return dynamo_config


def recompile_limit_name() -> str | None:
    """Name of dynamo's recompile limit in this torch, made readable again if earlier code hid it; None without
    dynamo."""
    cfg = _config()
    if cfg is None:
        return None
    for name in _NAMES:
        if isinstance(getattr(cfg, name, None), int):
            return name
    entries = getattr(cfg, "_config", {})  # torch's registry of settings, hidden ones included
    for name in _NAMES:
        default = getattr(entries.get(name), "default", None)
        if isinstance(default, int):
            log.warning("torch._dynamo.config.%s had been deleted (hidden) by earlier code in this process; "
                        "restored to its default %d so that torch.compile works", name, default)
            setattr(cfg, name, default)  # setting it un-hides it
            return name
    return None


def raise_recompile_limit(at_least: int) -> None:
    """Raise the process-wide limit to `at_least` (never lower it: the user may have raised it further)."""
    name = recompile_limit_name()
    if name is not None:
        cfg = _config()
        setattr(cfg, name, max(int(getattr(cfg, name)), at_least))


def recompile_limit_raised(at_least: int) -> contextlib.AbstractContextManager[Any]:
    """The limit raised to `at_least` for the duration of a block only (torch without
    `torch.compile(recompile_limit=)`); restored exactly afterwards by dynamo's own `patch`."""
    name = recompile_limit_name()
    if name is None:
        return contextlib.nullcontext()
    cfg = _config()
    patched: contextlib.AbstractContextManager[Any] = cfg.patch({name: max(int(getattr(cfg, name)), at_least)})
    return patched
