"""`launchgen logs --role server --rank K` and `launchgen report` for a server replica over several nodes.

The job directory is built here in the names `launchgen.shared.jobdir` owns (the rank files the server step
writes, templates/steps/server.sh.j2): a 2-node server whose headless rank 1 was killed (137), as
tests/slurm/test_real_vllm_multinode.py's killed-rank test leaves it, and a trainer on a third node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen.cli import main
from launchgen.readback import runreport
from launchgen.readback.jobfiles import ServerRank, read_server_ranks
from launchgen.shared import jobdir as J

L = J.DEFAULT_LAYOUT
T = "2026-12-06T09:00:02Z"  # the time stamp of the step's own lines (lg_log)
START = ("2026-12-06T09:00:00Z start job=local attempt=0\n"
         "2026-12-06T09:00:01Z server_start nodes=node1 node2\n"
         "2026-12-06T09:00:01Z trainer_start nodes=node3\n")
END = ("2026-12-06T09:01:00Z server_failed exit=137 rank=1 node=node2\n"
       "2026-12-06T09:01:05Z trainer_exit status=1\n2026-12-06T09:01:05Z exit status=1\n")


def _two_rank_job(tmp_path: Path, end: bool = True, started: int = 2) -> Path:
    """`started`: how many ranks' steps reached their node (recorded it and began their log)."""
    d = tmp_path / "launchgen-runs" / "local"
    (d / L.events_log.format(attempt=0)).parent.mkdir(parents=True)
    (d / L.plan_json).write_text(json.dumps({"scheduler": "bash", "job_id": "local", "nodes": [
        {"name": n, "position": i, "roles": [r]} for i, (n, r) in
        enumerate((("node1", "server"), ("node2", "server"), ("node3", "trainer")))],
        "server": {"replicas": [{"index": 0, "positions": [0, 1], "gpus": [0]}]}}))
    (d / L.events_log.format(attempt=0)).write_text(START + (END if end else ""))
    pids = d / L.pid_dir.format(attempt=0)
    pids.mkdir(parents=True)
    for rank, node, pid in ((0, "node1", 4100), (1, "node2", 4200))[:started]:
        J.server_rank_file(pids, "server", rank, "node").write_text(f"{node}\n")
        J.server_rank_file(pids, "server", rank, "pid").write_text(f"{pid}\n")
        (d / L.role_log("server", 0, node)).write_text(f"{T} launchgen: server rank {rank} on {node} (10.0.0.{rank + 1})\n")
    if end:
        J.server_rank_file(pids, "server", 1, "exit").write_text("137\n")
        with (d / L.role_log("server", 0, "node2")).open("a") as fh:
            fh.write(f"{T} launchgen: server rank 1: vllm exited with status 137\n")
    (d / L.role_log("trainer", 0, "node3")).write_text("step 1\n")
    return d


def _logs(d: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["logs", "local", "--job-dir", str(d), "--role", "server", *args])


def test_rank_files_are_read_through_the_contract(tmp_path: Path) -> None:
    d = _two_rank_job(tmp_path)
    (d / L.pid_dir.format(attempt=0) / "server.rank1.exit.bak").write_text("0\n")  # a copy: not a rank file
    assert read_server_ranks(d, 0) == [ServerRank("server", 0, "node1", None), ServerRank("server", 1, "node2", 137)]
    assert read_server_ranks(d, 1) == []  # no such attempt
    assert J.server_rank_file_of("server-r1.rank2.node") == ("server-r1", 2, "node")
    assert J.server_rank_file_of("trainer.rank0.pid") is None


def test_logs_of_a_rank_is_its_nodes_log(tmp_path: Path) -> None:
    d = _two_rank_job(tmp_path)
    r = _logs(d, "--rank", "1", "-n", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f"{T} launchgen: server rank 1: vllm exited with status 137"], r.stdout
    assert "server rank 1 on node2" in unwrapped(r.stderr) and "server-node2.log" in unwrapped(r.stderr), r.stderr
    r = _logs(d, "--rank", "0", "--path-only")
    assert r.exit_code == 0 and r.stdout.strip() == str(d / L.role_log("server", 0, "node1")), r.output


