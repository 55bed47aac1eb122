"""`vllm.replicas`: placement (launchgen.planning.replicas), the plan per replica, ports, checks, rendered scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from launchgen.trainers.declarations.config import TrainerConfig, apply_override

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec, load_spec_text
from launchgen.planning.plan import Plan, build_plan
from launchgen.planning.replicas import place
from launchgen.script.render import render_files, render_script
from launchgen.shared.layout import resolve_layout

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two-replicas.yaml"

BASE = """
job: {name: t}
model: {name_or_path: org/model}
train:
  args:
    data: {path: d.jsonl}
"""


def spec(**sections: str) -> str:
    data = yaml.safe_load(BASE)
    for key, value in sections.items():
        loaded = yaml.safe_load(value)
        data[key] = {**data.get(key, {}), **loaded} if isinstance(loaded, dict) else loaded
    return yaml.safe_dump(data)


def plan_of(text: str) -> Plan:
    return build_plan(load_spec_text(text, "t.yaml"))


def words(argv: tuple[object, ...]) -> list[str]:
    return [str(w) for w in argv]


# -- placement ------------------------------------------------------------------------------------------------
def test_shared_node_gpus_cut_into_slices() -> None:
    lay = resolve_layout(load_spec_text(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 2, replicas: 2}"),
                                        "t.yaml").spec)
    placed = place(lay, 2)
    assert placed is not None
    assert [(r.positions, r.gpus, r.name) for r in placed] == [((0,), (0, 1), "server"), ((0,), (2, 3), "server-r1")]


def test_dedicated_nodes_whole_nodes_or_slices() -> None:
    # one replica per node: TP 8 on 8-GPU nodes
    lay = resolve_layout(load_spec_text(spec(vllm="{nodes: 2, tensor_parallel_size: 8, replicas: 2}"), "t.yaml").spec)
    assert [(r.positions, r.gpus) for r in place(lay, 2) or ()] == [((1,), tuple(range(8))), ((2,), tuple(range(8)))]
    # a replica over two nodes (TP 8 x DP 2 on 8-GPU nodes), two of them
    lay = resolve_layout(load_spec_text(spec(vllm="{nodes: 4, tensor_parallel_size: 8, data_parallel_size: 2, "
                                              "replicas: 2}"), "t.yaml").spec)
    assert [r.positions for r in place(lay, 2) or ()] == [(1, 2), (3, 4)]
    assert lay.multi_node_dp and lay.data_parallel_size_local == 1
    # four replicas of TP 4 on two nodes: two per node
    lay = resolve_layout(load_spec_text(spec(vllm="{nodes: 2, tensor_parallel_size: 4, replicas: 4}"), "t.yaml").spec)
    assert [(r.positions, r.gpus) for r in place(lay, 4) or ()] == [
        ((1,), (0, 1, 2, 3)), ((1,), (4, 5, 6, 7)), ((2,), (0, 1, 2, 3)), ((2,), (4, 5, 6, 7))]
    # 6-GPU replicas on 8-GPU nodes do not cut
    lay = resolve_layout(load_spec_text(spec(vllm="{nodes: 3, tensor_parallel_size: 2, data_parallel_size: 3, "
                                              "replicas: 4}"), "t.yaml").spec)
    assert place(lay, 4) is None


def test_slots_carry_the_replica_and_its_own_ranks() -> None:
    plan = plan_of(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 2, replicas: 2}"))
    server = [(s.gpu, s.replica, s.tp_rank, s.global_rank) for s in plan.nodes[0].slots if s.role == "server"]
    assert server == [(0, 0, 0, 0), (1, 0, 1, 1), (2, 1, 0, 0), (3, 1, 1, 1)]


# -- plan -----------------------------------------------------------------------------------------------------
def test_each_replica_has_its_gpus_ports_and_commands() -> None:
    plan = plan_of(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 2, replicas: 2, port: 9000, "
                             "group_port: 29600}"))
    s = plan.server
    assert s is not None and s.multi_replica and [r.role for r in s.replicas] == ["server", "server-r1"]
    r0, r1 = s.replicas
    assert {e.name: e.value for e in r0.env}["CUDA_VISIBLE_DEVICES"] == '"$(lg_select_gpus 0 1)"'
    assert {e.name: e.value for e in r1.env}["CUDA_VISIBLE_DEVICES"] == '"$(lg_select_gpus 2 3)"'
    a0, a1 = words(r0.commands[0].argv), words(r1.commands[0].argv)
    assert a0[a0.index("--port") + 1] == "${LG_SERVER_PORT}" and a1[a1.index("--port") + 1] == "${LG_SERVER_PORT_R1}"
    got = {(p.name, p.replica): (p.base, p.var) for p in plan.ports}
    assert got[("server_http", 1)] == (9001, "LG_SERVER_PORT_R1") and got[("group", 1)] == (29601, "LG_GROUP_PORT_R1")
    assert "generation.vllm_server.replicas=${LG_REPLICAS_YAML}" in words(plan.trainer.argv)
    assert [r.model_dump() for r in plan.trainer.config.generation.vllm_server.replicas] == [
        {"host": "127.0.0.1", "port": 9000, "group_port": 29600}, {"host": "127.0.0.1", "port": 9001, "group_port": 29601}]


def test_one_replica_plans_as_before() -> None:
    plan = plan_of(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 4}"))
    s = plan.server
    assert s is not None and not s.multi_replica and len(s.replicas) == 1 and s.replicas[0].commands == s.commands
    assert not any("replicas" in w for w in words(plan.trainer.argv))
    assert plan.trainer.config.generation.vllm_server.replicas == []


def test_replica_ports_are_checked_like_any_port() -> None:
    # replica 1's HTTP port 8001 is the group port
    loaded = load_spec_text(spec(vllm="{gpus: [0, 1], tensor_parallel_size: 1, replicas: 2, group_port: 8001}"),
                            "t.yaml")
    _, issues = run_checks(loaded, env={})
    errors = [i for i in issues if i.severity == "error"]
    assert [(i.code, i.path) for i in errors] == [("LG402", "vllm.port")]
    assert "HTTP port of replica 1 8001 equals" in errors[0].message, errors[0].message


def test_lg201_counts_replicas_and_lg220_stands_down() -> None:
    loaded = load_spec_text(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 4, replicas: 2}"), "t.yaml")
    _, issues = run_checks(loaded, env={})
    errors = [i for i in issues if i.severity == "error"]
    assert [i.code for i in errors] == ["LG201"] and "x replicas 2 = 8" in errors[0].message


# -- rendered scripts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sched", ["sbatch", "bash"])
def test_rendered_script_starts_and_watches_every_replica(sched: str, tmp_path: Path) -> None:
    plan = build_plan(load_spec(EXAMPLE))
    script = render_script(plan, sched)  # type: ignore[arg-type]
    files = render_files(plan, sched)  # type: ignore[arg-type]
    assert {"steps/server.sh", "steps/server-r1.sh"} <= set(files)
    assert 'exec >>"$LG_LOG_DIR/server-r1-$LG_NODE.log"' in files["steps/server-r1.sh"]
    assert '"$(lg_select_gpus 2 3)"' in files["steps/server-r1.sh"]
    for k, pid in ((0, "LG_SERVER_PID"), (1, "LG_SERVER_PID_R1")):
        assert f'lg_event "server_start nodes=$LG_SERVER_NODES{"_R1" if k else ""} replica={k}"' in script
        assert f'if ! kill -0 "${pid}" 2>/dev/null; then' in script
        assert f"replica={k}\" \"the vLLM server replica {k} exited" in script
    assert 'lg_stop "$LG_SERVER_PID_R1" "vLLM server replica 1" server-r1' in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_replicas_yaml_the_script_builds_is_what_the_trainer_reads() -> None:
    """The value of LG_REPLICAS_YAML, with the script's own quoting of the hosts, parses into the config."""
    plan = build_plan(load_spec(EXAMPLE))
    script = render_script(plan, "sbatch")
    line = next(x for x in script.splitlines() if x.startswith("LG_REPLICAS_YAML="))
    env = {"LG_SERVER_HOST_YAML": "'node 1'", "LG_SERVER_HOST_YAML_R1": "'n''2'", "LG_SERVER_PORT": "8010",
           "LG_GROUP_PORT": "29561", "LG_SERVER_PORT_R1": "8011", "LG_GROUP_PORT_R1": "29562"}
    value = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$LG_REPLICAS_YAML"'], env=env, check=True,
                           capture_output=True, text=True).stdout
    data = plan.trainer.config.model_dump(mode="json")
    apply_override(data, f"generation.vllm_server.replicas={value}")
    cfg = TrainerConfig.model_validate(data)
    assert [(r.host, r.port, r.group_port) for r in cfg.generation.vllm_server.replicas] == [
        ("node 1", 8010, 29561), ("n'2", 8011, 29562)]


