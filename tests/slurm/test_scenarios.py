"""End to end on a real SLURM cluster: `launchgen render` -> `sbatch` -> wait -> assert (issue 4, scenarios 1-9).

The server is the `vllm serve` stand-in (tests/vllm_standin/bin/vllm, first on PATH through `slurm.setup`);
the trainer is the real bundled GRPO trainer on CPU with a tiny model, except where a scenario needs a trainer
whose load time is set exactly (9) or a fast one to count requeues (7b): there tests/fakes/bin/accelerate
stands in. After every scenario no process of the job may survive on any node.

Timing facts these tests lean on (tests/slurm/cluster/, Debian slurm-wlm 22.05): jobs start within ~1 s;
the time limit and `--signal` are checked by slurmctld only every ~30 s, so scenario 7 moves the time limit
with `scontrol update` once training runs; a requeued job waits ~2 min (BeginTime) unless released with
`scontrol update StartTime=now`, which the test does.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from slurmkit import (
    FAKES,
    REPO,
    STANDIN_BIN,
    Cluster,
    Job,
    assert_no_survivors,
    cancel,
    exit_code,
    job,
    launchgen_cmd,
    render,
    run_job,
    sh,
    state,
    submit,
    survivors,
    wait_finished,
    wait_for,
)
from tools import unwrapped

pytestmark = pytest.mark.slurm

FAKE_BIN = FAKES / "bin"


def _ts(s: str) -> float:
    """scontrol's local `2026-12-02T12:46:33` -> epoch seconds."""
    return datetime.fromisoformat(s).timestamp()


def _events(j: Job, attempt: int = 0) -> list[tuple[float, str]]:
    f = j.job_dir / "logs" / f"attempt-{attempt}" / "events.log"
    out = []
    for line in f.read_text().splitlines() if f.is_file() else []:
        ts, _, rest = line.partition(" ")
        out.append((datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp(), rest))
    return out


def _event(j: Job, prefix: str, attempt: int = 0) -> float | None:
    return next((t for t, e in _events(j, attempt) if e.startswith(prefix)), None)