def test_a_rank_that_does_not_exist_names_those_that_do(tmp_path: Path) -> None:
    d = _two_rank_job(tmp_path)
    r = _logs(d, "--rank", "2")
    assert r.exit_code == 2, r.output
    assert unwrapped(r.stderr).strip() == ("launchgen: error: --rank 2: the server's ranks in attempt 0 are 0 (node1), "
                                "1 (node2)"), r.stderr
    assert "Traceback" not in unwrapped(r.output)


@pytest.mark.parametrize("args", [["--node", "node1"], ["--role", "trainer"]])
def test_rank_is_for_the_server_alone(tmp_path: Path, args: list[str]) -> None:
    r = _logs(_two_rank_job(tmp_path), "--rank", "0", *args)
    assert r.exit_code == 2 and "--rank 0: a server rank" in unwrapped(r.stderr), r.output


def test_a_one_node_server_is_rank_0(tmp_path: Path) -> None:
    d = _two_rank_job(tmp_path)
    for f in (d / L.pid_dir.format(attempt=0)).iterdir():
        f.unlink()
    (d / L.role_log("server", 0, "node2")).unlink()
    plan = json.loads((d / L.plan_json).read_text())
    plan["server"]["replicas"][0]["positions"] = [0]
    (d / L.plan_json).write_text(json.dumps(plan))
    r = _logs(d, "--rank", "0", "--path-only")
    assert r.exit_code == 0 and r.stdout.strip().endswith("server-node1.log"), r.output
    r = _logs(d, "--rank", "1")
    assert r.exit_code == 2 and "ran on one node in attempt 0: it has rank 0 only" in unwrapped(r.stderr), unwrapped(r.output)


def test_follow_a_rank_until_the_job_ends(tmp_path: Path) -> None:
    """The real CLI in a subprocess, as test_status's follow test: rank 1, which the plan has but whose step has
    not reached its node yet, is waited for; then its log is followed, rank 0's is not."""
    d = _two_rank_job(tmp_path, end=False, started=1)
    p = subprocess.Popen([sys.executable, "-c", "from launchgen.cli import main; main()", "logs", "local",
                          "--job-dir", str(d), "--role", "server", "--rank", "1", "-n", "1", "-f"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(2.0)
        assert p.poll() is None, p.communicate()
        with (d / L.role_log("server", 0, "node1")).open("a") as fh:
            fh.write("rank 0: not this one\n")
        J.server_rank_file(d / L.pid_dir.format(attempt=0), "server", 1, "node").write_text("node2\n")
        (d / L.role_log("server", 0, "node2")).write_text(f"{T} launchgen: server rank 1 on node2\nrank 1 joined\n")
        time.sleep(1.0)
        with (d / L.events_log.format(attempt=0)).open("a") as fh:
            fh.write(END)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out.splitlines() == [f"{T} launchgen: server rank 1 on node2", "rank 1 joined"], out
    assert "the job is over" in err


def test_report_names_each_rank_and_its_exit(tmp_path: Path) -> None:
    rep = runreport.build("local", _two_rank_job(tmp_path))
    names = [ln.name for ln in rep.lanes]
    assert "attempt 0 · server · node1 · rank 0" in names, names
    assert "attempt 0 · server · node2 · rank 1, exit 137" in names, names
    assert "attempt 0 · trainer · node3" in names, names


def test_following_a_rank_the_plan_lacks_is_refused_at_once(tmp_path: Path) -> None:
    r = _logs(_two_rank_job(tmp_path, end=False), "--rank", "2", "-f")
    assert r.exit_code == 2 and "ranks in attempt 0 are 0 (node1), 1 (node2)" in unwrapped(r.stderr), unwrapped(r.output)

