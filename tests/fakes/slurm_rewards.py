"""Reward functions the SLURM scenarios load by `module:function` name (tests/fakes is on the job's PYTHONPATH).

They steer the real trainer from inside, the way a user's reward code could: pace it (so a pre-timeout signal
lands mid-run) or crash it (so the job's exit code can be checked against the trainer's).
"""

from __future__ import annotations

import os
import time
from typing import Any

_calls = 0


def _lengths(completions: list[Any]) -> list[float | None]:
    return [float(len(c if isinstance(c, str) else str(c)) % 5) for c in completions]


def plain(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Deterministic, varied rewards (so advantages are not all zero)."""
    return _lengths(completions)


def slow_first_attempt(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Sleeps SLURMTEST_REWARD_SLEEP seconds per call, only in the job's first attempt (SLURM_RESTART_COUNT 0)."""
    if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) == 0:
        time.sleep(float(os.environ.get("SLURMTEST_REWARD_SLEEP", "1.0")))
    return _lengths(completions)


def hold(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """On call SLURMTEST_HOLD_AT_CALL the trainer waits (at most 300 s) until the file SLURMTEST_HOLD_FILE exists:
    a test holds the run at a known step while it breaks something, instead of pacing every step."""
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("SLURMTEST_HOLD_AT_CALL", "0")):
        deadline = time.monotonic() + 300
        while not os.path.exists(os.environ["SLURMTEST_HOLD_FILE"]) and time.monotonic() < deadline:
            time.sleep(0.2)
    return _lengths(completions)


def crash(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """On call SLURMTEST_CRASH_AT_CALL (default 2) the trainer process dies with SLURMTEST_CRASH_CODE (default 3)."""
    global _calls
    _calls += 1
    if _calls >= int(os.environ.get("SLURMTEST_CRASH_AT_CALL", "2")):
        print(f"slurm_rewards.crash: exiting {os.environ.get('SLURMTEST_CRASH_CODE', '3')} on call {_calls}",
              flush=True)
        os._exit(int(os.environ.get("SLURMTEST_CRASH_CODE", "3")))
    return _lengths(completions)