def spec_for(
    cluster: Cluster,
    work: Path,
    model: Path,
    prompts: Path,
    name: str,
    *,
    port: int,
    server_env: dict[str, str] | None = None,
    trainer_env: dict[str, str] | None = None,
    rewards: list[str] | None = None,
    max_steps: int = 3,
    health_timeout: int = 120,
    fake_trainer: bool = False,
    layout: str = "single",
    **slurm: Any,
) -> dict[str, Any]:
    """A spec for this cluster: the stand-in server on fake GPUs, the trainer on CPU, ports shifted per job."""
    path = [str(STANDIN_BIN)] + ([str(FAKE_BIN)] if fake_trainer else [])
    setup = [
        # the test's interpreter and the stand-ins first; the fakes importable for reward functions
        f"export PATH={':'.join([*path, str(Path(cluster.python).parent)])}:$PATH",
        f"export PYTHONPATH={FAKES}:{REPO / 'tests'}${{PYTHONPATH:+:$PYTHONPATH}}",
    ]
    # The stand-in's hooks are LAUNCHGEN_* names, which slurm.env reserves for launchgen: export them in setup
    # (only the stand-in reads them, so every role may see them).
    # LAUNCHGEN_WEIGHT_TRANSPORT=gloo: the CPU trainer pushes weights to the stand-in over gloo, not NCCL.
    hooks = {"LAUNCHGEN_STANDIN_DEVICE": "cpu", "LAUNCHGEN_STANDIN_QUIET": "1", "LAUNCHGEN_WEIGHT_TRANSPORT": "gloo",
             **(server_env or {})}
    setup += [f"export {k}={v}" for k, v in hooks.items()]
    env_all = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    s: dict[str, Any] = {
        "time": "00:10:00",
        "gpus_per_node": cluster.gpus_per_node,
        "exclusive": False,
        "signal_grace": 0,
        "max_restarts": 0,
        "setup": setup,
        "env": {"all": env_all, "trainer": trainer_env or {}},
    }
    if cluster.partition:
        s["partition"] = cluster.partition
    s.update(slurm)
    if layout == "single":  # one node: 4 GPUs for the server, the trainer beside it on CPU
        vllm: dict[str, Any] = {"mode": "server", "nodes": 0, "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4}
        train_nodes = 1
    else:  # multi: 2 trainer nodes + 1 dedicated server node
        vllm = {"mode": "server", "nodes": 1, "gpus": [0], "tensor_parallel_size": 1}
        train_nodes = 2
    vllm.update({"port": port, "group_port": port + 2, "health_timeout": health_timeout, "max_model_len": 256})
    return {
        "job": {"name": name, "output_dir": str(work / "runs" / "%j"), "port_offset": "job_id"},
        "slurm": s,
        "model": {"name_or_path": str(model)},
        "vllm": vllm,
        "train": {
            "nodes": train_nodes,
            "device": "cpu",
            "precision": "fp32",
            "trainer": "grpo",
            "main_process_port": port + 1,
            "args": {
                "data": {"path": str(prompts)},
                "rewards": [{"name": r} for r in (rewards or ["slurm_rewards:plain"])],
                "num_generations": 2,
                "per_device_train_batch_size": 2,
                "max_steps": max_steps,
                "learning_rate": 1e-4,
                "generation": {"max_completion_length": 8},
                "save_steps": 0,
                "save_final_model": False,
                "report_to": ["jsonl"],
                "logging_steps": 1,
            },
        },
    }



def _elapsed(rec: dict[str, str]) -> float:
    return _ts(rec["EndTime"]) - _ts(rec["StartTime"])


def _status_json(j: Job) -> dict[str, Any]:
    p = sh([*launchgen_cmd_for_tests(), "status", j.id, "--format", "json"], check=False)
    data: dict[str, Any] = json.loads(p.stdout) if p.stdout.strip() else {}
    # a job that is over and did not complete exits 3 (issue 13), everything else 0
    assert p.returncode == (3 if data.get("failed") else 0), f"launchgen status {j.id} exited {p.returncode}: {p.stderr}"
    return data


def launchgen_cmd_for_tests() -> list[str]:
    import sys

    return launchgen_cmd(Cluster([], 0, None, True, Path("/"), sys.executable))


def _assert_server_log_named(j: Job, text: str) -> None:
    logs = [n for n in j.logs() if "server-" in n]
    assert logs, "no server log was written\n" + j.describe()
    assert any(Path(n).name in text for n in logs), (
        f"the failure message does not name the server log ({logs}):\n{text[-3000:]}")


# --------------------------------------------------------------------------------------------- 1. happy path


@pytest.mark.parametrize("layout", ["single", "multi"])
def test_happy_path(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path,
                    layout: str) -> None:
    port = 18000 if layout == "single" else 18100
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, f"lg-happy-{layout}", port=port, max_steps=3,
                    layout=layout)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(150)  # 20-45 s here; a hang must not eat the suite's budget
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()

    # training ran every step once, with the real trainer, as ONE process group over all trainer nodes
    assert [m["step"] for m in j.metrics()] == [1, 2, 3], j.describe()
    # the job's output shows each step's line as it trained (from the first trainer node's log, however many)
    shown = [x.split()[2] for x in j.batch_log().splitlines() if x.startswith("[launchgen] step ")]
    assert shown == ["1/3", "2/3", "3/3"], j.describe()
    state_file = j.job_dir / "trainer" / "checkpoint-3" / "trainer_state.json"
    world = json.loads(state_file.read_text())["num_processes"] if state_file.is_file() else None
    assert world == (1 if layout == "single" else 2), (
        f"the trainer ran with {world} process(es) in its group; each trainer node must join one group "
        "(multi-node CPU needs RANK/WORLD_SIZE/LOCAL_RANK from the rendered step)\n" + j.describe())
    # the server was stopped within seconds of training ending, not at the time limit
    trainer_end = _event(j, "trainer_exit")
    assert trainer_end is not None, j.describe()
    assert _ts(rec["EndTime"]) - trainer_end <= 10, f"job ended {_ts(rec['EndTime']) - trainer_end:.0f}s after training\n{j.describe()}"
    # logs per role per node, for this attempt; the resolved spec, script and plan beside them
    logs = j.logs()
    nodes = j.plan().get("nodes") if isinstance(j.plan().get("nodes"), list) else None
    server_logs = [n for n in logs if n.startswith("attempt-0/server-")]
    trainer_logs = [n for n in logs if n.startswith("attempt-0/trainer-")]
    assert len(server_logs) == 1, logs
    assert len(trainer_logs) == (1 if layout == "single" else 2), logs
    if layout == "multi":
        server_node = Path(server_logs[0]).stem.removeprefix("server-")
        assert all(server_node not in t for t in trainer_logs), f"server and trainers share a node: {logs}"
    for f in ("spec.yaml", "job.sbatch", "launchgen-plan.json"):
        assert (j.job_dir / f).is_file(), f"{f} missing from {j.job_dir}"
    assert (j.job_dir / "job.sbatch").read_text() == j.script.read_text()
    assert nodes is None or nodes, "launchgen-plan.json lists no nodes"
    server_text = (j.job_dir / "logs" / server_logs[0]).read_text(errors="replace")
    assert "fake trainer" not in server_text
    assert_no_survivors(cluster, j)

    st = _status_json(j)
    assert st["first_to_end"] == "trainer", st["summary"]
    assert st["scheduler"]["state"] == "COMPLETED"
    assert any(r["role"] == "trainer" and r["state"] == "exited" for r in st["roles"]), st["roles"]


