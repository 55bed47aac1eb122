"""A heterogeneous job on the real SLURM cluster (issue 29): the server on a partition of its own.

The local cluster has two partitions over the same nodes (`debug`, the default, and `gpu`); `vllm.partition: gpu`
makes the rendered job two components: the 2 trainer nodes in the default partition (component 0, where the
batch script runs) and the dedicated server node in `gpu` (component 1). The server is the `vllm serve`
stand-in, the trainer the real GRPO trainer on CPU. Shown: node discovery over both components, the server's
steps in component 1 (`srun --het-group=1`), health across them, and teardown per component: the server's step
is stopped through its component's job id when training ends or the trainer crashes, and nothing survives.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, job, run_job, sh, state, wait_for
from test_scenarios import _event, _release_requeued, _ts, spec_for

pytestmark = pytest.mark.slurm


def _server_partition(cluster: Cluster) -> str:
    parts = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, check=True).stdout.split()
    default = next((p.rstrip("*") for p in parts if p.endswith("*")), None)
    job_partition = cluster.partition or default
    others = [p.rstrip("*") for p in parts if p.rstrip("*") != job_partition]
    assert others, f"a heterogeneous job needs a second partition; sinfo shows {parts}"
    return others[0]


def _het(cluster: Cluster, spec: dict[str, Any]) -> dict[str, Any]:
    spec["vllm"]["partition"] = _server_partition(cluster)
    return spec


def _components(j: Job) -> list[dict[str, str]]:
    """`scontrol show job` prints one record per component of a heterogeneous job."""
    out = subprocess.run(["scontrol", "show", "job", "-o", j.id], capture_output=True, text=True).stdout
    recs = []
    for line in out.splitlines():
        rec = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        recs.append(rec)
    return recs


def _server_node(j: Job) -> str:
    logs = [n for n in j.logs() if n.startswith("attempt-0/server-")]
    assert len(logs) == 1, j.logs()
    return Path(logs[0]).stem.removeprefix("server-")


def test_server_on_its_own_partition_completes(cluster: Cluster, work: Path, jobs: list[Job],
                                               shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = _het(cluster, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-het-happy", port=19000,
                                  max_steps=3, layout="multi"))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    script = j.script.read_text()
    assert "#SBATCH hetjob" in script and "--het-group=1" in script
    comps = _components(j)
    assert len(comps) == 2, comps
    assert comps[1]["Partition"] == spec["vllm"]["partition"] and comps[0]["Partition"] != comps[1]["Partition"]
    rec = j.wait(180)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    assert [m["step"] for m in j.metrics()] == [1, 2, 3], j.describe()
    # the server ran on the server component's node, and was stopped within seconds of training's end
    comps = _components(j)
    assert _server_node(j) == comps[1]["NodeList"], (comps, j.logs())
    # the preflight ran in both components at once (one step each), on every node
    assert _event(j, "preflight status=ok") is not None, j.describe()
    assert {f"attempt-0/preflight-{n}.log" for n in (_server_node(j),)} <= set(j.logs()), j.logs()
    assert len([n for n in j.logs() if n.startswith("attempt-0/preflight-")]) == 3, j.logs()
    trainer_end = _event(j, "trainer_exit")
    assert trainer_end is not None and _ts(rec["EndTime"]) - trainer_end <= 10, j.describe()
    assert_no_survivors(cluster, j)


def test_trainer_crash_tears_down_the_server_component(cluster: Cluster, work: Path, jobs: list[Job],
                                                       shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = _het(cluster, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-het-crash", port=19050,
                                  rewards=["slurm_rewards:crash"], max_steps=50, layout="multi",
                                  trainer_env={"SLURMTEST_CRASH_AT_CALL": "2", "SLURMTEST_CRASH_CODE": "3"}))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(180)
    crashed = _event(j, "trainer_exit")
    assert crashed is not None, j.describe()
    # the server's step (component 1) got TERM through SLURM_JOB_ID_HET_GROUP_1.<step> and stopped at once
    assert _ts(rec["EndTime"]) - crashed <= 10, j.describe()
    assert state(rec) == "FAILED" and exit_code(rec)[0] == 3, j.describe()
    assert_no_survivors(cluster, j)


def test_usr2_requeues_the_whole_heterogeneous_job_and_it_resumes(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    """USR2 to the batch shell (what SLURM sends before the time limit): the trainer checkpoints, `scontrol requeue`
    of the leader requeues both components, and the next attempt (nodes listed again from both) resumes."""
    max_steps = 8
    spec = _het(cluster, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-het-requeue", port=19100,
                                  max_steps=max_steps, layout="multi", signal_grace=60, max_restarts=1,
                                  rewards=["slurm_rewards:slow_first_attempt"],
                                  trainer_env={"SLURMTEST_REWARD_SLEEP": "1.5"}))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    wait_for(f"job {j.id} to train a step", lambda: j.metrics() or state(job(j.id)) in ("FAILED", "COMPLETED"), 180)
    sh(["scancel", "--signal=USR2", "--batch", j.id])
    rec = _release_requeued(cluster, j, "10")
    assert int(rec.get("Restarts", "0")) == 1, "USR2 did not lead to a requeue\n" + j.describe()
    rec = j.wait(240)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps == list(range(1, max_steps + 1)), f"steps repeated or lost across the requeue: {steps}"
    assert [n for n in j.logs() if n.startswith("attempt-1/server-")], j.logs()
    assert_no_survivors(cluster, j)
