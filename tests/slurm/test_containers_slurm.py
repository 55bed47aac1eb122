"""The server and the trainer in a charliecloud image on the real SLURM cluster (issue 29): `launchgen render` ->
`sbatch` -> each role's step runs `ch-run ... IMAGE -- <its command>` under `srun`.

The image is tests/chimage.py's (a bare root whose /usr and Python come from the host through the spec's
mounts; the job's files live below /tmp, which ch-run binds). The server is the `vllm serve` stand-in, the
trainer the real bundled GRPO trainer on CPU. Three scenarios: a run that completes with both roles inside the
image; `scancel` mid-training, after which no process of the job (inside the image or out) survives; and a USR2
that reaches the trainer inside the image through its pid file (the signal step runs on the host), which
checkpoints, the job requeues itself and the next attempt resumes: every step exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chimage import build_image, ch_run, host_mounts
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, job, run_job, sh, state, wait_for
from test_scenarios import _events, _release_requeued, spec_for

pytestmark = pytest.mark.slurm

MARKER = "etc/launchgen-test-image"


def _contained(cluster: Cluster, workdir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    ch_run()
    mounts = host_mounts(cluster.python)
    image = build_image(workdir / "image", mounts)
    assert str(image).startswith("/tmp/"), "the job's files must lie below /tmp, which ch-run binds from the host"
    spec["container"] = {"runtime": "charliecloud", "image": str(image), "mounts": mounts}
    # the HF cache the script mounts: below /tmp, which ch-run binds (the image has no /root/.cache)
    spec["slurm"]["setup"].append(f"export HF_HOME={workdir / 'hf'}")
    return spec


def _inside(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/root/{MARKER}").exists()
    except OSError:
        return False


def _trainer_pids(j: Job, attempt: int = 0) -> list[int]:
    d = j.job_dir / "run" / f"attempt-{attempt}" / "pids"
    return [int(t) for f in d.glob("*/rank*.pid") if (t := f.read_text().strip()).isdigit()] if d.is_dir() else []


def _server_pids(model: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # not ch-run itself in the instant before it execs the server in the image
        if f"serve {model}" in cmd and not cmd.split(" ", 1)[0].endswith("ch-run"):
            out.append(int(d.name))
    return out


def test_charliecloud_roles_complete_inside_the_image(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    assert cluster.local, "the in-image evidence reads /proc of the nodes: a local cluster"
    spec = _contained(cluster, work, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-ch-happy",
                                              port=18900, max_steps=3,
                                              rewards=["slurm_rewards:slow_first_attempt"],
                                              trainer_env={"SLURMTEST_REWARD_SLEEP": "1"}))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    assert "ch-run" in j.script.read_text()
    seen: dict[str, bool] = {}

    def both_seen() -> bool | None:
        for pid in _trainer_pids(j):
            seen.setdefault("trainer", _inside(pid))
        for pid in _server_pids(shared_tiny_model):
            seen.setdefault("server", _inside(pid))
        return len(seen) == 2 or state(job(j.id)) in ("COMPLETED", "FAILED", "CANCELLED") or None

    wait_for(f"job {j.id}'s server and trainer processes", both_seen, 180)
    rec = j.wait(180)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    assert seen == {"trainer": True, "server": True}, f"{seen}\n{j.describe()}"
    assert [m["step"] for m in j.metrics()] == [1, 2, 3], j.describe()
    assert_no_survivors(cluster, j)


def test_charliecloud_scancel_leaves_nothing(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    spec = _contained(cluster, work, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-ch-kill",
                                              port=18920, max_steps=100000))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    wait_for(f"job {j.id} to train a step", lambda: j.metrics() or state(job(j.id)) in ("FAILED", "COMPLETED"), 180)
    assert state(job(j.id)) == "RUNNING", j.describe()
    inside = [p for p in _trainer_pids(j) + _server_pids(shared_tiny_model) if _inside(p)]
    assert len(inside) >= 2, f"expected the trainer and the server inside the image: {inside}\n{j.describe()}"
    sh(["scancel", j.id])
    rec = j.wait(60)
    assert state(rec) == "CANCELLED", j.describe()
    assert_no_survivors(cluster, j, within=15)
    wait_for("the in-image processes to be gone", lambda: not [p for p in inside if Path(f"/proc/{p}").exists()]
             or None, 15)


def test_charliecloud_usr2_checkpoints_requeues_and_resumes(
    cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path
) -> None:
    max_steps = 8
    spec = _contained(cluster, work, spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-ch-requeue",
                                              port=18940, max_steps=max_steps, signal_grace=60, max_restarts=1,
                                              rewards=["slurm_rewards:slow_first_attempt"],
                                              trainer_env={"SLURMTEST_REWARD_SLEEP": "1.5"}))
    j = run_job(cluster, spec, work)
    jobs.append(j)
    wait_for(f"job {j.id} to train a step", lambda: j.metrics() or state(job(j.id)) in ("FAILED", "COMPLETED"), 180)
    assert all(_inside(p) for p in _trainer_pids(j)) and _trainer_pids(j), j.describe()
    # what SLURM sends before the time limit: USR2 to the batch shell, which passes it to the trainer processes
    # inside the image through their pid files
    sh(["scancel", "--signal=USR2", "--batch", j.id])
    rec = _release_requeued(cluster, j, "10")
    assert int(rec.get("Restarts", "0")) == 1, "USR2 did not lead to a requeue\n" + j.describe()
    rec = j.wait(240)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps == list(range(1, max_steps + 1)), f"steps repeated or lost across the requeue: {steps}"
    ev0 = " | ".join(e for _, e in _events(j, 0))
    assert "usr2" in ev0 and "requeue" in ev0, ev0
    t0 = [p for n, p in j.logs().items() if n.startswith("attempt-0/trainer-")]
    assert t0 and "exiting 75" in t0[0].read_text(errors="replace"), j.describe()
    assert_no_survivors(cluster, j)