# --------------------------------------------------------------------------------------------- 2. never healthy


def test_server_crash_at_start_fails_fast(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                           prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-crash-start", port=18200,
                    server_env={"LAUNCHGEN_STANDIN_CRASH_AT_START": "1"}, health_timeout=300, max_steps=50)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(90)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    # within seconds of the server's death, not after the 300 s health timeout
    assert _elapsed(rec) <= 30, f"job took {_elapsed(rec):.0f}s to notice the dead server\n{j.describe()}"
    _assert_server_log_named(j, j.batch_log())
    assert_no_survivors(cluster, j)
    st = _status_json(j)
    assert st["first_to_end"] == "server", st["summary"]
    assert st["failed_log"] and "server-" in st["failed_log"], st


# --------------------------------------------------------------------------------------------- 3. health timeout


def test_health_timeout(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                        prompts_file: Path) -> None:
    timeout = 12
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-health-timeout", port=18300,
                    server_env={"LAUNCHGEN_STANDIN_NEVER_HEALTHY": "1"}, health_timeout=timeout, max_steps=50)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(120)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    el = _elapsed(rec)
    assert timeout - 1 <= el <= timeout + 20, f"failed after {el:.0f}s, health timeout {timeout}s\n{j.describe()}"
    log = j.batch_log()
    assert "healthy" in log and str(timeout) in log, f"no clear health-timeout message:\n{log[-3000:]}"
    _assert_server_log_named(j, log)
    assert_no_survivors(cluster, j)
    st = _status_json(j)
    assert st["last_health"] is not None and not st["last_health"]["ok"], st


# --------------------------------------------------------------------------------------------- 4. server dies


def test_server_dies_mid_training(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                  prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-server-dies", port=18400,
                    server_env={"LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS": "3"}, max_steps=200)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(180)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps and max(steps) < 200, f"trainer did not run, or ran past the server's death: {steps}"
    # no hang in weight sync or generation: the job ends soon after the server's death
    died = _event(j, "server_failed") or _event(j, "trainer_exit")
    assert died is not None, j.describe()
    assert _ts(rec["EndTime"]) - died <= 40, j.describe()
    assert_no_survivors(cluster, j)


# --------------------------------------------------------------------------------------------- 5. trainer crash


