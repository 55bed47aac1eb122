"""Sweeps on a real SLURM cluster (issue 38): the CPU quickstart as a 3-point job array (the real GRPO trainer, the
tiny model). One point fails on purpose and the others complete; `launchgen status <array id>` is one row per
point; USR2 to one task checkpoints it, requeues that task alone and resumes it with no step trained twice."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurmkit import FAKES, FINISHED, REPO, Cluster, Job, launchgen_cmd, sh, state, wait_for
from test_scenarios import _release_requeued

from launchgen.readback.slurmquery import parse_scontrol_oneliner

pytestmark = pytest.mark.slurm


def _spec(cluster: Cluster, work: Path, model: Path, prompts: Path, name: str, sweep: dict[str, Any], *,
          max_steps: int, **slurm: Any) -> dict[str, Any]:
    setup = [f"export PATH={Path(cluster.python).parent}:$PATH",
             f"export PYTHONPATH={FAKES}:{REPO / 'tests'}${{PYTHONPATH:+:$PYTHONPATH}}"]
    s: dict[str, Any] = {"time": "00:10:00", "gpus_per_node": cluster.gpus_per_node, "exclusive": False,
                         "max_restarts": 0, "setup": setup,
                         "env": {"all": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}}, **slurm}
    if cluster.partition:
        s["partition"] = cluster.partition
    return {
        "job": {"name": name, "output_dir": str(work / "runs" / "%j")},
        "slurm": s,
        "model": {"name_or_path": str(model), "dtype": "float32"},
        "train": {"device": "cpu", "precision": "fp32", "trainer": "grpo", "args": {
            "data": {"path": str(prompts)}, "rewards": [{"name": "slurm_rewards:slow_first_attempt"}],
            "num_generations": 2, "per_device_train_batch_size": 2, "max_steps": max_steps, "save_steps": 0,
            "save_final_model": False, "report_to": ["jsonl"], "generation": {"max_completion_length": 8}}},
        "sweep": sweep,
    }


def _submit(cluster: Cluster, spec: dict[str, Any], work: Path) -> str:
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    p = sh([*launchgen_cmd(cluster), "render", "spec.yaml", "-o", "array.sbatch", "--force"], check=False, cwd=work)
    assert p.returncode == 0, p.stderr
    text = (work / "array.sbatch").read_text()
    assert text.count("\n#SBATCH --array=") == 1, text[:3000]
    p = sh(["sbatch", "--parsable", "array.sbatch"], check=False, cwd=work, env=cluster.env())
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def _tasks(array_id: str) -> dict[int, dict[str, str]]:
    """The array's task records by task id (a pending range counts once, under its first id)."""
    out = sh(["scontrol", "show", "job", "-o", array_id], check=False).stdout
    recs = [r for r in parse_scontrol_oneliner(out) if r.get("ArrayJobId") == array_id]
    return {int(r["ArrayTaskId"].split("-")[0].split(",")[0].strip("[")): r for r in recs}


def _all_finished(array_id: str, n: int) -> dict[int, dict[str, str]] | None:
    t = _tasks(array_id)
    return t if len(t) == n and all(state(r) in FINISHED for r in t.values()) else None


def _status(cluster: Cluster, work: Path, array_id: str) -> tuple[int, dict[str, Any]]:
    p = sh([*launchgen_cmd(cluster), "status", array_id, "--format", "json"], check=False, cwd=work)
    return p.returncode, json.loads(p.stdout)


def _track(jobs: list[Job], work: Path, array_id: str, tasks: dict[int, dict[str, str]], names: list[str]) -> None:
    """Each task as a Job of the test's: cancelled if left alive, its attempts checked for the preflight."""
    for k, rec in tasks.items():
        jobs.append(Job(rec["JobId"], work, work / "runs" / array_id / names[k], work / "array.sbatch", time.time()))


