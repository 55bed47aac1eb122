"""Scale (issue 37): `check` and `plan` linear in nodes and replicas, absurd counts refused with a code before
anything is derived from them, and findings that repeat per replica folded into one line."""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_cases import EXAMPLES, VARIANTS, plan_for
from tools import tool, unwrapped

from launchgen.checks import run_checks
from launchgen.checks.runner import FOLD_FROM, fold_alike
from launchgen.checks.spec.scriptsize import max_script_size_of
from launchgen.input.bounds import MAX_NODES
from launchgen.input.loader import load_spec_text
from launchgen.script.render import render_script
from launchgen.script.schedulers import SBATCH_MAX_SCRIPT_SIZE
from launchgen.shared import jobdir as J
from launchgen.shared import noderuns
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


# ------------------------------------------------------------------------------ the script's size ---


def _plan_of(tmp: Path, example: str = "multi-node-70b", **sections: dict[str, Any]) -> Any:
    data = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    for name, values in sections.items():
        data[name].update(values)
    plan, issues = run_checks(load_spec_text(yaml.safe_dump(data, sort_keys=False), "spec.yaml"), env={})
    return plan, issues


@pytest.mark.parametrize("nodes", [16_384, MAX_NODES - 1])
def test_the_script_does_not_grow_with_the_trainer_node_count(tmp_path: Path, nodes: int) -> None:
    """SLURM refuses a script over max_script_size (4 MB by default): one layout line and one run-record entry
    per node made it 6.03 MiB at 16,384 trainer nodes. Runs of alike nodes are one line and one entry now."""
    small, _ = _plan_of(tmp_path, train={"nodes": 4})
    big, issues = _plan_of(tmp_path, train={"nodes": nodes})
    assert big is not None, [i.format() for i in issues if i.severity == "error"]
    size = len(render_script(big, "sbatch").encode())
    assert size < SBATCH_MAX_SCRIPT_SIZE
    # the same as 4 nodes' but for the digits of the counts (a few hundred bytes at most)
    assert size - len(render_script(small, "sbatch").encode()) < 1024


def test_the_static_record_expands_to_the_per_node_record_exactly(tmp_path: Path) -> None:
    """What every reader sees (`RunRecord.from_json`, the run-record writer) is the per-node list the plan has."""
    for plan in [plan_for(name) for name in (*EXAMPLES, *VARIANTS)] + \
            [_plan_of(tmp_path, "pp-two-node-server", train={"nodes": 300}, vllm={"nodes": 6, "pipeline_parallel_size": 6})[0]]:
        per_node = plan.to_json()
        static = json.loads(json.dumps(plan.static_record()))
        assert noderuns.expand_record(static) == per_node, plan.job_name
        assert J.RunRecord.from_json(static).to_json() == per_node
    assert len(static["nodes"]) < 6 and static["trainer"]["positions"] == "0-299"


def test_fold_and_expand_are_inverses_on_irregular_runs() -> None:
    nodes = [{"position": p, "roles": ["trainer"], "machine_rank": m, "server_rank": None, "g": g}
             for p, m, g in [(0, 0, 1), (1, 1, 1), (2, 2, 1), (3, 4, 1), (4, 5, 2), (5, None, 2), (6, None, 2)]]
    folded = noderuns.fold_nodes(nodes)
    assert [(e["position"], e.get("count", 1)) for e in folded] == [(0, 3), (3, 1), (4, 1), (5, 2)]
    assert noderuns.expand_nodes(folded) == nodes
    assert noderuns.ranges_list(noderuns.ranges_text([0, 1, 2, 5, 7, 8])) == [0, 1, 2, 5, 7, 8]
    # a hand-edited record: what is not a run stays as it is, and no count expands past the cap
    odd = [{"position": 0, "count": 10**12}, {"position": "x", "count": 2}, "node"]
    assert noderuns.expand_nodes(odd) == odd


def test_the_layout_header_folds_runs_and_keeps_the_server_leader(tmp_path: Path) -> None:
    plan, _ = _plan_of(tmp_path, "pp-two-node-server", train={"nodes": 300}, vllm={"nodes": 6, "pipeline_parallel_size": 6})
    header = render_script(plan, "sbatch").split("# ports", 1)[0].split("# layout", 1)[1]
    assert header.splitlines()[1:] == [
        "#   nodes 0-299: trainer machine ranks 0-299, GPUs 0-7",
        "#   node 300: server leader GPUs 0-7 (TP 8)",
        "#   nodes 301-305: server GPUs 0-7 (TP 8)",
    ]