def test_trainer_crash_tears_down_server(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                         prompts_file: Path) -> None:
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-trainer-crash", port=18500,
                    rewards=["slurm_rewards:crash"], max_steps=50,
                    trainer_env={"SLURMTEST_CRASH_AT_CALL": "2", "SLURMTEST_CRASH_CODE": "3"})
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(180)
    crashed = _event(j, "trainer_exit")
    assert crashed is not None, j.describe()
    # the server is torn down at once (TERM; the stand-in exits in well under the grace)
    assert _ts(rec["EndTime"]) - crashed <= 10, j.describe()
    assert state(rec) == "FAILED", j.describe()
    # the job's exit code is the trainer's (3). accelerate launch reports any failed child as 1; the script
    # must pass the trainer's own status through.
    assert exit_code(rec)[0] == 3, f"job exit {rec.get('ExitCode')}, the trainer exited 3\n{j.describe()}"
    assert_no_survivors(cluster, j)
    st = _status_json(j)
    assert st["first_to_end"] == "trainer", st["summary"]
    assert st["failed_log"] and "trainer-" in st["failed_log"], st


# --------------------------------------------------------------------------------------------- 6. scancel


def test_scancel_leaves_nothing(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                prompts_file: Path) -> None:
    """Multi-node job cancelled mid-training; `launchgen status`/`logs` are checked on the live job first."""
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-scancel", port=18600, max_steps=100000,
                    layout="multi")
    j = run_job(cluster, spec, work)
    jobs.append(j)
    wait_for(f"job {j.id} to train a step (and the supervisor to see the server healthy)",
             lambda: (j.metrics() and _event(j, "server_healthy")) or state(job(j.id)) in ("FAILED", "COMPLETED"),
             180)
    assert state(job(j.id)) == "RUNNING", j.describe()

    # the post-mortem tools on a live job
    st = _status_json(j)
    assert st["scheduler"]["state"] == "RUNNING"
    assert st["last_health"] and st["last_health"]["ok"], st
    assert {r["role"]: r["state"] for r in st["roles"]} == {"server": "running", "trainer": "running"}, st["roles"]
    p = sh([*launchgen_cmd_for_tests(), "logs", j.id, "--role", "trainer", "--node", "1", "-n", "5"], check=False)
    assert p.returncode == 0 and p.stdout.strip(), p.stdout + p.stderr
    p = sh([*launchgen_cmd_for_tests(), "status", j.id], check=False)
    assert p.returncode == 0 and "running" in p.stdout, p.stdout + p.stderr

    t0 = time.monotonic()
    sh(["scancel", j.id])
    rec = j.wait(60)
    assert state(rec) == "CANCELLED", j.describe()
    assert_no_survivors(cluster, j, within=15)
    assert time.monotonic() - t0 < 45
    st = _status_json(j)
    assert st["scheduler"]["state"].startswith("CANCELLED")
    assert {r["state"] for r in st["roles"]} == {"stopped"}, st["roles"]


# --------------------------------------------------------------------------------------------- 7. pre-timeout


def _release_requeued(cluster: Cluster, j: Job, time_limit: str) -> dict[str, str]:
    """A requeued job waits ~2 min (BeginTime); start it now, with the original time limit back."""
    def requeued() -> dict[str, str] | None:
        r = job(j.id)
        pending_again = state(r) == "PENDING" and int(r.get("Restarts", "0")) >= 1
        return r if pending_again or state(r) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

    rec = wait_for(f"job {j.id} to be requeued", requeued, 120)
    if state(rec) == "PENDING":
        # slurmd refuses a credential issued in the same second the old run's was revoked ("Job credential
        # revoked"): start it a few seconds out, once nothing of the previous attempt is left
        wait_for(f"attempt of job {j.id} to be gone", lambda: not survivors(cluster, j.id), 60)
        p = sh(["scontrol", "update", f"JobId={j.id}", f"TimeLimit={time_limit}", "StartTime=now+2"], check=False)
        if p.returncode != 0 and "ermission" in unwrapped(p.stderr) and not cluster.local:
            cancel(j.id)
            pytest.skip("raising a job's time limit needs SLURM operator rights (scontrol update TimeLimit)")
        assert p.returncode == 0, p.stderr
        # an update schedules at once only if the job is eligible then; once it is, update again so the main
        # scheduler runs now instead of at its next periodic pass (up to a minute)
        eligible = _ts(job(j.id)["EligibleTime"])
        wait_for("the requeued job to be eligible", lambda: time.time() >= eligible + 0.2, 10, interval=0.1)
        if state(job(j.id)) == "PENDING":  # (the backfill pass may have started it meanwhile)
            sh(["scontrol", "update", f"JobId={j.id}", "StartTime=now"], check=False)
    return rec


