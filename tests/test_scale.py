"""Scale (issue 37): `check` and `plan` linear in nodes and replicas, absurd counts refused with a code before
anything is derived from them, and findings that repeat per replica folded into one line."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tools import tool, unwrapped

from launchgen.checks import run_checks
from launchgen.checks.runner import FOLD_FROM, fold_alike
from launchgen.input.bounds import MAX_NODES
from launchgen.input.loader import load_spec_text
from launchgen.shared.issues import Issue

ROOT = Path(__file__).resolve().parents[1]


def _spec(tmp: Path, **sections: dict[str, Any]) -> Path:
    """examples/multi-node-70b.yaml (4 trainer nodes of 8 GPUs, one TP=8 server node) with sections merged in."""
    data = yaml.safe_load((ROOT / "examples" / "multi-node-70b.yaml").read_text())
    for name, values in sections.items():
        data[name].update(values)
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _check(spec: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # a bounded address space: a count that is expanded before it is refused fails here with MemoryError (exit 1)
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([tool("launchgen"), "check", "--no-files", str(spec)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, cwd=spec.parent)


def _check_seconds(tmp: Path, nodes: int) -> float:
    """`check`'s own work (the checks, the plan they build), best of three: a loaded machine is not its cost."""
    loaded = load_spec_text(_spec(tmp, train={"nodes": nodes}).read_text(), "spec.yaml")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        plan, issues = run_checks(loaded, env={})
        best = min(best, time.perf_counter() - start)
        assert plan is not None, [i.format() for i in issues if i.severity == "error"]
    return best


def test_check_of_4096_trainer_nodes_costs_a_fraction_of_a_second(tmp_path: Path) -> None:
    """0.82 s before (per-node position lookups in tuples), 0.14 s after, on the loaded 2-core machine; the
    process's start (imports) adds about 0.6 s: `launchgen check` of this spec takes about 1 s."""
    took = _check_seconds(tmp_path, 4096)
    assert took < 0.3, took


def test_checks_and_plan_are_linear_in_nodes(tmp_path: Path) -> None:
    """Eight times the nodes cost about eight times as much (sixteen is the margin; it was over twenty)."""
    ratio = _check_seconds(tmp_path, 4096) / _check_seconds(tmp_path, 512)
    assert ratio < 16, ratio


@pytest.mark.parametrize(("section", "field", "value"), [
    ("train", "nodes", 100_000_000),
    ("train", "nodes", 10**20),
    ("vllm", "nodes", 100_000_000),
    ("vllm", "replicas", 10**21),
    ("slurm", "max_restarts", 10**21),
    ("slurm", "cpus_per_task", 10**21),
    ("vllm", "health_timeout", 10**21),
])
def test_absurd_counts_are_refused_with_a_code_and_the_field(tmp_path: Path, section: str, field: str,
                                                              value: int) -> None:
    p = _check(_spec(tmp_path, **{section: {field: value}}), timeout=30)
    assert p.returncode == 2, p.stderr
    assert f"error LG004 [{section}.{field}] Input should be less than or equal to" in unwrapped(p.stderr), unwrapped(p.stderr)
    assert "internal error" not in unwrapped(p.stderr)


def test_the_nodes_of_both_roles_together_are_bounded(tmp_path: Path) -> None:
    p = _check(_spec(tmp_path, train={"nodes": MAX_NODES}, vllm={"nodes": 1}))
    assert p.returncode == 2 and "error LG108 [vllm.nodes]" in unwrapped(p.stderr), p.stderr


def test_per_replica_findings_are_one_line_with_a_count(tmp_path: Path) -> None:
    """1,024 replicas with ports in the ephemeral range: LG222 refuses the count; the port findings are one line
    per field, and the pairwise port checks (job.port_offset: job_id) see only the replicas LG222 allows."""
    spec = _spec(tmp_path, job={"port_offset": "job_id"},
                 vllm={"nodes": 1024, "replicas": 1024, "port": 40000, "group_port": 39000})
    p = _check(spec, timeout=30)
    assert p.returncode == 2 and "LG222 [vllm.replicas]" in unwrapped(p.stderr), p.stderr
    lg403 = [line for line in unwrapped(p.stderr).splitlines() if " LG403 " in line]
    # replica 0's port is named as the field's own, the others as "of replica k": two lines per field
    assert len(lg403) == 4, lg403
    assert sum("more like it" in line for line in lg403) == 2, lg403


def _issue(path: str, message: str, code: str = "LG403") -> Issue:
    return Issue(code, path, message, "Fix it.", "warning", 3, "spec.yaml")


def test_fold_keeps_the_first_of_alike_findings_with_a_count_and_leaves_the_rest() -> None:
    alike = [_issue(f"vllm.gpus.{k}", f"GPU {k} is out of range") for k in range(FOLD_FROM + 2)]
    few = [_issue(f"train.gpus.{k}", f"GPU {k} is out of range") for k in range(FOLD_FROM - 1)]
    other = _issue("vllm.port", "port 1 is taken", "LG402")
    out = fold_alike([*alike, other, *few])
    assert out[0].message == f"GPU 0 is out of range (and {FOLD_FROM + 1} more like it)"
    assert out[1:] == [other, *few]