def test_restart_replicas_reaches_the_trainer_and_the_script() -> None:
    plan = build_plan(load_spec(EXAMPLE))
    assert plan.server is not None and plan.server.max_replica_restarts == 3
    assert plan.trainer.config.generation.vllm_server.replica_failover is True
    script = render_script(plan, "bash")
    assert 'lg_event "replica_restart replica=1 restart=$LG_RESTARTS_R1 exit=$LG_SERVER_RC"' in script
    assert "if ((LG_RESTARTS_R1 < 3)); then" in script
    off = plan_of(spec(vllm="{gpus: [0, 1, 2, 3], tensor_parallel_size: 2, replicas: 2}"))
    assert off.server is not None and off.server.max_replica_restarts == 0
    assert off.trainer.config.generation.vllm_server.replica_failover is False
    assert "lg_event \"replica_restart" not in render_script(off, "bash")


def test_status_tells_each_replicas_state() -> None:
    from launchgen.readback.jobfiles import parse_events_text
    from launchgen.readback.postmortem import replica_states

    text = "\n".join([
        "2026-12-03T10:00:00Z server_start nodes=n1 replica=0", "2026-12-03T10:00:00Z server_start nodes=n1 replica=1",
        "2026-12-03T10:00:09Z server_healthy after=9s replica=0", "2026-12-03T10:00:10Z server_healthy after=10s replica=1",
        "2026-12-03T10:01:00Z replica_restart replica=1 restart=1 exit=137",
    ])
    got = [(r.index, r.state, r.restarts) for r in replica_states(parse_events_text(text, 0))]
    assert got == [(0, "healthy", 0), (1, "restarting", 1)]
    assert replica_states(parse_events_text("2026-12-03T10:00:00Z server_start nodes=n1", 0)) == []
