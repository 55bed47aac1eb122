"""A failed job explains itself, and a running one can be followed (issue 13), on the real cluster.

The starter spec's `source .venv/bin/activate` names a file that is not in the submit directory: the batch script
stops at that line a second after it starts. `check --live` refuses the spec beforehand (LG730); submitted anyway,
`launchgen status` says FAILED, shows the batch log's error line, lists no server for a job without vLLM, and
exits 3. `launchgen logs --follow` on a running job prints its trainer log and returns when the job ends.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from slurmkit import FAKES, Cluster, cancel, job, launchgen_cmd, run_job, sh, state, wait_for
from tools import unwrapped

pytestmark = pytest.mark.slurm


def _spec(cluster: Cluster, work: Path) -> dict[str, Any]:
    slurm: dict[str, Any] = {"time": "00:05:00", "gpus_per_node": cluster.gpus_per_node, "exclusive": False,
                             "signal_grace": 0, "max_restarts": 0, "setup": ["source .venv/bin/activate"]}
    if cluster.partition:
        slurm["partition"] = cluster.partition
    (work / "prompts.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    return {"job": {"name": "lg-early", "output_dir": str(work / "runs" / "%j")}, "slurm": slurm,
            "model": {"name_or_path": "org/model"},
            "train": {"device": "cpu", "precision": "fp32", "args": {"data": {"path": "prompts.jsonl"}}}}


def test_batch_script_death_is_explained(cluster: Cluster) -> None:
    work = cluster.shared_dir / "status-early-death"
    work.mkdir(parents=True, exist_ok=True)
    spec = _spec(cluster, work)
    (work / "spec.yaml").write_text(json.dumps(spec))
    p = sh([*launchgen_cmd(cluster), "check", "--live", "spec.yaml"], check=False, cwd=work)
    assert p.returncode == 2 and "error LG730 [slurm.setup.0]" in unwrapped(p.stderr), p.stderr

    j = run_job(cluster, spec, work)
    try:
        rec = j.wait(60)
    finally:
        if state(job(j.id)) in ("PENDING", "RUNNING", "CONFIGURING"):
            cancel(j.id)
    assert state(rec) == "FAILED", j.describe()

    p = sh([*launchgen_cmd(cluster), "status", j.id], check=False, cwd=work)
    assert p.returncode == 3, p.stdout + p.stderr
    assert ".venv/bin/activate: No such file or directory" in p.stdout, p.stdout
    assert "no step started" in p.stdout and "role: server" not in p.stdout and "server " not in p.stdout
    data = json.loads(sh([*launchgen_cmd(cluster), "status", j.id, "--format", "json"], check=False).stdout)
    assert data["failed"] and [r["role"] for r in data["roles"]] == ["trainer"]
    assert data["failed_log"] == data["batch_log"] and Path(data["batch_log"]).is_file()


def test_logs_follow_a_running_job_until_it_ends(cluster: Cluster) -> None:
    work = cluster.shared_dir / "status-follow"
    work.mkdir(parents=True, exist_ok=True)
    spec = _spec(cluster, work)
    # the fake trainer (tests/fakes/bin/accelerate): no torch, no server to wait for; it writes a last line to its
    # log when it crashes at step 30 (~6 s in), long after the follow began
    spec["slurm"]["setup"] = [f"export PATH={FAKES / 'bin'}:{Path(cluster.python).parent}:$PATH",
                              "export FAKE_TRAINER_SKIP_HEALTH=1 FAKE_TRAINER_STEP_S=0.2 FAKE_TRAINER_CRASH_AT_STEP=30"]
    spec["job"]["name"] = "lg-follow"
    spec["train"]["args"]["max_steps"] = 40
    j = run_job(cluster, spec, work)
    try:
        log = wait_for("the trainer's first line", lambda: next(
            (f for f in (j.job_dir / "logs").glob("attempt-0/trainer-*.log") if "fake trainer on" in f.read_text()),
            None), 60)
        assert "crashing" not in log.read_text()
        t0 = time.monotonic()
        p = subprocess.run([*launchgen_cmd(cluster), "logs", j.id, "--role", "trainer", "-f"], capture_output=True,
                           text=True, timeout=90, check=False)
        rec = j.wait(30)
    finally:
        if state(job(j.id)) in ("PENDING", "RUNNING", "CONFIGURING"):
            cancel(j.id)
    assert state(rec) == "FAILED", j.describe()
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.splitlines()
    crash = "fake trainer: crashing at step 30 with exit 3"
    assert crash in out and out.index(crash) > next(i for i, ln in enumerate(out) if "fake trainer on" in ln), out
    assert "the job is over" in unwrapped(p.stderr) and time.monotonic() - t0 > 4, "it followed, then stopped by itself"
