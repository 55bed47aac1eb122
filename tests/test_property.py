"""Property tests over generated specs: never a traceback; every rejected spec exits 2 with a code.

The generated sections cover the fields added since the first version (issue 37): containers (job-wide and per
role), the heterogeneous job's server fields, replicas and their restarts, node counts around and far beyond the
scale bounds, the TRL trainers, slurm.version and extra_directives judged against it.

Specs are generated around the real schema (plausible values with awkward corners: out-of-range ports and
GPU indices, shell metacharacters, newlines), then optionally mutated at a random path (junk value, deleted
key, unknown key). Both the CLI (click's CliRunner) and the in-process API are exercised.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tools import unwrapped

from launchgen.checks import has_errors, run_checks
from launchgen.cli import main
from launchgen.input.loader import load_spec_text
from launchgen.shared.issues import SpecError

NASTY = st.sampled_from([
    "plain", "with space", "quote'single", 'quote"double', "$(touch /tmp/pwned)", "`id`", "a\nb", "semi;colon",
    "back\\slash", "", " ", "ünïcödé", "--flag", "%j", "${HOME}", "*", "a,b",
])
TEXT = st.one_of(NASTY, st.text(max_size=12))


def mostly(value: Any, other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`value` about three times in four, else `other` (specs should often get as far as the plan)."""
    return st.integers(0, 3).flatmap(lambda i: st.just(value) if i else other)
PORT = st.one_of(st.integers(0, 70000), st.sampled_from([8000, 29500, 29551, 40000, 60000, 65535, 20000]))
GPUS = st.one_of(st.none(), st.lists(st.integers(-1, 10), max_size=9))
VERSION = st.sampled_from(["0.18.0", "0.19.1", "0.22.0", "0.28.0", "0.30.1+cu129", "0.34.0", "0.99.0", "x.y"])
ATTN = st.sampled_from([None, "sdpa", "eager", "flash_attention_2", "kernels-community/flash-attn2",
                        "kernels-community/flash-attn2@v3", "kernels-community/flash-attn2@v2", "bad kernel",
                        "org/repo:fn", "a|org/repo@rev"])
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), TEXT,
                 st.lists(st.integers(-2, 9), max_size=4), st.dictionaries(TEXT, st.integers(), max_size=2))

ARGS = st.fixed_dictionaries(
    {"data": st.fixed_dictionaries({"path": st.just("d.jsonl")},
                                   optional={"max_prompt_length": st.integers(-1, 5000)})},
    optional={
        "num_generations": mostly(8, st.integers(-1, 16)),
        "per_device_train_batch_size": mostly(8, st.integers(0, 16)),
        "gradient_accumulation_steps": st.integers(1, 4),
        "steps_per_generation": mostly(1, st.integers(0, 4)),
        "generation": st.fixed_dictionaries({}, optional={
            "max_completion_length": st.integers(0, 5000),
            "backend": st.sampled_from(["hf", "vllm_server", "vllm_colocate", "nope"]),
            "vllm_server": st.fixed_dictionaries({}, optional={"port": PORT, "host": TEXT}),
            "vllm_colocate": st.fixed_dictionaries({}, optional={"gpu_memory_utilization": st.floats(0, 2)}),
        }),
        "learning_rate": mostly(1e-6, st.one_of(st.floats(-1, 1), TEXT)),
        "model": st.fixed_dictionaries({}, optional={"attn_implementation": ATTN}),
    },
)

