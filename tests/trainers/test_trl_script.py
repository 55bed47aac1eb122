"""A user's own TRL script (`examples/trl_grpo_script.py`, unchanged) under `python -m launchgen.trainers.trl.script`:
the lifecycle is installed around it: the pre-timeout signal checkpoints and exits 75, the next run resumes
from that checkpoint without training a step twice, and a finished run leaves the completion marker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launchgen.shared.jobdir import COMPLETE_MARKER, EXIT_PREEMPTED

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "trl_grpo_script.py"


def _argv(model: Path, out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "launchgen.trainers.trl.script", str(SCRIPT),
            "--model_name_or_path", str(model), "--dtype", "float32",
            "--dataset_name", str(ROOT / "examples" / "data" / "tiny-math.jsonl"),
            "--output_dir", str(out), "--max_steps", str(steps), "--use_cpu", "true", "--bf16", "false",
            "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "6",
            "--report_to", "none", "--logging_steps", "1", "--save_steps", "100", "--disable_tqdm", "true"]


def _steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_signalled_script_checkpoints_exits_75_and_resumes_to_the_marker(tmp_path: Path,
                                                                          tiny_model_dir: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(_argv(tiny_model_dir, out, 4), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[launchgen] step 1/4"):
                proc.send_signal(signal.SIGUSR2)  # SLURM's pre-timeout signal, during step 2
        proc.wait(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, "".join(seen)[-3000:]
    done = _steps(out)
    assert done[0] == 1 and done == list(range(1, len(done) + 1)) and len(done) < 4
    assert (out / f"checkpoint-{done[-1]}").is_dir()
    assert not (out / COMPLETE_MARKER).exists()
    rerun = subprocess.run(_argv(tiny_model_dir, out, 4), env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert f"[launchgen] resuming from {out / f'checkpoint-{done[-1]}'}" in rerun.stdout
    assert _steps(out) == [1, 2, 3, 4]  # nothing trained twice
    marker = json.loads((out / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == 4 and marker["trainer"] == f"script:{SCRIPT}"


@pytest.mark.slow
def test_a_script_training_into_its_own_output_dir_still_fills_the_jobs_metrics(tmp_path: Path,
                                                                                 tiny_model_dir: Path) -> None:
    """Under a job (LAUNCHGEN_TRL_OUTPUT_DIR, the trainer directory `report` and `status` read), the metrics go
    there even where the script's Trainer trains into another output_dir (a script that parses no flags); on
    main they went to the script's own directory only."""
    own, job = tmp_path / "own", tmp_path / "job-trainer"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", LAUNCHGEN_TRL_OUTPUT_DIR=str(job))
    res = subprocess.run(_argv(tiny_model_dir, own, 2), env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _steps(job) == [1, 2] and not (own / "metrics.jsonl").exists()
    assert (own / "checkpoint-2").is_dir()  # the checkpoints stay the script's
