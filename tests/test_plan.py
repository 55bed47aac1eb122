"""Plan resolution: layouts resolve to the expected GPU maps, TP groups, ports, env and commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec, load_spec_text
from launchgen.planning.plan import (
    HEALTH_CLIENT_MARGIN_S,
    Plan,
    PlanInvariantError,
    Ref,
    bash_issues,
    build_plan,
    resolve_gpus,
    resolve_precision,
    spec_hash,
)
from launchgen.shared.issues import SpecError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def plan_of(text: str) -> Plan:
    return build_plan(load_spec_text(text, "t.yaml"))


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
        if isinstance(data.get(key), dict) and isinstance(loaded, dict):
            data[key].update(loaded)
        else:
            data[key] = loaded
    return yaml.safe_dump(data)


def words(argv: tuple[object, ...]) -> list[str]:
    return [str(w) for w in argv]


def env_of(env: tuple[object, ...]) -> dict[str, str]:
    return {e.name: e.value for e in env}  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- layouts

def test_single_node_split_example() -> None:
    plan = build_plan(load_spec(EXAMPLES / "single-node-split.yaml"))
    assert plan.num_nodes == 1 and plan.vllm_mode == "server"
    node = plan.nodes[0]
    assert node.roles == ("server", "trainer") and node.shared
    assert node.server_gpus == (0, 1, 2, 3) and node.trainer_gpus == (4, 5, 6, 7)
    assert [(s.gpu, s.role, s.tp_rank, s.global_rank) for s in node.slots] == [
        (0, "server", 0, 0), (1, "server", 1, 1), (2, "server", 2, 2), (3, "server", 3, 3),
        (4, "trainer", None, 0), (5, "trainer", None, 1), (6, "trainer", None, 2), (7, "trainer", None, 3)]
    assert {p.name: (p.base, p.host_position) for p in plan.ports} == {
        "main_process": (29500, 0), "server_http": (8000, 0), "group": (29510, 0)}
    argv = words(plan.server.commands[0].argv)  # type: ignore[union-attr]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B"]
    joined = " ".join(argv)
    for required in ('--weight-transfer-config {"backend": "nccl"}', "--logprobs-mode processed_logprobs",
                     "--max-logprobs -1", "--tensor-parallel-size 4", "--max-model-len 4096",
                     "--gpu-memory-utilization 0.9", "--dtype bfloat16", "--host ${LG_SERVER_BIND}",
                     "--port ${LG_SERVER_PORT}"):
        assert required in joined, required
    assert "--data-parallel-size" not in joined and "--api-server-count" not in joined
    t = plan.trainer
    assert (t.num_machines, t.num_processes, t.processes_per_node) == (1, 4, 4)
    targv = words(t.argv)
    assert targv[:2] == ["accelerate", "launch"]
    assert targv[targv.index("--num_processes") + 1] == "4"
    assert targv[targv.index("--machine_rank") + 1] == "${LG_MACHINE_RANK}"  # evaluated on the node
    assert targv[targv.index("-m") + 1: targv.index("-m") + 3] == ["launchgen.jobside.rank", "launchgen.trainers.grpo"]
    assert "generation.vllm_server.host=${LG_SERVER_HOST_YAML}" in targv
    assert "generation.vllm_server.group_port=${LG_GROUP_PORT}" in targv
    # dev mode only on the server; the trainer explicitly drops it
    senv, tenv = env_of(plan.server.env), env_of(t.env)  # type: ignore[union-attr]
    assert senv["VLLM_SERVER_DEV_MODE"] == "1" and "VLLM_SERVER_DEV_MODE" not in tenv
    assert "VLLM_SERVER_DEV_MODE" in t.unset_env
    assert senv["CUDA_VISIBLE_DEVICES"] == '"$(lg_select_gpus 0 1 2 3)"'
    assert tenv["CUDA_VISIBLE_DEVICES"] == '"$(lg_select_gpus 4 5 6 7)"'
    assert tenv["VLLM_HOST_IP"] == '"$LG_NODE_ADDR"'
    cfg = t.config
    assert cfg.generation.backend == "vllm_server" and cfg.trainer == "grpo"
    assert cfg.generation.vllm_server.health_timeout == 900 + HEALTH_CLIENT_MARGIN_S
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-7B" and cfg.model.attn_implementation == "sdpa"
    assert t.accelerate_config["distributed_type"] == "MULTI_GPU"
    assert "--gres=gpu:8" in plan.slurm.directives and "--signal=B:USR2@300" in plan.slurm.directives
    assert "--requeue" in plan.slurm.directives and "--open-mode=append" in plan.slurm.directives


def test_multi_node_70b_example() -> None:
    plan = build_plan(load_spec(EXAMPLES / "multi-node-70b.yaml"))
    assert plan.num_nodes == 5
    assert [n.roles for n in plan.nodes] == [("trainer",)] * 4 + [("server",)]
    assert [n.machine_rank for n in plan.nodes] == [0, 1, 2, 3, None]
    server_node = plan.nodes[4]
    assert server_node.server_gpus == tuple(range(8)) and server_node.server_rank == 0
    assert [s.tp_rank for s in server_node.slots] == list(range(8))
    assert plan.nodes[3].slots[-1].global_rank == 31
    ports = {p.name: p.host_position for p in plan.ports}
    assert ports == {"main_process": 0, "server_http": 4, "group": 0}  # rendezvous on trainer rank 0's node
    t = plan.trainer
    assert (t.num_machines, t.num_processes) == (4, 32)
    ds = t.accelerate_config["deepspeed_config"]
    assert t.accelerate_config["distributed_type"] == "DEEPSPEED" and ds["zero_stage"] == 3
    assert ds["zero3_init_flag"] is True and ds["deepspeed_multinode_launcher"] == "standard"
    assert "--nodes=5" in plan.slurm.directives and "--account=my-project" in plan.slurm.directives
    assert "--enable-prefix-caching" in words(plan.server.commands[0].argv)  # type: ignore[union-attr]
    assert env_of(t.env)["TOKENIZERS_PARALLELISM"] == "false"
    assert env_of(plan.server.env)["NCCL_ASYNC_ERROR_HANDLING"] == "1"  # type: ignore[union-attr]
    assert bash_issues(plan)[0].code == "LG909"


def test_multi_node_dp_server_gets_headless_followers() -> None:
    plan = plan_of(spec(vllm="{mode: server, nodes: 2, tensor_parallel_size: 4, data_parallel_size: 4}",
                        train="{nodes: 2}"))
    s = plan.server
    assert s is not None and s.positions == (2, 3) and s.data_parallel_size_local == 2 and s.multi_node_dp
    leader, follower = (words(c.argv) for c in s.commands)
    assert "--api-server-count" in leader and leader[leader.index("--api-server-count") + 1] == "1"
    assert "--headless" not in leader and "--host" in leader
    assert "--headless" in follower and "--host" not in follower and "--api-server-count" not in follower
    # one multi-node form for DP and TP/PP: vLLM infers each node's DP ranks from --node-rank
    for rank, argv in enumerate((leader, follower)):
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == "${LG_MASTER_ADDR}"
        assert argv[argv.index("--master-port") + 1] == "${LG_MASTER_PORT}"
        assert argv[argv.index("--data-parallel-rpc-port") + 1] == "${LG_DP_RPC_PORT}"
        assert "--data-parallel-start-rank" not in argv and "--data-parallel-address" not in argv
    node3 = plan.nodes[3]
    assert [(s.tp_rank, s.dp_rank) for s in node3.slots] == [(0, 2), (1, 2), (2, 2), (3, 2),
                                                              (0, 3), (1, 3), (2, 3), (3, 3)]
    assert {p.name: p.host_position for p in plan.ports}["dp_rpc"] == 2
    assert {p.name: p.host_position for p in plan.ports}["master"] == 2


def test_single_node_dp_has_no_rpc_port() -> None:
    plan = plan_of(spec(vllm="{mode: server, nodes: 1, tensor_parallel_size: 4, data_parallel_size: 2}"))
    assert plan.port("dp_rpc") is None
    argv = words(plan.server.commands[0].argv)  # type: ignore[union-attr]
    assert "--data-parallel-size-local" not in argv and argv[argv.index("--data-parallel-size") + 1] == "2"


def test_colocate_example() -> None:
    plan = build_plan(load_spec(EXAMPLES / "colocate.yaml"))
    assert plan.server is None and plan.vllm_mode == "colocate" and plan.trainer.colocate
    assert plan.nodes[0].roles == ("trainer",) and plan.nodes[0].trainer_gpus == tuple(range(8))
    assert {p.name for p in plan.ports} == {"main_process", "colocate_master"}
    cfg = plan.trainer.config
    assert cfg.generation.backend == "vllm_colocate"
    assert cfg.generation.vllm_colocate.gpu_memory_utilization == 0.3
    assert cfg.generation.vllm_colocate.enable_sleep_mode is True
    assert env_of(plan.trainer.env)["LAUNCHGEN_COLOCATE_MASTER_PORT"] == '"$LG_COLOCATE_MASTER_PORT"'
    assert plan.trainer.accelerate_config["fsdp_config"]["fsdp_version"] == 2
    assert not any(str(w).startswith("generation.vllm_server") for w in plan.trainer.argv)


def test_colocate_engine_settings_reach_the_trainer_only_when_set() -> None:
    base = plan_of(spec(vllm="{mode: colocate}")).trainer.config.generation.vllm_colocate
    assert base.kv_cache_memory_bytes is None and base.enforce_eager is False  # vLLM's own defaults
    col = plan_of(spec(vllm="{mode: colocate, kv_cache_memory_bytes: 268435456, enforce_eager: true}"))
    c = col.trainer.config.generation.vllm_colocate
    assert c.kv_cache_memory_bytes == 268435456 and c.enforce_eager is True


def test_sft_example_has_no_vllm() -> None:
    plan = build_plan(load_spec(EXAMPLES / "sft-no-vllm.yaml"))
    assert plan.vllm_mode == "none" and plan.server is None and plan.num_nodes == 2
    assert plan.trainer.config.generation.backend == "hf" and plan.trainer.module == "launchgen.trainers.sft"
    assert plan.trainer.accelerate_config["deepspeed_config"]["zero_stage"] == 2
    assert "--gpus-per-node=8" in plan.slurm.directives
    assert [p.name for p in plan.ports] == ["main_process"]


def test_local_cpu_example() -> None:
    plan = build_plan(load_spec(EXAMPLES / "local-cpu-quickstart.yaml"))
    assert plan.device == "cpu" and plan.trainer.num_processes == 1 and plan.nodes[0].slots == ()
    assert plan.trainer.accelerate_config["use_cpu"] is True
    assert plan.trainer.accelerate_config["distributed_type"] == "NO"
    assert plan.trainer.accelerate_config["mixed_precision"] == "no"
    assert env_of(plan.trainer.env)["CUDA_VISIBLE_DEVICES"] == ""
    assert not any(d.startswith(("--gres", "--gpus")) for d in plan.slurm.directives)
    assert "--no-requeue" in plan.slurm.directives and bash_issues(plan) == []


def test_trainer_gpus_default_to_the_rest_of_a_shared_node() -> None:
    a = resolve_gpus(load_spec_text(spec(vllm="{gpus: [0, 1]}", slurm="{gpus_per_node: 4}")).spec)
    assert a.server_gpus == (0, 1) and a.trainer_gpus == (2, 3) and a.shared_position == 0


def test_non_contiguous_gpu_positions_are_kept() -> None:
    plan = plan_of(spec(vllm="{gpus: [1, 6], tensor_parallel_size: 2}", train="{gpus: [0, 3, 5, 7]}", slurm="{gpus_per_node: 8}"))
    assert plan.nodes[0].server_gpus == (1, 6)
    assert env_of(plan.trainer.env)["CUDA_VISIBLE_DEVICES"] == '"$(lg_select_gpus 0 3 5 7)"'
    assert [s.gpu for s in plan.nodes[0].slots] == [0, 1, 3, 5, 6, 7]


def test_port_offset_flag_and_bind_address() -> None:
    plan = plan_of(spec(job="{port_offset: job_id}", vllm="{gpus: [0], bind: 10.1.2.3}"))
    assert plan.port_offset and plan.server is not None and plan.server.bind == "10.1.2.3"


def test_spec_hash_is_stable_and_sensitive() -> None:
    a = load_spec_text(spec(vllm="{gpus: [0]}")).spec
    b = load_spec_text(spec(vllm="{gpus: [0]}")).spec
    c = load_spec_text(spec(vllm="{gpus: [1]}")).spec
    assert spec_hash(a) == spec_hash(b) != spec_hash(c)
    assert plan_of(spec(vllm="{gpus: [0]}")).spec_hash == spec_hash(a)


def test_refs_name_documented_runtime_variables() -> None:
    from launchgen.planning.plan import runtime_var_documented

    for path in EXAMPLES.glob("*.yaml"):
        plan = build_plan(load_spec(path))
        argvs = [plan.trainer.argv] + ([c.argv for r in plan.server.replicas for c in r.commands]
                                       if plan.server else [])
        for argv in argvs:
            for w in argv:
                if isinstance(w, Ref):
                    assert runtime_var_documented(w.var), (path.name, w.var)
        for e in plan.endpoints:
            assert not isinstance(e.host, Ref) or runtime_var_documented(e.host.var), (path.name, e.host)


# ---------------------------------------------------------------------------------------------- precision

@pytest.mark.parametrize(("train", "expected"), [
    ("{}", "bf16"), ("{fp16: true}", "fp16"), ("{bf16: false}", "fp32"), ("{precision: fp16}", "fp16"),
    ("{precision: fp32, bf16: false}", "fp32"), ("{bf16: true}", "bf16"),
])
def test_precision_aliases(train: str, expected: str) -> None:
    assert resolve_precision(load_spec_text(spec(train=train)).spec) == expected


# ---------------------------------------------------------------------------------------------- LG9xx

# The rules the checks own: `check` reports each once (the same code and field the plan used to report where
# the checks had no rule of their own), and build_plan, given such a spec unchecked, fails as an internal error.
@pytest.mark.parametrize(("sections", "expected"), [
    ({"train": "{args: {data: {path: d}, output_dir: /x}}"}, ("LG902", "train.args.output_dir")),
    ({"train": "{args: {data: {path: d}, model: {name_or_path: x}}}"}, ("LG902", "train.args.model")),
    ({"vllm": "{gpus: [0]}", "train": "{args: {data: {path: d}, generation: {vllm_server: {port: 1}}}}"},
     ("LG505", "train.args.generation.vllm_server.port")),
    ({"vllm": "{gpus: [0]}", "train": "{args: {data: {path: d}, generation: {vllm_server: {port: 8000}}}}"},
     ("LG902", "train.args.generation.vllm_server.port")),
    ({"train": "{args: {data: {path: d}, generation: {backend: hf}}}"}, ("LG902", "train.args.generation.backend")),
    ({"vllm": "{mode: server}"}, ("LG104", "vllm.gpus")),
    ({"vllm": "{gpus: [0, 9], tensor_parallel_size: 2}"}, ("LG101", "vllm.gpus.1")),
    ({"vllm": "{gpus: [0, 0]}"}, ("LG102", "vllm.gpus.1")),
    ({"vllm": "{gpus: [0, 1, 1, 2], tensor_parallel_size: 4}"}, ("LG102", "vllm.gpus.2")),
    ({"vllm": "{gpus: [0, 1], tensor_parallel_size: 2}", "train": "{gpus: [1, 2], args: {data: {path: d}}}"},
     ("LG103", "train.gpus")),
    ({"vllm": "{gpus: [0, 1, 2, 3], tensor_parallel_size: 4}", "slurm": "{gpus_per_node: 4}"}, ("LG105", "vllm.gpus")),
    ({"vllm": "{nodes: 1, gpus: []}"}, ("LG903", "vllm.gpus")),
    ({"vllm": "{nodes: 1, gpus: []}", "train": "{device: cpu, args: {data: {path: d}}}"}, ("LG903", "vllm.gpus")),
    ({"train": "{device: cpu, args: {data: {path: d}}}", "vllm": "{mode: colocate}"}, ("LG908", "vllm")),
    ({"train": "{device: cpu, gpus: [0], args: {data: {path: d}}}"}, ("LG908", "train.gpus")),
    ({"vllm": "{gpus: [0, 1], tensor_parallel_size: 4}"}, ("LG201", "vllm.tensor_parallel_size")),
    ({"vllm": "{nodes: 2, gpus: [0, 1, 2], tensor_parallel_size: 2, data_parallel_size: 3}"},
     ("LG202", "vllm.tensor_parallel_size")),
    ({"vllm": "{mode: colocate, tensor_parallel_size: 3}"}, ("LG209", "vllm.tensor_parallel_size")),
    ({"vllm": "{mode: colocate, tensor_parallel_size: 16}"}, ("LG202", "vllm.tensor_parallel_size")),
    ({"vllm": "{mode: colocate, data_parallel_size: 2}"}, ("LG904", "vllm.data_parallel_size")),
    ({"slurm": "{env: {trainer: {CUDA_VISIBLE_DEVICES: '0'}}}"}, ("LG807", "slurm.env.trainer.CUDA_VISIBLE_DEVICES")),
    ({"slurm": "{env: {all: {LAUNCHGEN_PID_DIR: x}}}"}, ("LG807", "slurm.env.all.LAUNCHGEN_PID_DIR")),
    ({"train": "{bf16: true, fp16: true, args: {data: {path: d}}}"}, ("LG605", "train.fp16")),
    ({"train": "{precision: bf16, fp16: true, args: {data: {path: d}}}"}, ("LG606", "train.fp16")),
    # moved from the plan into the checks with their codes (LG901, LG907, LG910, LG911, LG915)
    ({"train": "{args: {data: {path: d}, learning_rate: -1}}"}, ("LG901", "train.args.learning_rate")),
    ({"train": "{args: {data: {path: d}, bogus: 1}}"}, ("LG901", "train.args.bogus")),
    ({"train": "{args: {}}"}, ("LG901", "train.args.data")),
    ({"slurm": "{partition: 'gpu\\nrm -rf /'}"}, ("LG907", "slurm.partition")),
    ({"slurm": "{account: 'a b'}"}, ("LG907", "slurm.account")),
    ({"job": "{output_dir: \"runs/a\\nb\"}"}, ("LG910", "job.output_dir")),
    ({"vllm": "{device: cpu}"}, ("LG915", "vllm.device")),  # beside a GPU trainer
    ({"train": "{device: cpu, precision: fp32, args: {data: {path: d}}}", "vllm": "{device: cpu, gpus: [0]}"},
     ("LG915", "vllm.gpus")),
    ({"train": "{device: cpu, precision: bf16, args: {data: {path: d}}}", "vllm": "{device: cpu}"},
     ("LG915", "model.dtype")),
    ({"train": "{device: cpu, precision: fp32, args: {data: {path: d}}}",
      "vllm": "{device: cpu, tensor_parallel_size: 2}"}, ("LG915", "vllm.tensor_parallel_size")),
    ({"job": "{output_dir: runs/$(whoami)}"}, ("LG911", "job.output_dir")),
])
def test_rules_the_checks_own_are_reported_once_and_asserted_by_the_plan(
        sections: dict[str, str], expected: tuple[str, str]) -> None:
    text = spec(**sections)
    plan, issues = run_checks(load_spec_text(text, "t.yaml"), env={})
    errors = [(i.code, i.path) for i in issues if i.severity == "error"]
    assert plan is None and errors == [expected], errors
    with pytest.raises(PlanInvariantError, match="internal error"):
        plan_of(text)


def test_cpu_server_command_and_env() -> None:
    """vllm.device: cpu: a module invocation, no GPU flags or GPUs, the KV cache size, the gloo engine."""
    p = plan_of(spec(train="{device: cpu, precision: fp32, args: {data: {path: d}}}",
                     vllm="{device: cpu, executable: [py, -m, launchgen.trainers.generation.vllm_cpu_serve], "
                          "kv_cache_memory_bytes: 1000, enforce_eager: true}"))
    assert p.server is not None
    argv = words(p.server.commands[0].argv)
    assert argv[:5] == ["py", "-m", "launchgen.trainers.generation.vllm_cpu_serve", "serve", "org/model"]
    assert "--gpu-memory-utilization" not in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "1000"
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "gloo"}'
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    env = {e.name: e.value for e in p.server.env}
    assert env["CUDA_VISIBLE_DEVICES"] == "" and p.server.gpus == ()
    assert not any(d.startswith(("--gres", "--gpus")) for d in p.slurm.directives)


@pytest.mark.parametrize("executable", ["''", "[]", "[py, '']"])
def test_empty_executable_is_refused(executable: str) -> None:
    with pytest.raises(SpecError) as exc:
        plan_of(spec(vllm=f"{{gpus: [0], executable: {executable}}}"))
    assert any(i.path.startswith("vllm.executable") for i in exc.value.issues)


def test_lg901_issues_carry_the_yaml_line() -> None:
    text = "job: {name: t}\nmodel: {name_or_path: m}\ntrain:\n  args:\n    data: {path: d}\n    learning_rate: -1\n"
    _, issues = run_checks(load_spec_text(text, "t.yaml"), env={})
    (issue,) = [i for i in issues if i.severity == "error"]
    assert (issue.code, issue.path, issue.line, issue.file) == ("LG901", "train.args.learning_rate", 6, "t.yaml")
