"""Reward functions for the CPU learning tests (imported by `module:function` name, as a user's would be)."""

from __future__ import annotations

from typing import Any

#: The token the toy task rewards; a single-character token in the tiny BPE vocabulary.
TARGET = "7"


def target_fraction(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Fraction of the completion's characters that are the target character (dense, so a tiny model learns fast)."""
    out: list[float | None] = []
    for c in completions:
        text = c if isinstance(c, str) else c[-1]["content"]
        out.append(text.count(TARGET) / max(1, len(text)))
    return out


#: When set to n > 0, `target_fraction_signal` sends SIGUSR2 to this process on its n-th call (a pre-timeout signal).
SIGNAL_AT = 0
_calls = 0


def target_fraction_signal(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    import os
    import signal

    global _calls
    _calls += 1
    if SIGNAL_AT and _calls == SIGNAL_AT:
        os.kill(os.getpid(), signal.SIGUSR2)
    return target_fraction(prompts, completions)


def never(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Cannot score anything (e.g. a verifier that timed out)."""
    return [None] * len(completions)


def prompt_length(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """A tenth of the prompt's length in characters: independent of the completion, so hand-computable."""
    return [len(p if isinstance(p, str) else p[-1]["content"]) / 10 for p in prompts]


_gated_calls = 0


def target_fraction_gated(prompts: list[Any], completions: list[Any], *, gate_dir: str, gate_calls: list[int],
                          **kwargs: Any) -> list[float | None]:
    """`target_fraction`, but on each call numbered in `gate_calls` the trainer process first hands control to the
    test: it creates `gate_dir/reached-<n>` and waits for the test to create `gate_dir/go-<n>` (a test that must
    act at a known point of the run, e.g. kill a server between two steps, without racing the trainer)."""
    import time
    from pathlib import Path

    global _gated_calls
    _gated_calls += 1
    if _gated_calls in gate_calls:
        gate = Path(gate_dir)
        (gate / f"reached-{_gated_calls}").touch()
        deadline = time.monotonic() + 600
        while not (gate / f"go-{_gated_calls}").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"target_fraction_gated: no go-{_gated_calls} in {gate} within 600 s")
            time.sleep(0.1)
    return target_fraction(prompts, completions)