#: counts around the scale bounds (launchgen.input.bounds: 65,536 nodes, 1,024 replicas, 1,000 restarts) and absurd
#: ones (issue 37: 100000000 nodes took 12 GB); the plausible ones most of the time
NODES = st.one_of(st.integers(0, 4), st.integers(0, 4), st.sampled_from([65_537, 10**8, 10**20, -1]))
REPLICAS = st.one_of(st.integers(1, 4), st.sampled_from([10, 11, 1_025, 10**9, 0]))
RESTARTS = st.one_of(st.integers(0, 5), st.sampled_from([1_000, 1_001, 10**21]))
CONTAINER = st.one_of(st.none(), st.fixed_dictionaries(
    {"runtime": st.sampled_from(["pyxis", "apptainer", "singularity", "charliecloud", "docker"]),
     "image": mostly("docker://nvcr.io/nvidia/pytorch:25.01-py3", TEXT)},
    optional={"mounts": st.lists(st.sampled_from(["/data", "/data:/mnt:ro", "rel", "/a:/b:rw:x", "$(id)"]),
                                 max_size=2),
              "extra_args": st.lists(st.sampled_from(["--nv", "--pid", "-p", "--cleanenv", "$(id)"]), max_size=2)}))

TRAIN = st.fixed_dictionaries({"args": ARGS}, optional={
            "nodes": NODES, "gpus": st.one_of(st.none(), st.none(), GPUS),
            "device": st.sampled_from(["cuda", "cpu"]),
            "backend": st.sampled_from(["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"]),
            "trainer": st.sampled_from(["grpo", "rloo", "online_dpo", "sft", "trl.grpo", "trl.sft", "trl.dpo"]),
            "container": CONTAINER,
            "precision": st.sampled_from(["bf16", "fp16", "fp32"]),
            "bf16": st.one_of(st.none(), st.booleans()), "fp16": st.one_of(st.none(), st.booleans()),
            "attn_implementation": ATTN, "use_liger_kernel": st.booleans(),
            "cuda_version": st.sampled_from(["12.8", "12.9", "12.8.1"]),
            "main_process_port": PORT, "colocate_master_port": PORT,
        })

SPEC = st.fixed_dictionaries(
    {
        "job": st.fixed_dictionaries({"name": mostly("job-1", TEXT)},
                                     optional={"port_offset": mostly("none", st.sampled_from(["job_id", "bad"])),
                                               "output_dir": mostly("runs/%j", TEXT)}),
        "model": st.fixed_dictionaries({"name_or_path": mostly("org/model", TEXT)},
                                       optional={"revision": TEXT, "dtype": st.sampled_from(["auto", "float16"])}),
        "train": TRAIN,
    },
    optional={
        "slurm": st.fixed_dictionaries({}, optional={
            "partition": mostly("gpu", TEXT), "account": mostly("acct", TEXT),
            "time": mostly("01:00:00", st.sampled_from(["00:01:00", "2-00:00:00", "90", "bogus", "5:00"])),
            "gpus_per_node": mostly(8, st.integers(0, 16)),
            "signal_grace": st.integers(0, 4000),
            "max_restarts": RESTARTS,
            "cpus_per_task": st.one_of(st.none(), st.integers(0, 8), st.just(10**21)),
            "version": st.sampled_from(["22.05", "23.11", "24.11.1", "25.11", "bad", "9"]),
            "exclusive": st.booleans(),
            "extra_directives": st.lists(st.sampled_from(["--constraint=h100", "--nodes=2", "#SBATCH -x",
                                                          "nodash", "--comment=$(id)", "--tres-per-task=cpu:2",
                                                          "--container=/x", "-w node[1-3]", "--nodelist=n[1-",
                                                          "--segment=2", "--tasks-per-node=2", "--tres-bind=x",
                                                          "-F hosts"]), max_size=2),
            "setup": st.lists(TEXT, max_size=2),
            "env": st.fixed_dictionaries({}, optional={
                "all": st.dictionaries(st.sampled_from(["FOO", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "1BAD",
                                                        "VLLM_SERVER_DEV_MODE"]), TEXT, max_size=2),
                "trainer": st.dictionaries(st.sampled_from(["BAR", "LG_X"]), TEXT, max_size=1),
            }),
        }),
        "container": CONTAINER,
        "vllm": st.one_of(st.none(), st.fixed_dictionaries(
            {"mode": st.sampled_from(["server", "colocate"])},
            optional={
                "nodes": NODES, "gpus": mostly([0, 1, 2, 3], GPUS), "replicas": REPLICAS,
                "restart_replicas": st.booleans(), "max_replica_restarts": RESTARTS, "container": CONTAINER,
                "partition": TEXT, "account": TEXT, "qos": TEXT, "gpu_type": TEXT,
                "tensor_parallel_size": mostly(4, st.integers(0, 9)),
                "data_parallel_size": st.integers(1, 4), "port": PORT, "group_port": PORT, "dp_rpc_port": PORT,
                # the multi-node server (issue 34): PP, expert parallel, its options, the engine's master port
                "pipeline_parallel_size": mostly(1, st.one_of(st.integers(0, 9), st.just(10**21))),
                "enable_expert_parallel": st.booleans(), "enable_eplb": st.booleans(),
                "all2all_backend": st.one_of(st.sampled_from(["naive", "pplx", "deepep_low_latency"]), TEXT),
                "master_port": PORT,
                "bind": st.sampled_from(["node", "0.0.0.0", "10.0.0.1", "bad host"]),
                "max_model_len": st.integers(1, 10**5),
                "health_timeout": st.one_of(st.integers(0, 3600), st.just(10**21)),
                "extra_args": st.lists(st.sampled_from(["--port=1", "--enforce-eager", "--enable-scale-out",
                                                        "--seed 1", "$(id)", "-tp"]), max_size=3),
                "version": VERSION, "enable_sleep_mode": st.booleans(),
                "gpu_memory_utilization": st.floats(0, 1.5),
            })),
    },
)



