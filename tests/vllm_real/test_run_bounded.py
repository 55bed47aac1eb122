"""The tier's bound on a trainer run (`harness.run_bounded`): a hang fails the test with where each thread waited.
Plain Python processes, no server: runs in the ordinary suite."""

from __future__ import annotations

import os
import sys
import time

import pytest

from vllm_real.harness import run_bounded


def test_a_hung_process_fails_naming_where_its_threads_waited() -> None:
    code = ("import threading\n"
            "def wait_for_the_group():\n"
            "    threading.Event().wait()\n"
            "threading.Thread(target=wait_for_the_group, daemon=True).start()\n"
            "print('started', flush=True)\n"
            "threading.Event().wait()\n")
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as exc:
        run_bounded([sys.executable, "-c", code], dict(os.environ), 3, "the sleeper")
    assert time.monotonic() - start < 20
    message = str(exc.value)
    assert "the sleeper did not finish within 3 s" in message
    assert "wait_for_the_group" in message and "started" in message, message


def test_a_process_that_ends_gives_its_status_and_output() -> None:
    run = run_bounded([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], dict(os.environ), 30, "x")
    assert (run.returncode, run.stdout) == (3, "out\n")