def test_pre_timeout_signal_checkpoints_requeues_and_resumes(cluster: Cluster, work: Path, jobs: list[Job],
                                                             shared_tiny_model: Path, prompts_file: Path) -> None:
    max_steps = 30
    grace = 300
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-preempt", port=18700, max_steps=max_steps,
                    rewards=["slurm_rewards:slow_first_attempt"], trainer_env={"SLURMTEST_REWARD_SLEEP": "2"},
                    time="00:10:00", signal_grace=grace, max_restarts=1)
    j = run_job(cluster, spec, work)
    jobs.append(j)
    assert f"--signal=B:USR2@{grace}" in j.script.read_text()
    wait_for(f"job {j.id} to train a step", lambda: j.metrics() or state(job(j.id)) in ("FAILED", "COMPLETED"), 180)
    # Bring the end of the time limit within the grace: slurmctld sends USR2 at its next check (<= ~30 s).
    rec = job(j.id)
    run_s = (datetime.now() - datetime.fromisoformat(rec["StartTime"])).total_seconds()
    new_limit = math.ceil((run_s + grace - 60) / 60)  # leaves ~1-2 min after the signal: time to checkpoint
    sh(["scontrol", "update", f"JobId={j.id}", f"TimeLimit={new_limit}"])
    rec = _release_requeued(cluster, j, "10")
    # signal.log says how many trainer processes the job's signal step reached (their pid files)
    assert int(rec.get("Restarts", "0")) == 1, "USR2 did not lead to a requeue\n" + j.describe()
    rec = j.wait(240)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    assert int(rec.get("Restarts", "0")) == 1
    # attempt 0 checkpointed on USR2 and attempt 1 resumed from it: every step exactly once
    steps = [m["step"] for m in j.metrics()]
    assert steps == list(range(1, max_steps + 1)), f"steps repeated or lost across the requeue: {steps}"
    ev0 = " | ".join(e for _, e in _events(j, 0))
    assert "usr2" in ev0 and "requeue" in ev0, ev0
    assert (j.job_dir / "logs" / "attempt-1").is_dir(), j.logs()
    t0 = [n for n in j.logs() if n.startswith("attempt-0/trainer-")]
    t1 = [n for n in j.logs() if n.startswith("attempt-1/trainer-")]
    assert t0 and t1, j.logs()
    # the clean preemption (exit 75) reads as one: no accelerate CalledProcessError traceback in the trainer log
    text0 = j.logs()[t0[0]].read_text(errors="replace")
    assert "exiting 75" in text0 and "CalledProcessError" not in text0 and "Traceback" not in text0, text0[-3000:]
    assert_no_survivors(cluster, j)
    # its picture (issue 28): both attempts on the timeline, the requeue, who ended first; opened in Chromium
    from chromium import assert_figures_rendered, open_in_chromium

    page = work / "report.html"
    p = sh([*launchgen_cmd_for_tests(), "report", j.id, "-o", str(page)], check=False)
    assert p.returncode == 0, p.stderr
    dom = open_in_chromium(page, work / "chromium-profile")
    assert_figures_rendered(dom)
    for lane in ("attempt 0 · server", "attempt 0 · trainer", "attempt 1 · server", "attempt 1 · trainer"):
        assert lane in dom, lane
    assert ">requeue<" in dom and "ended first: checkpointed and exited 75" in dom  # its legend entry; the table