@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per module (hypothesis runs many examples per test; pytest removes it with its basetemp)."""
    return tmp_path_factory.mktemp("prop")

_CODE_LINE = re.compile(r" error LG\d{3} ")  # `[field]` follows when the issue has one


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(SPEC)
    kind = draw(st.sampled_from(["none", "none", "none", "replace", "delete", "unknown"]))
    paths = _paths(spec)
    if kind == "none" or not paths:
        return spec
    path = draw(st.sampled_from(paths))
    parent: Any = spec
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if kind == "replace":
        parent[last] = draw(JUNK)
    elif kind == "delete" and isinstance(parent, dict):
        del parent[last]
    elif kind == "unknown" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["tpsize", "gpu", "colour"]))] = draw(JUNK)
    return spec


def _dump(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(mutated_specs())
def test_cli_never_tracebacks_and_errors_carry_codes(work: Path, spec: dict[str, Any]) -> None:
    path = work / "spec.yaml"
    path.write_text(_dump(spec))
    r = CliRunner().invoke(main, ["check", str(path)], env={"HF_HOME": str(work / "hf")})
    assert r.exit_code in (0, 2), r.output
    assert "Traceback" not in unwrapped(r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit)
    if r.exit_code == 2:
        assert _CODE_LINE.search(r.stderr), r.stderr
    j = CliRunner().invoke(main, ["check", "--format", "json", str(path)], env={"HF_HOME": str(work / "hf")})
    payload = json.loads(j.stdout)
    assert j.exit_code == r.exit_code
    assert payload["ok"] == (j.exit_code == 0)
    assert (payload["summary"]["error"] > 0) == (j.exit_code == 2)


@SETTINGS
@given(mutated_specs())
def test_in_process_checks_never_raise(spec: dict[str, Any]) -> None:
    try:
        loaded = load_spec_text(_dump(spec), "spec.yaml")
    except SpecError as exc:
        assert exc.issues and all(re.fullmatch(r"LG\d{3}", i.code) for i in exc.issues)
        assert all(i.severity == "error" for i in exc.issues)
        return
    plan, issues = run_checks(loaded, env={}, files=True)
    assert all(re.fullmatch(r"LG\d{3}", i.code) for i in issues)
    assert all(i.message for i in issues)
    assert (plan is None) == has_errors(issues)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_tracebacks(work: Path, text: str) -> None:
    path = work / "raw.yaml"
    path.write_text(text)
    r = CliRunner().invoke(main, ["check", str(path)])
    assert r.exit_code == 2 or r.exit_code == 0, r.output
    assert "Traceback" not in unwrapped(r.output)
    if r.exit_code == 2:
        assert _CODE_LINE.search(r.stderr), r.stderr
