"""`train.trainer: trl.grpo` on the real SLURM cluster: TRL's own GRPOTrainer (`python -m launchgen.trainers.trl`,
plain generation on CPU, the tiny model) under the rendered sbatch script. The pre-timeout USR2 makes TRL save
its checkpoint and exit 75, the job requeues itself, the next attempt resumes from that checkpoint, and every
optimizer step is trained exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, job, run_job, sh, state, wait_for
from test_scenarios import _events, _release_requeued, spec_for

pytestmark = pytest.mark.slurm


def test_trl_grpo_usr2_checkpoints_requeues_and_resumes_each_step_once(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    # The first attempt's reward sleeps 1.5 s a call, so the signal lands mid-run however late the first metrics
    # line is seen (unpaced, a full .ci/run saw 6 one-second TRL steps finish before USR2 reached them)
    max_steps = 12
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-trl-requeue", port=18960,
                    max_steps=max_steps, signal_grace=60, max_restarts=1,
                    rewards=["slurm_rewards:slow_first_attempt"],
                    trainer_env={"SLURMTEST_REWARD_SLEEP": "1.5"})
    del spec["vllm"]  # TRL's own generate: TRL's server mode needs vllm importable in the trainer's environment
    spec["train"]["trainer"] = "trl.grpo"
    spec["train"]["args"]["save_steps"] = 1000  # no periodic save inside this run: the signal's save is the one tested
    j = run_job(cluster, spec, work)
    jobs.append(j)
    wait_for(f"job {j.id} to train a step", lambda: j.metrics() or state(job(j.id)) in ("FAILED", "COMPLETED"), 300)
    assert state(job(j.id)) == "RUNNING", j.describe()
    sh(["scancel", "--signal=USR2", "--batch", j.id])  # what SLURM sends before the time limit
    rec = _release_requeued(cluster, j, "10")
    assert int(rec.get("Restarts", "0")) == 1, "USR2 did not lead to a requeue\n" + j.describe()
    rec = j.wait(400)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps == list(range(1, max_steps + 1)), f"steps repeated or lost across the requeue: {steps}"
    ev0 = " | ".join(e for _, e in _events(j, 0))
    assert "trainer_exit status=75" in ev0 and "requeue" in ev0, ev0
    logs = j.logs()
    first = next(p for n, p in logs.items() if n.startswith("attempt-0/trainer-")).read_text(errors="replace")
    second = next(p for n, p in logs.items() if n.startswith("attempt-1/trainer-")).read_text(errors="replace")
    assert "exiting 75" in first, first[-3000:]
    assert "[launchgen] resuming from" in second and "checkpoint-" in second, second[-3000:]
    assert (j.job_dir / "trainer" / "launchgen-complete.json").is_file()
    assert_no_survivors(cluster, j)