def test_requeue_cap_from_restart_count(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                        prompts_file: Path) -> None:
    """USR2 in every attempt (sent by hand): requeued once (max_restarts 1), then not again."""
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-requeue-cap", port=18750,
                    max_steps=100000, fake_trainer=True, signal_grace=60, max_restarts=1,
                    trainer_env={"FAKE_TRAINER_STEP_S": "0.2", "FAKE_TRAINER_SKIP_HEALTH": "1"})
    j = run_job(cluster, spec, work)
    jobs.append(j)
    for attempt in (0, 1):
        adir = j.job_dir / "logs" / f"attempt-{attempt}"
        wait_for(f"attempt {attempt}'s trainer to start",
                 lambda d=adir: any("fake trainer on" in f.read_text() for f in d.glob("trainer-*.log")), 120)
        n_before = len(j.metrics())
        wait_for(f"a step in attempt {attempt}", lambda n=n_before: len(j.metrics()) > n, 60)
        sh(["scancel", "--signal=USR2", "--batch", j.id])
        if attempt == 0:
            _release_requeued(cluster, j, "10")
    rec = j.wait(120)
    assert int(rec.get("Restarts", "0")) == 1, f"requeued {rec.get('Restarts')} times, cap 1\n{j.describe()}"
    assert state(rec) != "COMPLETED" or not (j.job_dir / "trainer" / "launchgen-complete.json").exists()
    ev1 = " | ".join(e for _, e in _events(j, 1))
    assert "requeue_cap" in ev1, ev1
    steps = [m["step"] for m in j.metrics()]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert_no_survivors(cluster, j)


def test_usr2_to_the_job_steps_checkpoints_and_requeues_without_killing_the_server(
        cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path, prompts_file: Path) -> None:
    """`scancel --signal=USR2 JOB` (no -b: what a user types to ask for a checkpoint) reaches every step's processes
    and not the batch shell: the server ignores it, the trainer checkpoints and exits 75, the job requeues."""
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-usr2-steps", port=18770,
                    max_steps=100000, fake_trainer=True, signal_grace=60, max_restarts=1,
                    trainer_env={"FAKE_TRAINER_STEP_S": "0.2", "FAKE_TRAINER_SKIP_HEALTH": "1"})
    j = run_job(cluster, spec, work)
    jobs.append(j)
    adir = j.job_dir / "logs" / "attempt-0"
    wait_for("the trainer to start", lambda: any("fake trainer on" in f.read_text() for f in adir.glob("trainer-*.log")),
             120)
    wait_for("a step", lambda: len(j.metrics()) > 0, 60)
    wait_for("the server to be healthy", lambda: _event(j, "server_healthy") is not None, 60)
    sh(["scancel", "--signal=USR2", j.id])
    rec = _release_requeued(cluster, j, "10")
    assert int(rec.get("Restarts", "0")) == 1, "USR2 to the steps did not lead to a requeue\n" + j.describe()
    ev0 = " | ".join(e for _, e in _events(j, 0))
    assert "trainer_exit status=75" in ev0 and "requeue restart=1" in ev0, ev0
    assert "server_failed" not in ev0, ev0
    wait_for("attempt 1 to start", lambda: (j.job_dir / "logs" / "attempt-1").is_dir(), 120)
    cancel(j.id)
    assert_no_survivors(cluster, j)


# --------------------------------------------------------------------------------------------- 8. ports


