"""Teardown signals on a real SLURM cluster (issue 17): TERM, a grace, and only then KILL.

A server and a trainer that trap TERM (tests/fakes/lifecycle_bin/vllm, tests/fakes/bin/accelerate with
FAKE_*_TERM_DELAY_S) log TERM's arrival and need a few seconds to shut down. The batch script alone gets TERM
(`scancel --batch --signal=TERM`, as a site's pre-emption or a user's `scancel -b` delivers it): it must stop the
trainer and then the server, each with its grace, and the trainer must checkpoint on the way out. Signalling the
steps' `srun` instead makes srun SIGKILL the step at once: no TERM reaches either process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from slurmkit import FAKES, Cluster, Job, assert_no_survivors, job, run_job, sh, state, wait_for
from test_scenarios import spec_for

pytestmark = pytest.mark.slurm

SHUTDOWN_S = 4.0  # each side's own shutdown time after TERM: well inside the script's grace (plan.STOP_GRACE_S)



def _term_trapping_spec(cluster: Cluster, work: Path, model: Path, prompts: Path, layout: str) -> dict[str, Any]:
    spec = spec_for(cluster, work, model, prompts, "lg-term-grace", port=19000 if layout == "single" else 19050,
                    max_steps=100000, fake_trainer=True, layout=layout,
                    server_env={"FAKE_VLLM_TERM_DELAY_S": str(SHUTDOWN_S)},
                    trainer_env={"FAKE_TRAINER_TERM_DELAY_S": str(SHUTDOWN_S), "FAKE_TRAINER_STEP_S": "0.2"})
    # the TERM-trapping fast `vllm` first on PATH (spec_for puts the protocol stand-in there); only it, not the
    # `accelerate` beside it
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "vllm").exists():
        (bin_dir / "vllm").symlink_to(FAKES / "lifecycle_bin" / "vllm")
    setup = spec["slurm"]["setup"]
    setup[0] = f"export PATH={bin_dir}:{setup[0].removeprefix('export PATH=')}"
    return spec


def _stamp(text: str, what: str) -> float | None:
    m = re.search(rf"{what} at (\d+\.\d+)", text)
    return float(m.group(1)) if m else None


@pytest.mark.parametrize("layout", ["single", "multi"])
def test_term_reaches_server_and_trainer_with_a_grace_before_kill(cluster: Cluster, work: Path, jobs: list[Job],
                                                                 shared_tiny_model: Path, prompts_file: Path,
                                                                 layout: str) -> None:
    """single: server and trainer on one node; multi: 2 trainer nodes (one process each) + a server node."""
    j = run_job(cluster, _term_trapping_spec(cluster, work, shared_tiny_model, prompts_file, layout), work)
    jobs.append(j)
    events = j.job_dir / "logs" / "attempt-0" / "events.log"
    wait_for(f"job {j.id} to train with a healthy server",
             lambda: (j.metrics() and events.is_file() and "server_healthy" in events.read_text())
             or state(job(j.id)) not in ("PENDING", "RUNNING", "CONFIGURING"), 120)
    assert state(job(j.id)) == "RUNNING", j.describe()
    sh(["scancel", "--batch", "--signal=TERM", j.id])
    j.wait(90)

    logs = j.logs()
    trainers = [p.read_text(errors="replace") for n, p in logs.items() if n.startswith("attempt-0/trainer-")]
    servers = [p.read_text(errors="replace") for n, p in logs.items() if n.startswith("attempt-0/server-")]
    assert len(trainers) == (1 if layout == "single" else 2) and len(servers) == 1, logs
    server, batch = servers[0], j.batch_log()
    # TERM arrived in every process (not a SIGKILL through srun) ...
    t_terms = [_stamp(t, "TERM received") for t in trainers]
    s_term = _stamp(server, "TERM received")
    assert None not in t_terms, "a trainer never received TERM\n" + j.describe()
    assert s_term is not None, "the server never received TERM\n" + j.describe()
    t_term = max(x for x in t_terms if x is not None)
    # ... the trainers used the grace to checkpoint and stopped by themselves (75), then the server shut down
    for trainer in trainers:
        assert "checkpoint-" in trainer and "exiting 75" in trainer, j.describe()
    assert list((j.job_dir / "trainer").glob("checkpoint-*")), j.describe()
    s_done = _stamp(server, "shut down after TERM")
    assert s_done is not None and s_done - s_term >= SHUTDOWN_S - 0.5, j.describe()
    assert s_term >= t_term + SHUTDOWN_S - 0.5, "the server was stopped before the trainer had finished\n" + j.describe()
    # no KILL was needed and SLURM did not force anything
    assert "did not stop within" not in batch, batch
    for text in (*trainers, server, batch):
        assert "forcing job termination" not in text and "task 0: Killed" not in text, j.describe()
    assert_no_survivors(cluster, j)
