"""A checkpoint of another trainer kind is refused before anything loads, naming both kinds and the directory; a
re-run of a finished `trl.*` or `train.script` training trains nothing and says so; raising max_steps past a
schedule that ended at learning rate 0 warns (issue 35, item 4). On main, trl.grpo resumed the bundled loop's
checkpoint and died in `TrainerState.__init__`, and a re-run trained `step 3/2` at learning rate 0."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.rerun import KIND_FILE, TRANSFORMERS, decide_trl, foreign, kind_of
from launchgen.trainers.trl.run import run
from test_trl_script import SCRIPT, _argv, _steps
from toy_runs import run_cfg, toy_cfg
from trl_runs import metric_steps, trl_cfg

from launchgen.shared.jobdir import COMPLETE_MARKER, EXIT_OK


def _checkpoint(out: Path, step: int, state: dict[str, object], kind: str | None = None) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps(state))
    if kind is not None:
        (d / KIND_FILE).write_text(json.dumps({"trainer": kind}))
    return d


def test_each_kind_of_checkpoint_is_told_and_another_kind_refused(tmp_path: Path) -> None:
    bundled = _checkpoint(tmp_path / "a", 2, {"global_step": 2, "config": {"trainer": "grpo"}})
    trl = _checkpoint(tmp_path / "b", 2, {"global_step": 2, "log_history": []}, "trl.grpo")
    plain = _checkpoint(tmp_path / "c", 2, {"global_step": 2, "log_history": []})
    assert [kind_of(d) for d in (bundled, trl, plain)] == ["grpo", "trl.grpo", TRANSFORMERS]
    said = foreign(bundled, "trl.grpo")
    assert said is not None and "grpo (launchgen's bundled trainer)" in said and "trl.grpo (TRL's own" in said
    assert str(bundled) in said
    assert foreign(trl, "grpo") is not None and foreign(trl, "trl.sft") is not None
    assert foreign(trl, "script:train.py") is not None
    assert foreign(plain, "grpo") is not None  # the bundled loop cannot read a transformers checkpoint
    assert foreign(plain, "trl.grpo") is None and foreign(trl, "trl.grpo") is None  # TRL can (or it is its own)


def test_a_finished_training_is_complete_and_a_raised_max_steps_past_lr_0_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    _checkpoint(out, 2, {"global_step": 2, "max_steps": 2, "log_history": [{"learning_rate": 5e-7, "step": 1},
                                                                           {"learning_rate": 0.0, "step": 2}]},
                "trl.grpo")
    (out / COMPLETE_MARKER).write_text("{}")
    assert decide_trl(out, "trl.grpo", 2, "auto", True).complete
    assert "training already complete" in capsys.readouterr().out
    assert decide_trl(out, "trl.grpo", -1, "auto", True).complete  # epochs: the checkpoint's own max_steps
    start = decide_trl(out, "trl.grpo", 4, "auto", True)
    said = capsys.readouterr().out
    assert not start.complete and start.checkpoint == str(out / "checkpoint-2")
    assert "step 3 trains at learning rate 0" in said, said
    assert not (out / COMPLETE_MARKER).exists()  # the marker of the shorter training no longer holds
    with pytest.raises(TrainerSetupError, match="resume: never"):
        decide_trl(out, "trl.grpo", 4, "never", True)


@pytest.mark.slow
def test_trl_refuses_the_bundled_loops_checkpoint_and_the_bundled_loop_trls_before_loading(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundled = toy_cfg(tmp_path, tiny_model_dir, "out", "grpo", max_steps=1, save_steps=1,
                      per_device_train_batch_size=4, num_generations=4)
    assert run_cfg(bundled) == EXIT_OK
    out = Path(bundled["output_dir"])
    cfg = trl_cfg(tmp_path, tiny_model_dir, "grpo")
    cfg["args"]["output_dir"] = str(out)
    t0 = time.perf_counter()
    with pytest.raises(TrainerSetupError) as refused:
        run(TrlRunConfig.model_validate(cfg))
    assert time.perf_counter() - t0 < 5  # before the rewards, the data and the model
    assert "checkpoint-1 was written by grpo (launchgen's bundled trainer); this run is trl.grpo" in str(refused.value)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1"]
    # the other way round: a TRL checkpoint is refused by the bundled loop (exit 2, before the model loads)
    other = tmp_path / "trl"
    cfg = trl_cfg(tmp_path, tiny_model_dir, "grpo", max_steps=1, save_steps=1)
    cfg["args"]["output_dir"] = str(other)
    assert run(TrlRunConfig.model_validate(cfg)) == EXIT_OK
    assert kind_of(other / "checkpoint-1") == "trl.grpo"
    with pytest.raises(TrainerSetupError, match=r"written by trl\.grpo \(TRL's own trainer\); this run is grpo"):
        run_cfg({**bundled, "output_dir": str(other)})


@pytest.mark.slow
def test_a_rerun_of_a_finished_trl_run_trains_nothing(tmp_path: Path, tiny_model_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = trl_cfg(tmp_path, tiny_model_dir, "grpo", save_steps=2)
    out = Path(cfg["args"]["output_dir"])
    assert run(TrlRunConfig.model_validate(cfg)) == EXIT_OK
    marker = (out / COMPLETE_MARKER).read_text()
    capsys.readouterr()
    assert run(TrlRunConfig.model_validate(cfg)) == EXIT_OK
    said = capsys.readouterr().out
    assert "training already complete" in said and "nothing was trained" in said, said
    assert "[launchgen] step" not in said
    assert metric_steps(out) == [1, 2] and not (out / "checkpoint-3").exists()
    assert (out / COMPLETE_MARKER).read_text() == marker


@pytest.mark.slow
def test_a_rerun_of_a_finished_script_runs_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "out"
    argv = [*_argv(tiny_model_dir, out, 2), "--save_steps", "2"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert kind_of(out / "checkpoint-2") == f"script:{SCRIPT}"
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training already complete" in again.stdout, again.stdout
    assert _steps(out) == [1, 2] and not (out / "checkpoint-3").exists()
