"""Server replicas on the real SLURM cluster (tests/slurm/cluster): two `vllm serve` stand-ins as two job steps,
the real GRPO trainer on CPU. One run where replica 1's step is killed mid-training: the script starts a new step
for it on the same GPUs (`vllm.restart_replicas`), the trainer takes it back with the current weights, and the run
completes every step."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, run_job, sh, state, wait_for
from test_scenarios import _event, _status_json, spec_for

pytestmark = pytest.mark.slurm


def test_killed_replica_step_is_restarted_and_the_run_completes(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    steps_wanted = 40
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-replicas", port=18800,
                    max_steps=steps_wanted, rewards=["slurm_rewards:slow_first_attempt"],
                    server_env={"LAUNCHGEN_STANDIN_QUIET": "0"}, trainer_env={"SLURMTEST_REWARD_SLEEP": "1.0"})
    # replica k listens on port + k and hosts its group on group_port + k: keep them apart from the main port
    spec["vllm"].update({"tensor_parallel_size": 2, "replicas": 2, "restart_replicas": True, "port": 18800,
                         "group_port": 18803})
    spec["train"]["main_process_port"] = 18802
    j = run_job(cluster, spec, work)
    jobs.append(j)
    metrics = j.job_dir / "trainer" / "metrics.jsonl"
    wait_for("step 2", lambda: (metrics.exists() and len(metrics.read_text().splitlines()) >= 2) or None, 240)
    step_file = j.job_dir / "run" / "attempt-0" / "pids" / "server-r1.step"
    step = step_file.read_text().strip()
    sh(["scancel", "--signal=KILL", f"{j.id}.{step}"])
    rec = j.wait(420)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    assert [m["step"] for m in j.metrics()] == list(range(1, steps_wanted + 1)), j.describe()
    assert _event(j, "replica_restart replica=1 restart=1") is not None, j.describe()
    logs = j.logs()
    r1 = [p for n, p in logs.items() if n.startswith("attempt-0/server-r1-")]
    assert len(r1) == 1, logs
    text = r1[0].read_text(errors="replace")
    assert text.count("stand-in serving") == 2, text[-2000:]
    after = text.split("stand-in serving")[-1]
    assert "POST /update_weights" in after and "POST /v1/completions" in after, after[-2000:]
    assert_no_survivors(cluster, j)
    # `launchgen status` tells the restart
    st = _status_json(j)
    assert "vLLM replica 1: healthy, restarted 1 time(s)" in st["notes"], st["notes"]
    assert [(r["index"], r["state"], r["restarts"]) for r in st["replicas"]] == [(0, "healthy", 0), (1, "healthy", 1)]
