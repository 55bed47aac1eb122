"""Helpers for the real-SLURM scenarios: render a spec, submit it, wait for states, find survivors.

Every wait polls `scontrol show job -o` with a deadline; nothing sleeps blindly. Works against the local
cluster of tests/slurm/cluster/ and, with LAUNCHGEN_SLURM_* settings (docs/slurm-testing.md), a real one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from launchgen.readback.status import parse_scontrol_oneliner

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"
STANDIN_BIN = REPO / "tests" / "vllm_standin" / "bin"
FAKES = REPO / "tests" / "fakes"
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
T = TypeVar("T")


def sh(cmd: list[str], check: bool = True, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    """Poll `fn` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Cluster:
    nodes: list[str]
    gpus_per_node: int
    partition: str | None
    local: bool  # every node's slurmd runs on this host (the tests/slurm/cluster recipe)
    shared_dir: Path  # visible from every node
    python: str  # interpreter the jobs use (same venv as the tests)

    def env(self) -> dict[str, str]:
        """Environment for sbatch: the stand-in `vllm` first on PATH, the fakes importable."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(STANDIN_BIN), str(Path(self.python).parent), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join([str(FAKES), str(REPO / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # the stand-in runs on CPU and quietly; trainers must not look for GPUs that are only /dev/null
        env.setdefault("LAUNCHGEN_STANDIN_DEVICE", "cpu")
        env.pop("SLURM_JOB_ID", None)  # tests may run inside an allocation on a real cluster
        return env


# ------------------------------------------------------------------------------------------ scontrol


def job(job_id: str) -> dict[str, str]:
    p = sh(["scontrol", "show", "job", "-o", job_id], check=False)
    recs = parse_scontrol_oneliner(p.stdout)
    return recs[0] if recs else {}


def state(rec: dict[str, str]) -> str:
    return rec.get("JobState", "").split()[0] if rec else ""


def exit_code(rec: dict[str, str]) -> tuple[int, int]:
    a, _, b = rec.get("ExitCode", "0:0").partition(":")
    return int(a), int(b or 0)


def wait_state(job_id: str, states: frozenset[str] | set[str], timeout: float) -> dict[str, str]:
    def probe() -> dict[str, str] | None:
        rec = job(job_id)
        return rec if state(rec) in states else None

    try:
        return wait_for(f"job {job_id} to reach {sorted(states)}", probe, timeout)
    except AssertionError as e:
        rec = job(job_id)
        raise AssertionError(f"{e}; now {state(rec)} Reason={rec.get('Reason')} RunTime={rec.get('RunTime')}") from None


def wait_finished(job_id: str, timeout: float) -> dict[str, str]:
    return wait_state(job_id, FINISHED, timeout)


def cancel(job_id: str) -> None:
    sh(["scancel", job_id], check=False)


# ------------------------------------------------------------------------------------------ jobs


@dataclass
class Job:
    id: str
    workdir: Path
    job_dir: Path
    script: Path
    submitted_at: float

    def batch_log(self) -> str:
        rec = job(self.id)
        out = rec.get("StdOut")
        p = Path(out) if out else None
        if p is None or not p.exists():
            cands = sorted(self.workdir.glob(f"*{self.id}*.out"))
            p = cands[0] if cands else None
        return p.read_text(errors="replace") if p and p.exists() else ""

    def logs(self) -> dict[str, Path]:
        base = self.job_dir / "logs"
        return {str(p.relative_to(base)): p for p in sorted(base.rglob("*.log"))} if base.is_dir() else {}

    def plan(self) -> dict[str, Any]:
        return json.loads((self.job_dir / "launchgen-plan.json").read_text())

    def metrics(self) -> list[dict[str, Any]]:
        f = self.job_dir / "trainer" / "metrics.jsonl"
        if not f.is_file():
            return []
        return [json.loads(x) for x in f.read_text().splitlines() if x.strip()]

    def wait(self, timeout: float) -> dict[str, str]:
        """Wait for the job to finish; on timeout the failure shows the job's logs (a hang is a finding)."""
        try:
            return wait_finished(self.id, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None

    def describe(self) -> str:
        """Everything a failing assertion should show: scheduler view, batch log, every role log's tail."""
        parts = [f"job {self.id}: {job(self.id)}", f"--- batch log\n{self.batch_log()[-6000:]}"]
        for name, p in self.logs().items():
            text = p.read_text(errors="replace")
            parts.append(f"--- {name} (last 3000 chars)\n{text[-3000:]}")
        ev = self.job_dir / "logs"
        for f in sorted(ev.rglob("events*")) if ev.is_dir() else []:
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def launchgen_cmd(cluster: Cluster) -> list[str]:
    """The CLI as installed in the jobs' environment (the console script beside its interpreter), exactly as a user
    runs it; never whatever `launchgen` PATH happens to hold."""
    exe = Path(cluster.python).parent / "launchgen"
    if not exe.is_file():
        raise AssertionError(f"launchgen is not installed beside {cluster.python}: pip install -e '.[dev]'")
    return [str(exe)]


def render(cluster: Cluster, spec: dict[str, Any], workdir: Path, name: str = "spec.yaml") -> Path:
    """`launchgen render SPEC -o job.sbatch`, through the installed CLI exactly as a user runs it."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / name
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = workdir / "job.sbatch"
    p = sh([*launchgen_cmd(cluster), "render", str(spec_path), "-o", str(out), "--force"], check=False, cwd=workdir)
    if p.returncode != 0 or not out.is_file():
        raise AssertionError(f"launchgen render exited {p.returncode}:\n{p.stderr}\n--- spec\n{spec_path.read_text()}")
    return out


def submit(cluster: Cluster, script: Path, workdir: Path, job_dir_pattern: str, *extra: str) -> Job:
    p = sh(["sbatch", "--parsable", *extra, str(script)], check=False, cwd=workdir, env=cluster.env())
    if p.returncode != 0:
        raise AssertionError(f"sbatch {script} exited {p.returncode}: {p.stderr.strip()}\n{script.read_text()}")
    jid = p.stdout.strip().split(";")[0]
    return Job(jid, workdir, Path(job_dir_pattern.replace("%j", jid)), script, time.time())


def run_job(cluster: Cluster, spec: dict[str, Any], workdir: Path, *extra: str) -> Job:
    script = render(cluster, spec, workdir)
    return submit(cluster, script, workdir, spec["job"]["output_dir"], *extra)


# ------------------------------------------------------------------------------------------ survivors

_SCAN = r"""
import os, sys
jid = sys.argv[1]
me = os.getpid()
needle = ("SLURM_JOB_ID=" + jid).encode()
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == me:
        continue
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        comm = open(f"/proc/{pid}/comm").read().strip()
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if needle in env and comm != "slurmstepd" and stat[0] != "Z":
        print(f"{pid} {comm} {cmd[:200]}")
"""


def survivors(cluster: Cluster, job_id: str) -> list[str]:
    """Processes still carrying SLURM_JOB_ID=<job_id> (any node), ignoring slurmstepd and zombies."""
    if cluster.local:
        p = sh([sys.executable, "-c", _SCAN, job_id], check=False)
        return [x for x in p.stdout.splitlines() if x.strip()]
    # On a real cluster: one scan per node the job used, as a fresh tiny job on that node.
    rec = job(job_id)
    nodes = expand_nodes(rec.get("NodeList", ""))
    found: list[str] = []
    for n in nodes:
        p = sh(["srun", "-N1", "-n1", "-w", n, "--time=1", *(["-p", cluster.partition] if cluster.partition else []),
                cluster.python, "-c", _SCAN, job_id], check=False, timeout=300)
        found += [f"{n}: {x}" for x in p.stdout.splitlines() if x.strip()]
    return found


def assert_no_survivors(cluster: Cluster, j: Job, within: float = 15.0) -> None:
    """SLURM reaps a finished job's steps asynchronously (KillWait): allow `within` seconds, then fail."""
    deadline = time.monotonic() + within
    left = survivors(cluster, j.id)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = survivors(cluster, j.id)
    assert not left, f"processes of job {j.id} survived it:\n" + "\n".join(left) + "\n" + j.describe()


def expand_nodes(nodelist: str) -> list[str]:
    if not nodelist or nodelist == "(null)":
        return []
    p = sh(["scontrol", "show", "hostnames", nodelist], check=False)
    return p.stdout.split()


# ------------------------------------------------------------------------------------------ discovery


def sinfo_nodes() -> tuple[list[str], str]:
    """(idle-or-usable node names, raw sinfo text)."""
    if shutil.which("sinfo") is None:
        return [], "sinfo not found"
    p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %G %P"], capture_output=True, text=True, timeout=20,
                       check=False)
    if p.returncode != 0:
        return [], (p.stderr or p.stdout).strip()
    nodes = sorted({ln.split()[0] for ln in p.stdout.splitlines()
                    if len(ln.split()) >= 2 and re.match(r"^(idle|mixed|allocated|completing)", ln.split()[1])})
    return nodes, p.stdout


def gpus_of(sinfo_text: str) -> int:
    counts = [int(m.group(1)) for m in re.finditer(r"gpu(?::[^:\s,(]+)?:(\d+)", sinfo_text)]
    return min(counts) if counts else 0


def nodes_are_local() -> bool:
    p = sh(["scontrol", "show", "nodes", "-o"], check=False)
    me = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}
    hosts = set(re.findall(r"NodeHostName=(\S+)", p.stdout))
    return bool(hosts) and hosts <= me