def test_two_jobs_same_node_no_port_collision(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                                              prompts_file: Path) -> None:
    node = cluster.nodes[0]
    specs = []
    for k in range(2):
        s = spec_for(cluster, work / f"job{k}", shared_tiny_model, prompts_file, f"lg-ports-{k}", port=18800,
                     max_steps=4, gpus_per_node=4, extra_directives=[f"--nodelist={node}"])
        specs.append(s)
    scripts = [render(cluster, s, work / f"job{k}") for k, s in enumerate(specs)]
    both = [submit(cluster, sc, work / f"job{k}", specs[k]["job"]["output_dir"]) for k, sc in enumerate(scripts)]
    jobs.extend(both)
    wait_for("both jobs running at once on one node",
             lambda: all(state(job(x.id)) == "RUNNING" for x in both) or any(
                 state(job(x.id)) in ("FAILED", "COMPLETED", "CANCELLED") for x in both), 60)
    recs = [x.wait(240) for x in both]
    for x, r in zip(both, recs, strict=True):
        assert state(r) == "COMPLETED" and exit_code(r) == (0, 0), x.describe()
        assert r["NodeList"] == node
    assert _ts(recs[1]["StartTime"]) < _ts(recs[0]["EndTime"]), "the two jobs did not overlap"
    # the effective ports (base + job-id offset) the two jobs used on the shared node: no value in common
    used = [{p["name"]: p["value"] for p in x.plan()["ports"]} for x in both]
    assert set(used[0].values()).isdisjoint(used[1].values()), used
    for x in both:
        for p in x.logs().values():
            assert "Address already in use" not in p.read_text(errors="replace"), p
        assert_no_survivors(cluster, x)


# --------------------------------------------------------------------------------------------- 9. overlap


def test_startup_overlaps(cluster: Cluster, work: Path, jobs: list[Job], shared_tiny_model: Path,
                          prompts_file: Path) -> None:
    """Server healthy after S s, trainer loaded after T s: the first step starts by max(S, T) + 5, not S + T."""
    t_load = 10.0
    spec = spec_for(cluster, work, shared_tiny_model, prompts_file, "lg-overlap", port=18900, max_steps=3,
                    fake_trainer=True, server_env={"LAUNCHGEN_STANDIN_STARTUP_DELAY": "6"},
                    trainer_env={"FAKE_TRAINER_LOAD_S": str(t_load), "FAKE_TRAINER_STEP_S": "0.1"})
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(120)
    assert state(rec) == "COMPLETED", j.describe()
    start = _event(j, "start")
    assert start is not None, j.describe()
    # when the server became healthy, as the trainer's own poller saw it (the supervisor polls only once a second)
    healthy = json.loads((j.job_dir / "trainer" / "fake-trainer-timeline.json").read_text())["healthy"]
    first_step = j.metrics()[0]["time/wall"]
    s = healthy - start  # the server's real start-up: the stand-in's own load plus the 6 s delay
    bound = max(s, t_load) + 5
    took = first_step - start
    assert took <= bound, f"first step {took:.1f}s after start; S={s:.0f}s T={t_load:.0f}s: bound {bound:.0f}s"
    assert took < s + t_load, f"start-up was serial: {took:.1f}s >= S + T = {s + t_load:.0f}s"
    assert_no_survivors(cluster, j)


def test_status_unknown_job_says_what_to_do(cluster: Cluster) -> None:
    p = subprocess.run([*launchgen_cmd_for_tests(), "status", "999999"], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "--job-dir" in unwrapped(p.stderr), p.stderr


def test_leftover_check_catches_a_leak(cluster: Cluster, work: Path) -> None:
    """The survivor check the scenarios rely on can fail: a daemonized child escapes proctrack/linuxproc."""
    if not cluster.local:
        pytest.skip("leaks on purpose; only on the local cluster")
    cfg = sh(["scontrol", "show", "config"]).stdout
    p = sh(["sbatch", "--parsable", "-o", str(work / "leak-%j.out"),
            "--wrap", "setsid sleep 120 </dev/null >/dev/null 2>&1 & sleep 0.5"], cwd=work)
    jid = p.stdout.strip()
    wait_finished(jid, 30)
    found = survivors(cluster, jid)
    try:
        if "proctrack/linuxproc" in cfg:
            assert any("sleep" in f for f in found), f"the leaked `sleep` of job {jid} was not found"
        else:  # proctrack/cgroup kills it with the job (asynchronously)
            wait_for(f"cgroup cleanup of job {jid}", lambda: not survivors(cluster, jid), 15)
    finally:
        for line in found:  # end the process this test leaked, by its pid
            subprocess.run(["kill", line.split()[0]], check=False)
