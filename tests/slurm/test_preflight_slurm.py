"""The in-allocation preflight (job.preflight, launchgen.jobside.allocprobe) on the real cluster: it passes in a healthy job
and records its cost, and each probe fails a job on purpose, within seconds and before anything loads: a blocked
group port, a flag the installed server lacks, a GPU index the allocation does not have."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, launchgen_cmd, run_job, state
from test_scenarios import _events, spec_for

pytestmark = pytest.mark.slurm



def _preflight(j: Job) -> tuple[str, list[dict[str, Any]]]:
    ev = " | ".join(e for _, e in _events(j, 0))
    results = [json.loads(p.read_text()) for p in sorted((j.job_dir / "logs" / "attempt-0").glob("preflight-*.json"))]
    return ev, results


def _status(cluster: Cluster, j: Job) -> str:
    p = subprocess.run([*launchgen_cmd(cluster), "status", j.id, "--job-dir", str(j.job_dir)], capture_output=True,
                       text=True, timeout=60)
    return p.stdout + p.stderr


def _failed_fast(cluster: Cluster, j: Job, code: str) -> None:
    rec = j.wait(120)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    ev, results = _preflight(j)
    assert f"preflight status=failed codes={code}" in ev or (
        "preflight status=failed" in ev and code in ev), ev
    assert "server_start" not in ev and "trainer_start" not in ev, ev  # nothing loaded
    assert any(f["code"] == code for r in results for f in r["failures"]), results
    assert f"preflight {code}" in j.batch_log(), j.batch_log()
    assert f"preflight failed before any model loaded: {code}" in _status(cluster, j)
    assert_no_survivors(cluster, j)


def test_preflight_passes_in_a_healthy_job_and_records_its_cost(cluster: Cluster, work: Path, jobs: list[Job],
                                                                shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-pf-ok", port=19200, layout="multi",
                    max_steps=1)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(300)
    assert state(rec) == "COMPLETED", j.describe()
    ev, results = _preflight(j)
    assert "preflight status=ok" in ev, ev
    assert len(results) == 3 and all(r["ok"] for r in results), results  # 2 trainer nodes + 1 server node
    seconds = int(ev.split("preflight status=ok seconds=")[1].split()[0])
    print(f"preflight cost: {seconds} s (per node: {[r['seconds'] for r in results]})")
    assert seconds < 15, f"the preflight took {seconds} s"


def test_a_blocked_group_port_fails_the_job_in_the_preflight(cluster: Cluster, work: Path, jobs: list[Job],
                                                             shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-pf-port", port=19210)
    spec["job"]["port_offset"] = "none"
    # something else holds trainer rank 0's weight-sync port (the local cluster's nodes are this host)
    with socket.socket() as s:
        s.bind(("0.0.0.0", 19212))
        s.listen(1)
        j = run_job(cluster, spec, work)
        jobs.append(j)
        _failed_fast(cluster, j, "PF101")


def test_a_flag_the_installed_server_lacks_fails_the_job_in_the_preflight(
        cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-pf-flag", port=19220)
    spec["vllm"]["extra_args"] = ["--speculative-draft-tensor-parallel-size 1"]  # not in the stand-in's vLLM
    j = run_job(cluster, spec, work)
    jobs.append(j)
    _failed_fast(cluster, j, "PF103")


def test_a_missing_gpu_index_fails_the_job_in_the_preflight(cluster: Cluster, work: Path, jobs: list[Job],
                                                            shared_tiny_model: Path, prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-pf-gpu", port=19230)
    # the plan gives the server GPU positions 0-3; the allocation has 2 (sbatch's own option beats the script's)
    j = run_job(cluster, spec, work, "--gres=gpu:2")
    jobs.append(j)
    _failed_fast(cluster, j, "PF104")
