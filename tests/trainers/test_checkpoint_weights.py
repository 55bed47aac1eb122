"""Checkpoint discovery/signals and the weight iterator's names."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from launchgen.trainers import checkpoint as ckpt


def test_latest_ignores_tmp_and_incomplete(tmp_path: Path) -> None:
    for step, complete in ((5, True), (12, True), (20, False)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if complete:
            (d / ckpt.STATE_FILE).write_text("{}")
    (tmp_path / ".tmp-checkpoint-30").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [5, 12]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "checkpoint-12"
    assert ckpt.latest_checkpoint(tmp_path / "nothing") is None


@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM])
def test_signal_flag_sets_and_restores(sig: int) -> None:
    before = signal.getsignal(sig)
    flag = ckpt.SignalFlag().install()
    flag.training()
    try:
        assert flag.received is None
        os.kill(os.getpid(), sig)
        assert flag.received == sig
    finally:
        flag.uninstall()
    assert signal.getsignal(sig) == before


def test_term_before_training_exits_preempted_usr2_stays_a_flag() -> None:
    flag = ckpt.SignalFlag().install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.received == signal.SIGUSR2
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)  # let the handler run here
        assert exc.value.code == ckpt.EXIT_PREEMPTED
    finally:
        flag.uninstall()


def test_clean_name_strips_wrappers_only() -> None:
    from launchgen.trainers.weights import clean_name

    assert clean_name("module.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert clean_name("_orig_mod.model._fsdp_wrapped_module.embed_tokens.weight") == "model.embed_tokens.weight"
    assert clean_name("model.module.weight") == "model.module.weight"  # a submodule really named `module`


def test_iter_full_named_params_plain_model() -> None:
    import torch
    from launchgen.trainers.weights import iter_full_named_params

    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    got = list(iter_full_named_params(m, None))
    assert [n for n, _ in got] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(not t.requires_grad for _, t in got)
