"""`slurm.exclusive: false` without `cpus_per_task` (issue 17): the job asks SLURM for a CPU per process the plan
runs on a node (vLLM workers + trainer processes), as `sbatch --test-only` on the cluster reports; before, it
held 1 processor for a TP=2 server plus 2 trainer ranks."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from slurmkit import Cluster, render

pytestmark = pytest.mark.slurm


def _spec(cluster: Cluster, work: Path, **slurm: object) -> dict[str, object]:
    s: dict[str, object] = {"gpus_per_node": 4, "exclusive": False, **slurm}
    if cluster.partition:
        s["partition"] = cluster.partition
    return {
        "job": {"name": "lg-cpus", "output_dir": str(work / "runs" / "%j"), "port_offset": "job_id"},
        "slurm": s,
        "model": {"name_or_path": "org/model"},
        "vllm": {"mode": "server", "gpus": [0, 1], "tensor_parallel_size": 2},
        "train": {"gpus": [2, 3], "args": {"data": {"path": "d.jsonl"}, "num_generations": 4}},
    }


def _processors(script: Path) -> int:
    p = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, cwd=script.parent,
                       check=False)
    m = re.search(r"using (\d+) processors", p.stderr)
    assert p.returncode == 0 and m, f"sbatch --test-only: {p.stderr}"
    return int(m.group(1))


def test_a_shared_node_job_requests_a_cpu_per_process(cluster: Cluster) -> None:
    work = cluster.shared_dir / "shared-cpus"
    script = render(cluster, _spec(cluster, work), work)
    assert "#SBATCH --cpus-per-task=4\n" in script.read_text()
    assert _processors(script) >= 4  # TP 2 server workers + 2 trainer processes on the one node


def test_an_explicit_cpus_per_task_wins(cluster: Cluster) -> None:
    work = cluster.shared_dir / "shared-cpus-explicit"
    script = render(cluster, _spec(cluster, work, cpus_per_task=6), work)
    text = script.read_text()
    assert text.count("--cpus-per-task=") >= 1 and "#SBATCH --cpus-per-task=6\n" in text
    assert _processors(script) >= 6
    assert yaml.safe_load((work / "spec.yaml").read_text())["slurm"]["cpus_per_task"] == 6
