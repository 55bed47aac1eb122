"""Process-wide state a test may change, put back exactly after each test (the autouse fixture in conftest).

The suite runs in random order (pytest-randomly); a test that leaves the environment, a signal handler, torch's
default dtype or grad mode, dynamo's config or accelerate's singletons changed would make a later test's result depend on the order.
Changed values are restored; a dynamo setting that a test *hid* (torch's config module answers `delattr`, e.g.
from monkeypatch's undo, by hiding the setting, and every later compile then fails) also fails that test, since
it is always a bug in the test.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

_SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                             signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE))


def _dynamo() -> Any:
    return sys.modules.get("torch._dynamo.config")  # never imports torch for tests that do not


def _torch() -> Any:
    return sys.modules.get("torch")


@contextmanager
def restored_process_state() -> Iterator[None]:
    env = dict(os.environ)
    cwd = os.getcwd()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    dyn = _dynamo()
    dyn_before = dyn.get_config_copy() if dyn is not None else None
    torch = _torch()
    torch_before = (torch.get_default_dtype(), torch.is_grad_enabled()) if torch is not None else None
    accelerate_fresh = not _accelerate_initialized()
    yield
    problems: list[str] = []
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
    if os.getcwd() != cwd:
        os.chdir(cwd)
    for s, h in handlers.items():
        if signal.getsignal(s) is not h and h is not None:
            signal.signal(s, h)
    dyn = _dynamo()
    if dyn is not None:
        hidden = [n for n in dyn.get_config_copy() if not _readable(dyn, n)]
        if hidden:
            problems.append(f"torch._dynamo.config setting(s) {hidden} were deleted (hidden); change them with "
                            "torch._dynamo.config.patch(...), not monkeypatch/mock.patch")
        if dyn_before is not None:
            now = dyn.get_config_copy()
            for name, value in dyn_before.items():
                if name in hidden or now.get(name) != value:
                    setattr(dyn, name, value)
    torch = _torch()
    if torch is not None and torch_before is not None:
        torch.set_default_dtype(torch_before[0])
        torch.set_grad_enabled(torch_before[1])
    if accelerate_fresh and _accelerate_initialized():
        # accelerate keeps process-wide singletons; one left half-built (PartialState without AcceleratorState,
        # e.g. by set_seed outside an Accelerator) breaks every later Accelerator() in the process
        sys.modules["accelerate.state"].AcceleratorState._reset_state(True)
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


def _accelerate_initialized() -> bool:
    state = sys.modules.get("accelerate.state")
    return state is not None and bool(state.PartialState._shared_state or state.AcceleratorState._shared_state)


def _readable(cfg: Any, name: str) -> bool:
    with warnings.catch_warnings():  # reading a deprecated setting warns; only its presence matters here
        warnings.simplefilter("ignore")
        try:
            getattr(cfg, name)
        except AttributeError:
            return False
    return True
