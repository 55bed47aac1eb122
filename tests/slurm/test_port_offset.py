"""`job.port_offset: job_id` on a real SLURM job (issue 17): a group_port that the old rule (base + offset)
carried into the ephemeral range 32768-60999 at this job's id stays out of it, and the job runs on those ports
(the real trainer pushes its weights to the stand-in server over the group port)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, cancel, exit_code, job, run_job, state
from test_scenarios import spec_for

from launchgen.shared import ports

pytestmark = pytest.mark.slurm

GROUP_PORT = 32705  # below the range; any job id with id % 1000 >= 7 pushed it in with the old rule


@pytest.fixture
def jobs() -> Any:
    submitted: list[Job] = []
    yield submitted
    for j in submitted:
        if state(job(j.id)) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            cancel(j.id)


def test_shifted_ports_stay_out_of_the_ephemeral_range(cluster: Cluster, jobs: list[Job], shared_tiny_model: Path,
                                                      prompts_file: Path) -> None:
    work = cluster.shared_dir / "port-offset"
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-port-offset", port=19100, max_steps=2)
    spec["vllm"]["group_port"] = GROUP_PORT
    j = run_job(cluster, spec, work)
    jobs.append(j)
    offset = ports.offset_for(int(j.id))
    if not ports.in_ephemeral(GROUP_PORT + offset):
        pytest.skip(f"job id {j.id} (offset {offset}) would not have pushed {GROUP_PORT} into the range")
    rec = j.wait(150)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    used = {p["name"]: p["value"] for p in j.plan()["ports"]}
    assert j.plan()["port_offset_value"] == offset
    assert used["group"] == ports.shift(GROUP_PORT, offset) == GROUP_PORT + offset - ports.WRAP, used
    assert not [v for v in used.values() if ports.in_ephemeral(v)], used
    assert [m["step"] for m in j.metrics()] == [1, 2], j.describe()  # weights synced over the group port
    assert_no_survivors(cluster, j)
