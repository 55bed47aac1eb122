"""The trainer's reporting: the plain line per logging step, no bar off a terminal, TensorBoard's one warning,
wandb offline (its run file read back), and a missing wandb refused before the model loads."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import wandb  # noqa: F401  (the [wandb] extra is in [dev]: missing is a failure, not a skip)
from toy_runs import read_metrics, run_cfg, toy_cfg
from wandb_records import history, run_info, wait_closed, wait_next_second, wait_runs

HERE = Path(__file__).parent


def _cfg(tmp_path: Path, model: Path, out: str, **over: Any) -> dict[str, Any]:
    return toy_cfg(tmp_path, model, out, **{"trainer": "grpo", "num_generations": 4, "per_device_train_batch_size": 8,
                                            "max_steps": 3, **over})


def test_format_line_hand_values() -> None:
    from launchgen.trainers.reporting import format_line

    m = {"reward": 0.51234, "loss": 0.0123456, "kl": math.nan, "time/generate": 0.5349, "time/train": 0.42,
         "learning_rate": 1e-6}
    assert format_line(3, 12, m, 1234.4) == (
        "[launchgen] step 3/12 reward=0.5123 loss=0.012346 tokens/s=1234 generate=0.53s train=0.42s"
    )
    # sft: no reward; kl when the objective logs it; no tokens/s when nothing was counted
    assert format_line(1, 2, {"loss": 2.0, "kl": 0.25}, None) == "[launchgen] step 1/2 loss=2 kl=0.250000"


def test_row_layout_counts_prompt_and_completion_tokens() -> None:
    from launchgen.trainers.rollout import RL_LAYOUT
    from launchgen.trainers.supervised import SFT_LAYOUT

    mb = {"completion_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    assert int(RL_LAYOUT.tokens(mb)) == 3 + 5
    assert int(SFT_LAYOUT.tokens({"attention_mask": torch.tensor([[1, 1, 1, 0]])})) == 3


def test_plain_line_per_logging_step_no_bar_and_tensorboard_warns_once(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    cfg = _cfg(tmp_path, tiny_model_dir, "line", logging_steps=2, report_to=["jsonl", "tensorboard"])
    assert run_cfg(cfg) == 0
    cap = capsys.readouterr()
    lines = [x for x in cap.out.splitlines() if x.startswith("[launchgen] step ")]
    ms = read_metrics(tmp_path / "line")
    assert [m["step"] for m in ms] == [2, 3]
    assert len(lines) == 2, cap.out
    for line, m in zip(lines, ms, strict=True):
        assert line.startswith(f"[launchgen] step {m['step']}/3 reward={m['reward']:.4f} loss={m['loss']:.5g} ")
        rate = re.search(r" tokens/s=(\d+) ", line)
        assert rate and int(rate.group(1)) > 0, line
        assert re.search(r" generate=\d+\.\d\ds score=\d+\.\d\ds train=\d+\.\d\ds$", line), line
    assert cap.err.count("tensorboard package is not installed") == 1, cap.err
    assert "\r" not in cap.err  # no progress bar when stderr is not a terminal
    assert not (tmp_path / "line" / "runs").exists()


def test_wandb_offline_writes_the_run_and_a_resume_continues_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("WANDB_MODE", "offline")  # never a network call
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "toy")
    out = tmp_path / "wb"
    cfg = _cfg(tmp_path, tiny_model_dir, "wb", max_steps=2, save_steps=1, report_to=["jsonl", "wandb"],
               run_name="toy-run")
    assert run_cfg(cfg) == 0
    run_id = (out / "wandb-run-id").read_text().strip()
    runs = wait_runs(out, run_id, 1)
    assert len(runs) == 1
    wait_closed(runs[0])
    rows = history(runs[0])
    ms = read_metrics(out)
    assert [r["_step"] for r in rows] == [m["step"] for m in ms] == [1, 2]
    for r, m in zip(rows, ms, strict=True):
        assert r["loss"] == pytest.approx(m["loss"]) and r["reward"] == pytest.approx(m["reward"])
        assert r["time/train"] == pytest.approx(m["time/train"])
    info = run_info(runs[0])
    assert (info["id"], info["project"], info["name"]) == (run_id, "toy", "toy-run")
    assert info["config"]["trainer"] == "grpo" and info["config"]["max_steps"] == 2

    # a requeued / extended run continues the same wandb run (same id), from the next step
    wait_next_second(runs[0])
    assert run_cfg(dict(cfg, max_steps=3)) == 0
    assert (out / "wandb-run-id").read_text().strip() == run_id
    runs = wait_runs(out, run_id, 2)
    assert len(runs) == 2
    wait_closed(runs[-1])
    assert [r["_step"] for r in history(runs[-1])] == [3]


def test_missing_wandb_is_refused_before_the_model_loads(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchgen.trainers import modeling
    from launchgen.trainers.declarations.errors import TrainerSetupError

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setitem(sys.modules, "wandb", None)

    def no_load(*a: Any, **k: Any) -> Any:
        raise AssertionError("the model was loaded before the missing wandb was reported")

    monkeypatch.setattr(modeling, "load_model", no_load)
    with pytest.raises(TrainerSetupError, match=r"pip install 'launchgen\[wandb\]'"):
        run_cfg(_cfg(tmp_path, tiny_model_dir, "nowb", report_to=["wandb"]))


def test_a_failing_wandb_init_is_one_setup_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    # its own process: wandb caches its settings per process, so an earlier offline run here would hide the env
    import os
    import subprocess

    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(tmp_path, tiny_model_dir, "badwb", max_steps=1, report_to=["jsonl", "wandb"])))
    env = dict(os.environ, WANDB_MODE="bogus", WANDB_SILENT="true",  # wandb refuses its own settings: no network
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "launchgen.trainers.grpo", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and re.search(r"report_to wandb: wandb\.init failed .*WANDB_MODE=offline", errors[0])
    assert "Traceback" not in proc.stderr