def test_a_three_point_array_one_failing_on_purpose(cluster: Cluster, work: Path, jobs: list[Job],
                                                    shared_tiny_model: Path, prompts_file: Path) -> None:
    sweep = {"points": [{"train.args.learning_rate": 1e-4}, {"train.args.learning_rate": 3e-4},
                        # plan and render read no data file: this point renders, and its trainer refuses it
                        {"train.args.learning_rate": 3e-4, "train.args.data.path": str(work / "missing.jsonl")}]}
    spec = _spec(cluster, work, shared_tiny_model, prompts_file, "lg-sweep3", sweep, max_steps=3)
    array_id = _submit(cluster, spec, work)
    tasks = wait_for(f"array {array_id} to finish", lambda: _all_finished(array_id, 3), 300)
    names = ["lr1e-4", "lr3e-4", "lr3e-4_pathmissing.jsonl"]
    _track(jobs, work, array_id, tasks, names)
    assert [state(tasks[k]) for k in range(3)] == ["COMPLETED", "COMPLETED", "FAILED"], tasks
    for k in (0, 1):
        metrics = (work / "runs" / array_id / names[k] / "trainer" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(m)["step"] for m in metrics] == [1, 2, 3]
    rc, st = _status(cluster, work, array_id)
    assert rc == 3, st
    rows = {r["index"]: r for r in st["points"]}
    assert [rows[k]["name"] for k in range(3)] == names
    assert [rows[k]["state"] for k in range(3)] == ["COMPLETED", "COMPLETED", "FAILED"]
    assert [rows[k]["steps"] for k in range(3)] == [3, 3, None]
    assert all(rows[k]["task"] == tasks[k]["JobId"] for k in range(3))
    table = sh([*launchgen_cmd(cluster), "status", array_id], check=False, cwd=work)
    assert table.returncode == 3 and all(n in table.stdout for n in names), table.stdout


def test_usr2_to_one_task_requeues_it_alone_and_it_resumes(cluster: Cluster, work: Path, jobs: list[Job],
                                                           shared_tiny_model: Path, prompts_file: Path) -> None:
    max_steps = 12
    sweep = {"grid": {"train.args.learning_rate": [1e-4, 2e-4, 3e-4]}}
    spec = _spec(cluster, work, shared_tiny_model, prompts_file, "lg-sweep-usr2", sweep, max_steps=max_steps,
                 max_restarts=1)
    spec["slurm"]["env"]["trainer"] = {"SLURMTEST_REWARD_SLEEP": "1"}
    array_id = _submit(cluster, spec, work)
    names = ["lr1e-4", "lr2e-4", "lr3e-4"]
    metrics = work / "runs" / array_id / names[1] / "trainer" / "metrics.jsonl"
    wait_for("task 1 to train a step", lambda: metrics.is_file() and metrics.read_text().strip(), 180)
    task1 = _tasks(array_id)[1]["JobId"]
    sh(["scancel", "--signal=USR2", "--batch", task1])
    # the task requeues itself and waits ~2 min (BeginTime): start it as soon as SLURM lets it
    rec = _release_requeued(cluster, Job(task1, work, work, work / "array.sbatch", time.time()), "10")
    assert int(rec.get("Restarts", "0")) == 1
    tasks = wait_for(f"array {array_id} to finish", lambda: _all_finished(array_id, 3), 300)
    _track(jobs, work, array_id, tasks, names)
    assert [state(tasks[k]) for k in range(3)] == ["COMPLETED"] * 3, tasks
    assert [int(tasks[k].get("Restarts", "0")) for k in range(3)] == [0, 1, 0]
    for name in names:
        steps = [json.loads(m)["step"] for m in (work / "runs" / array_id / name / "trainer" / "metrics.jsonl")
                 .read_text().splitlines()]
        assert steps == list(range(1, max_steps + 1)), f"{name}: steps repeated or lost: {steps}"
    assert (work / "runs" / array_id / names[1] / "logs" / "attempt-1").is_dir()
    assert not (work / "runs" / array_id / names[0] / "logs" / "attempt-1").exists()
    rc, st = _status(cluster, work, array_id)
    assert rc == 0 and [r["attempts"] for r in st["points"]] == [1, 2, 1], st