def test_a_long_run_of_nodes_is_an_array_slice_that_picks_the_same_nodes(tmp_path: Path) -> None:
    """LG_TRAIN_NODES / LG_TRAIN_NODELIST of 300 nodes, run by bash against a made-up allocation."""
    plan, _ = _plan_of(tmp_path, train={"nodes": 300})
    script = render_script(plan, "sbatch")
    lines = [ln for ln in script.splitlines() if ln.startswith(("LG_TRAIN_NODES=", "LG_TRAIN_NODELIST="))]
    assert all(len(ln) < 80 for ln in lines), lines
    names = [f"n{i:03d}" for i in range(301)]
    out = subprocess.run(["bash", "-c", f"LG_NODES=({' '.join(names)})\n" + "\n".join(lines) +
                          '\nprintf "%s\\n" "$LG_TRAIN_NODES" "$LG_TRAIN_NODELIST"'],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [" ".join(names[:300]), ",".join(names[:300])]


def test_a_script_over_max_script_size_is_refused_with_its_size_and_the_limit(tmp_path: Path) -> None:
    """What still grows is per server rank: a 7,000-node pipeline-parallel server replica."""
    huge = {"nodes": 7000, "pipeline_parallel_size": 7000}
    plan, issues = _plan_of(tmp_path, "pp-two-node-server", vllm=huge)
    [lg815] = [i for i in issues if i.code == "LG815"]
    assert plan is None and lg815.severity == "error" and lg815.path == "vllm.nodes"
    assert "max_script_size is 4,194,304 bytes" in lg815.message and "SLURM's default" in lg815.message
    # a cluster that allows more (check --live read it): an info that another cluster may refuse it
    data = yaml.safe_load((ROOT / "examples" / "pp-two-node-server.yaml").read_text())
    data["vllm"].update(huge)
    loaded = load_spec_text(yaml.safe_dump(data, sort_keys=False), "spec.yaml")
    plan, issues = run_checks(loaded, env={}, script_limit=64 << 20)
    assert plan is not None and [i.severity for i in issues if i.code == "LG815"] == ["info"]
    plan, issues = run_checks(loaded, env={}, script_limit=1 << 20)
    assert [i.severity for i in issues if i.code == "LG815"] == ["error"]


def test_max_script_size_is_read_from_scontrol_show_config() -> None:
    config = "Configuration data as of 2026-12-06T11:00:00\nSchedulerParameters     = {}\nSchedulerType = sched/backfill\n"
    assert max_script_size_of(config.format("bf_interval=1,max_script_size=67108864")) == 64 << 20
    assert max_script_size_of(config.format("max_script_size=8000000")) == 8_000_000
    assert max_script_size_of(config.format("bf_interval=1")) is None
    assert max_script_size_of(config.format("(null)")) is None


@pytest.mark.slurm
def test_check_live_reads_this_clusters_max_script_size(tmp_path: Path) -> None:
    """The local cluster sets no max_script_size: check --live judges against the default, as without --live."""
    p = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True)
    assert max_script_size_of(p.stdout) is None
    p = subprocess.run([tool("launchgen"), "check", "--live", "--no-files", "--format", "json",
                        str(_spec(tmp_path, train={"nodes": 4}))], capture_output=True, text=True, timeout=120)
    assert "max_script_size" not in p.stdout, p.stdout


def test_the_jobs_record_writer_expands_the_static_record(tmp_path: Path) -> None:
    """launchgen-plan.json, as the job writes it with the node's plain python3, has today's per-node entries."""
    plan, _ = _plan_of(tmp_path, "pp-two-node-server", train={"nodes": 300}, vllm={"nodes": 6, "pipeline_parallel_size": 6})
    static = tmp_path / J.STATIC_PLAN_FILE
    static.write_text(json.dumps(plan.static_record()))
    (tmp_path / "logs").mkdir()
    names = [f"n{i}" for i in range(plan.num_nodes)]
    env = {"PATH": "/usr/bin:/bin", "LG_NODE_LIST": " ".join(names), "LG_ATTEMPT": "1", "LG_JOB_DIR": str(tmp_path),
           "LG_SCHEDULER": "sbatch", "LG_JOB_ID": "42", "LG_RESTART_COUNT": "0", "LG_LOG_DIR": str(tmp_path / "logs"),
           "LG_PORT_OFFSET": "0", J.ENV_PID_DIR: str(tmp_path / "run")} | {p.var: str(p.base) for p in plan.ports}
    subprocess.run(["python3", "-S", "-", str(static), str(tmp_path / J.PLAN_FILE)], input=J.RUN_RECORD_WRITER,
                   text=True, env=env, check=True)
    written = json.loads((tmp_path / J.PLAN_FILE).read_text())
    want = plan.to_json()
    assert written["nodes"] == [n | {"name": names[n["position"]]} for n in want["nodes"]]
    assert (written["trainer"], written["server"]) == (want["trainer"], want["server"])
    assert len(written["logs"]["trainer"]) == 300
