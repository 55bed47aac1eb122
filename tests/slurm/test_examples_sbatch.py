"""Every bundled example's sbatch script is accepted by the real `sbatch --test-only` on a cluster shaped like it.

The local cluster is started with the partitions the examples name (`-q debug,gpu`, see .ci/run); where it
lacks one (started by hand without it), it is reconfigured once with every partition the examples need.
On your own cluster (LAUNCHGEN_SLURM_EXTERNAL=1) an example whose shape the cluster lacks is skipped, naming
what is missing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import LOCAL_GPUS, LOCAL_NODES, start_local_cluster
from slurmkit import REPO, Cluster, launchgen_cmd, sh

pytestmark = pytest.mark.slurm

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _all_directives(script: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in script.splitlines():
        m = re.match(r"^#SBATCH\s+--([a-z-]+)(?:=(.*))?$", line.strip())
        if m:
            out.append((m.group(1), m.group(2) or ""))
    return out


def _directives(script: str) -> dict[str, str]:
    """The first value of each option: a heterogeneous job's component 0 (the trainers)."""
    out: dict[str, str] = {}
    for key, value in _all_directives(script):
        out.setdefault(key, value)
    return out


def _untyped_gres(script: str) -> str:
    """The local cluster's fake GPUs have no type: `--gres=gpu:h100:8` asks for 8 GPUs of any type there."""
    return re.sub(r"^(#SBATCH\s+--gres=gpu):[^:\s]+:(\d+)$", r"\1:\2", script, flags=re.M)


def _nodes_at_most(script: str, nodes: int) -> str:
    """The local cluster has 5 nodes; the multi-node server examples ask for 6 and 10 (their server nodes after the
    trainer nodes a 235B/405B model needs). There the count is lowered to the cluster's: every other directive is
    still judged by the real sbatch, and `test_test_only_refuses_what_the_cluster_cannot_run` shows a count over
    the cluster's is refused."""
    return re.sub(r"^(#SBATCH\s+--nodes=)(\d+)$", lambda m: m.group(1) + str(min(int(m.group(2)), nodes)), script,
                  flags=re.M)


def _partitions() -> set[str]:
    p = sh(["sinfo", "-h", "-o", "%R"], check=False)
    return set(p.stdout.split())


def _render(cluster: Cluster, example: Path, out: Path) -> str:
    p = subprocess.run([*launchgen_cmd(cluster), "render", str(example), "-o", str(out), "--force"],
                       capture_output=True, text=True, cwd=REPO, check=False)
    assert p.returncode == 0, f"launchgen render {example.name} exited {p.returncode}:\n{p.stderr}"
    return out.read_text()


@pytest.fixture(scope="module")
def shaped(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Render every example; make the local cluster carry every partition they name. -> name: script path."""
    d = tmp_path_factory.mktemp("examples")
    scripts = {}
    needed: set[str] = set()
    for ex in EXAMPLES:
        text = _render(cluster, ex, d / f"{ex.stem}.sbatch")
        scripts[ex.name] = str(d / f"{ex.stem}.sbatch")
        needed |= {v for k, v in _all_directives(text) if k == "partition" and v}  # every hetjob component's
    have = _partitions()
    if cluster.local and not needed <= have:
        parts = ["debug", *sorted(needed - {"debug"})]
        start_local_cluster(LOCAL_NODES, LOCAL_GPUS, ("-q", ",".join(parts)))
    return scripts


def test_there_are_examples() -> None:
    assert EXAMPLES, "no examples/*.yaml"


@pytest.mark.parametrize("example", [e.name for e in EXAMPLES])
def test_sbatch_test_only_accepts_example(cluster: Cluster, shaped: dict[str, str], example: str) -> None:
    script = Path(shaped[example])
    d = _directives(script.read_text())
    nodes = int(d.get("nodes", "1"))
    gpus = int(re.sub(r"^.*:", "", d.get("gres", d.get("gpus-per-node", "0"))) or 0)
    missing = []
    if nodes > len(cluster.nodes) and not cluster.local:
        missing.append(f"{nodes} nodes (cluster has {len(cluster.nodes)})")
    if gpus > cluster.gpus_per_node:
        missing.append(f"{gpus} GPUs per node (cluster has {cluster.gpus_per_node})")
    missing += [f"partition {v}" for k, v in _all_directives(script.read_text())
                if k == "partition" and v and v not in _partitions()]
    if missing:
        assert not cluster.local, f"the local cluster lacks {', '.join(missing)} for {example}"
        pytest.skip(f"{example} needs {', '.join(missing)} on this cluster")
    if cluster.local:
        script = script.with_suffix(".untyped.sbatch")
        script.write_text(_nodes_at_most(_untyped_gres(Path(shaped[example]).read_text()), len(cluster.nodes)))
    p = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=script.parent,
                       check=False)
    assert p.returncode == 0 and "to start at" in p.stderr, (
        f"sbatch --test-only refused {example} (exit {p.returncode}): {p.stderr.strip()}")


def test_test_only_refuses_what_the_cluster_cannot_run(cluster: Cluster, tmp_path: Path) -> None:
    """The check can fail: one node more than the cluster has is refused at submit time (EnforcePartLimits=ALL)."""
    script = tmp_path / "too-big.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes={len(cluster.nodes) + 1}\ntrue\n")
    p = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, check=False)
    assert p.returncode != 0, p.stderr
