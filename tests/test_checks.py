"""One test per check: a bad spec fires the code on the right field and YAML line; the good base spec does not.

Specs are built from a base dict, dumped to YAML, and the expected line is found by searching the YAML text
(independently of the loader's own line map). The base spec uses a local model directory with a config.json
so the model-dependent checks run without any network or HF cache.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from generated import check_generated

from launchgen import checks
from launchgen.checks import CODES, run_checks
from launchgen.input.loader import load_spec_text
from launchgen.shared.issues import Issue

DELETE = object()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local 'model' with a GQA config: 32 query heads, 8 KV heads, 4096 positions."""
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 4096,
    }))
    return d


def base(model: Path | str) -> dict[str, Any]:
    return {
        "job": {"name": "t"},
        "slurm": {"time": "02:00:00"},
        "model": {"name_or_path": str(model)},
        "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4, "group_port": 29551},
        "train": {"trainer": "grpo", "args": {"data": {"path": "d.jsonl"}}},
    }


def merge(d: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(d)
    for k, v in patch.items():
        if v is DELETE:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def render(d: dict[str, Any]) -> str:
    return yaml.safe_dump(d, sort_keys=False, default_flow_style=False)


def line_in(text: str, needle: str, occurrence: int = 1) -> int:
    n = 0
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            n += 1
            if n == occurrence:
                return i
    raise AssertionError(f"{needle!r} not in spec text:\n{text}")


def issues_for(d: dict[str, Any], env: Mapping[str, str] | None = None) -> list[Issue]:
    loaded = load_spec_text(render(d), "spec.yaml")
    _, issues = run_checks(loaded, env={} if env is None else env)
    return issues


def find(issues: list[Issue], code: str) -> list[Issue]:
    return [i for i in issues if i.code == code]


def test_base_spec_is_clean(model_dir: Path) -> None:
    loaded = load_spec_text(render(base(model_dir)), "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert issues == []
    assert plan is not None


# (code, patch on the base spec, expected path, needle on the expected line, occurrence, severity)
QWEN72 = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
          "intermediate_size": 29568, "vocab_size": 152064}
QWEN7 = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
         "intermediate_size": 18944, "vocab_size": 152064}

CASES: list[tuple[str, dict[str, Any], str, str, int, str]] = [
    ("LG101", {"vllm": {"gpus": [0, 1, 2, 8]}}, "vllm.gpus.3", "- 8", 1, "error"),
    ("LG102", {"vllm": {"gpus": [0, 1, 1, 2]}}, "vllm.gpus.2", "- 1", 2, "error"),
    ("LG103", {"train": {"gpus": [3, 4, 5, 6]}}, "train.gpus", "gpus:", 2, "error"),
    ("LG104", {"vllm": {"gpus": DELETE}}, "vllm.gpus", "vllm:", 1, "error"),
    ("LG105", {"vllm": {"gpus": list(range(8)), "tensor_parallel_size": 8}}, "vllm.gpus", "gpus:", 1, "error"),
    ("LG106", {"train": {"gpus": [4, 5]}}, "train.gpus", "gpus:", 2, "info"),
    ("LG107", {"vllm": {"nodes": 1}}, "vllm.gpus", "gpus:", 1, "warning"),
    ("LG108", {"vllm": {"nodes": 65536}, "train": {"nodes": 2}}, "vllm.nodes", "nodes:", 1, "error"),
    ("LG903", {"vllm": {"nodes": 1, "gpus": []}}, "vllm.gpus", "gpus:", 1, "error"),
    ("LG908", {"vllm": DELETE, "train": {"device": "cpu", "gpus": [0]}}, "train.gpus", "gpus:", 1, "error"),
    ("LG201", {"vllm": {"tensor_parallel_size": 2}}, "vllm.tensor_parallel_size", "tensor_parallel_size", 1,
     "error"),
    ("LG201", {"vllm": {"tensor_parallel_size": 2, "replicas": 3}}, "vllm.tensor_parallel_size",
     "tensor_parallel_size", 1, "error"),
    ("LG220", {"vllm": {"nodes": 3, "gpus": DELETE, "tensor_parallel_size": 2, "data_parallel_size": 3,
                        "replicas": 4}}, "vllm.replicas", "replicas", 1, "error"),
    ("LG221", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "replicas": 2}}, "vllm.replicas", "replicas", 1, "error"),
    ("LG222", {"slurm": {"gpus_per_node": 16}, "vllm": {"gpus": list(range(11)), "tensor_parallel_size": 1,
                                                        "replicas": 11}}, "vllm.replicas", "replicas", 1, "error"),
    ("LG223", {"vllm": {"bind": "127.0.0.1", "tensor_parallel_size": 2, "replicas": 2}}, "vllm.bind", "bind", 1,
     "error"),
    ("LG224", {"vllm": {"restart_replicas": True}}, "vllm.restart_replicas", "restart_replicas", 1, "error"),
    ("LG225", {"vllm": {"tensor_parallel_size": 2, "replicas": 2, "max_replica_restarts": 5}},
     "vllm.max_replica_restarts", "max_replica_restarts", 1, "warning"),
    ("LG262", {"train": {"container": {"runtime": "apptainer", "image": "/t.sif", "extra_args": ["--writable-tmpfs",
                                                                                             "--containall"]}}},
     "train.container.extra_args.1", "--containall", 1, "error"),
    ("LG260", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "partition": "inference"}}, "vllm.partition", "partition: inference", 1, "error"),
    ("LG261", {"vllm": {"gpu_type": "l40s"}}, "vllm.gpu_type", "gpu_type: l40s", 1, "error"),
    ("LG252", {"container": {"runtime": "charliecloud", "image": "docker://org/img:1"}}, "container.image", "image:",
     1, "error"),
    ("LG252", {"vllm": {"container": {"runtime": "pyxis", "image": "/images/vllm.sif"}}}, "vllm.container.image",
     "image:", 1, "error"),
    ("LG253", {"train": {"container": {"runtime": "charliecloud", "image": "/img", "mounts": ["/a", "/b:/c:ro"]}}},
     "train.container.mounts.1", "/b:/c:ro", 1, "error"),
    ("LG255", {"container": {"runtime": "apptainer", "image": "docker://org/img:1", "gpus": False}},
     "container.gpus", "gpus: false", 1, "warning"),
    ("LG259", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "container": {"runtime": "pyxis", "image": "org#img"}}}, "vllm.container", "container:", 1,
     "warning"),
    ("LG202", {"vllm": {"nodes": 2, "gpus": [0, 1, 2], "tensor_parallel_size": 2, "data_parallel_size": 3}},
     "vllm.tensor_parallel_size", "tensor_parallel_size", 1, "error"),
    ("LG206", {"vllm": {"max_model_len": 1000},
               "train": {"args": {"data": {"max_prompt_length": 512},
                                  "generation": {"max_completion_length": 1024}}}},
     "vllm.max_model_len", "max_model_len", 1, "error"),
    ("LG207", {"vllm": {"max_model_len": 8192}}, "vllm.max_model_len", "max_model_len", 1, "warning"),
    # a replica over two dedicated 8-GPU nodes: TP 16 is allowed (vLLM's --nnodes mode), with the link named
    ("LG212", {"vllm": {"nodes": 2, "gpus": DELETE, "tensor_parallel_size": 16}}, "vllm.tensor_parallel_size",
     "tensor_parallel_size", 1, "warning"),
    ("LG213", {"vllm": {"enable_expert_parallel": True}}, "vllm.enable_expert_parallel", "enable_expert_parallel", 1,
     "error"),
    ("LG215", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "pipeline_parallel_size": 2}}, "vllm.pipeline_parallel_size", "pipeline_parallel_size", 1,
     "error"),
    ("LG216", {"vllm": {"enable_eplb": True}}, "vllm.enable_eplb", "enable_eplb", 1, "warning"),
    ("LG209", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 2},
               "train": {"gpus": [0, 1, 2]}}, "vllm.tensor_parallel_size", "tensor_parallel_size", 1, "error"),
    ("LG301", {"slurm": {"gpus_per_node": 1}, "vllm": DELETE, "train": {"backend": "fsdp"}},
     "train.backend", "backend:", 1, "info"),
    ("LG302", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1},
               "train": {"backend": "deepspeed_zero3"}}, "train.backend", "backend:", 1, "warning"),
    ("LG630", {"train": {"distributed": {"offload_optimizer": True}}}, "train.distributed.offload_optimizer",
     "offload_optimizer", 1, "error"),
    ("LG631", {"train": {"backend": "deepspeed_zero2", "distributed": {"offload_params": True}}},
     "train.distributed.offload_params", "offload_params", 1, "error"),
    ("LG632", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1},
               "train": {"backend": "deepspeed_zero3", "distributed": {"offload_params": True}}},
     "train.distributed.offload_params", "offload_params", 1, "warning"),
    ("LG635", {"train": {"backend": "deepspeed_zero3",
                         "distributed": {"deepspeed_config": "ds.json", "offload_optimizer": True}}},
     "train.distributed.offload_optimizer", "offload_optimizer", 1, "error"),
    ("LG636", {"train": {"backend": "fsdp", "distributed": {"zero3_init_flag": False}}},
     "train.distributed.zero3_init_flag", "zero3_init_flag", 1, "error"),
    ("LG360", {"train": {"args": {"num_train_epochs": 2, "max_steps": 50}}}, "train.args.max_steps", "max_steps", 1,
     "warning"),
    ("LG303", {"train": {"args": {"num_generations": 3}}}, "train.args.num_generations", "num_generations", 1,
     "error"),
    ("LG350", {"vllm": DELETE, "train": {"args": {"generation": {"max_staleness": 1}}}},
     "train.args.generation.max_staleness", "max_staleness", 1, "error"),
    ("LG351", {"train": {"args": {"generation": {"max_staleness": 1, "importance_sampling": {"enabled": False}}}}},
     "train.args.generation.importance_sampling.enabled", "enabled: false", 1, "error"),
    ("LG352", {"train": {"trainer": "rloo", "args": {"generation": {"max_staleness": 2}}}}, "train.trainer",
     "trainer: rloo", 1, "error"),
    ("LG353", {"train": {"args": {"generation": {"in_flight_at_push": "pause"}}}},
     "train.args.generation.in_flight_at_push", "in_flight_at_push", 1, "warning"),
    ("LG401", {"vllm": {"port": 80}}, "vllm.port", "port: 80", 1, "error"),
    ("LG402", {"vllm": {"port": 29500}}, "vllm.port", "port: 29500", 1, "error"),
    ("LG403", {"vllm": {"port": 40000}}, "vllm.port", "port: 40000", 1, "warning"),
    ("LG404", {"job": {"port_offset": "job_id"}, "vllm": {"port": 60000}}, "vllm.port", "port: 60000", 1,
     "error"),
    ("LG405", {"job": {"port_offset": "job_id"}, "vllm": {"port": 29510}}, "vllm.port", "port: 29510", 1,
     "warning"),
    ("LG406", {"slurm": {"exclusive": False}}, "job.port_offset", "job:", 1, "warning"),
    ("LG620", {"slurm": {"gpu_type": "v100"}}, "slurm.gpu_type", "gpu_type: v100", 1, "warning"),
    # the memory estimate (launchgen/checks/spec/fit.py; formulas in tests/test_estimate.py): 72B-shaped numbers on L4s
    ("LG240", {"slurm": {"gpu_type": "l4"}, "estimate": {"model": QWEN72}}, "vllm.tensor_parallel_size",
     "tensor_parallel_size", 1, "error"),
    ("LG241", {"slurm": {"gpu_type": "l4"}, "estimate": {"model": QWEN72}, "train": {"backend": "ddp"}},
     "train.backend", "backend: ddp", 1, "error"),
    ("LG242", {"estimate": {"model": QWEN7, "gpu_memory_gib": 80},
               "vllm": {"max_model_len": 4096, "kv_cache_memory_bytes": 90_000_000}},
     "vllm.max_model_len", "max_model_len", 1, "warning"),
    ("LG501", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "nodes": 1}}, "vllm.nodes", "nodes: 1", 1, "error"),
    ("LG502", {"train": {"args": {"generation": {"vllm_colocate": {"gpu_memory_utilization": 0.5}}}}},
     "train.args.generation.vllm_colocate.gpu_memory_utilization", "gpu_memory_utilization", 1, "error"),
    ("LG503", {"train": {"trainer": "sft"}}, "train.trainer", "trainer: sft", 1, "error"),
    ("LG504", {"train": {"args": {"generation": {"backend": "hf"}}}}, "train.args.generation.backend",
     "backend: hf", 1, "error"),
    ("LG505", {"train": {"args": {"generation": {"vllm_server": {"port": 9000}}}}},
     "train.args.generation.vllm_server.port", "port: 9000", 1, "error"),
    ("LG902", {"train": {"args": {"generation": {"vllm_server": {"health_timeout": 5}}}}},
     "train.args.generation.vllm_server.health_timeout", "health_timeout", 1, "error"),
    ("LG904", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "data_parallel_size": 2}}, "vllm.data_parallel_size", "data_parallel_size", 1, "error"),
    ("LG506", {"vllm": {"mode": "colocate", "gpus": DELETE, "tensor_parallel_size": 1}}, "vllm.group_port",
     "group_port", 1, "warning"),
    ("LG507", {"vllm": DELETE}, "train.trainer", "trainer: grpo", 1, "info"),
    ("LG508", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1,
                        "gpu_memory_utilization": 0.8}}, "vllm.gpu_memory_utilization", "gpu_memory_utilization",
     1, "warning"),
    ("LG601", {"train": {"args": {"model": {"attn_implementation": "not a kernel!"}}}},
     "train.args.model.attn_implementation", "attn_implementation", 1, "error"),
    ("LG602", {"train": {"attn_implementation": "kernels-community/flash-attn2"}}, "train.attn_implementation",
     "attn_implementation", 1, "warning"),
    ("LG603", {"train": {"attn_implementation": "kernels-community/flash-attn2@v3", "cuda_version": "12.8"}},
     "train.attn_implementation", "attn_implementation", 1, "error"),
    ("LG604", {"train": {"attn_implementation": "flash_attention_2", "cuda_version": "12.8"}},
     "train.attn_implementation", "attn_implementation", 1, "warning"),
    ("LG605", {"train": {"bf16": True, "fp16": True}}, "train.fp16", "fp16:", 1, "error"),
    ("LG606", {"train": {"precision": "fp32", "bf16": True}}, "train.bf16", "bf16:", 1, "error"),
    ("LG607", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "top_entropy_quantile": 0.2}}},
     "train.args.top_entropy_quantile", "top_entropy_quantile", 1, "error"),
    ("LG340", {"train": {"args": {"peft": {"target_modules": ["q_proj", "qkv_proj"]}}}},
     "train.args.peft.target_modules.1", "- qkv_proj", 1, "error"),
    ("LG341", {"train": {"args": {"peft": {"modules_to_save": ["embeddings"]}}}},
     "train.args.peft.modules_to_save.0", "- embeddings", 1, "error"),
    ("LG343", {"train": {"backend": "deepspeed_zero3", "args": {"peft": {"r": 8}}}}, "train.backend",
     "backend: deepspeed_zero3", 1, "error"),
    ("LG344", {"train": {"use_liger_kernel": True, "args": {"peft": {"r": 8}}}}, "train.use_liger_kernel",
     "use_liger_kernel", 1, "error"),
    ("LG345", {"vllm": {"extra_args": ["--enable-lora"]}, "train": {"args": {"peft": {"r": 8}}}},
     "vllm.extra_args.0", "- --enable-lora", 1, "warning"),
    ("LG608", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "importance_sampling_level": "sequence"}}},
     "train.args.importance_sampling_level", "importance_sampling_level", 1, "error"),
    ("LG609", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "entropy_coef": 0.01}}},
     "train.args.entropy_coef", "entropy_coef", 1, "error"),
    ("LG610", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "off_policy_mask_threshold": 0.5}}},
     "train.args.off_policy_mask_threshold", "off_policy_mask_threshold", 1, "error"),
    ("LG611", {"model": {"dtype": "float16"}}, "model.dtype", "dtype: float16", 1, "warning"),
    ("LG612", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "loss_type": "sapo"}}},
     "train.args.loss_type", "loss_type", 1, "error"),
    ("LG613", {"train": {"use_liger_kernel": True, "args": {"model": {"liger_grpo_loss": True}, "delta": 1.5}}},
     "train.args.delta", "delta", 1, "error"),
    ("LG614", {"train": {"args": {"max_tokens_per_forward": 4096, "entropy_coef": 0.01}}},
     "train.args.entropy_coef", "entropy_coef", 1, "error"),
    ("LG615", {"train": {"args": {"loss_type": "vespo"}}}, "train.args.loss_type", "loss_type", 1, "error"),
    ("LG616", {"train": {"args": {"loss_type": "luspo"}}}, "train.args.loss_type", "loss_type", 1, "warning"),
    ("LG701", {"vllm": {"version": "0.18.0"}}, "vllm.version", "version: 0.18.0", 1, "error"),
    ("LG702", {"vllm": {"version": "0.40.0"}}, "vllm.version", "version: 0.40.0", 1, "warning"),
    ("LG703", {"vllm": {"version": "0.30.0"}}, "vllm.version", "version: 0.30.0", 1, "info"),
    ("LG704", {"vllm": {"version": "0.20.0"}}, "vllm.version", "version: 0.20.0", 1, "info"),
    ("LG705", {"vllm": {"version": "0.28.0"}}, "vllm.version", "version: 0.28.0", 1, "info"),
    ("LG710", {"vllm": {"version": "0.28.0", "extra_args": ["--enable-scale-out"]}}, "vllm.extra_args.0",
     "- --enable-scale-out", 1, "error"),
    ("LG801", {"vllm": {"bind": "0.0.0.0"}}, "vllm.bind", "bind:", 1, "warning"),
    ("LG802", {"vllm": {"extra_args": ["--enforce-eager", "--port=9000"]}}, "vllm.extra_args.1", "- --port=9000",
     1, "error"),
    ("LG803", {"vllm": {"health_timeout": 30}}, "vllm.health_timeout", "health_timeout", 1, "warning"),
    ("LG804", {"slurm": {"time": "00:01:00", "signal_grace": 120}}, "slurm.signal_grace", "signal_grace", 1,
     "error"),
    ("LG805", {"slurm": {"signal_grace": 10}}, "slurm.signal_grace", "signal_grace", 1, "warning"),
    ("LG806", {"slurm": {"signal_grace": 0}}, "slurm.signal_grace", "signal_grace", 1, "info"),
    ("LG807", {"slurm": {"env": {"trainer": {"CUDA_VISIBLE_DEVICES": "0"}}}},
     "slurm.env.trainer.CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", 1, "error"),
    ("LG810", {"slurm": {"env": {"all": {"SHELLOPTS": "errexit"}}}}, "slurm.env.all.SHELLOPTS", "SHELLOPTS", 1,
     "error"),
    ("LG812", {"slurm": {"exclusive": False, "extra_directives": ["--cpus-per-gpu=2"]}}, "slurm.extra_directives.0",
     "- --cpus-per-gpu=2", 1, "error"),
    ("LG808", {"vllm": {"nodes": 1, "gpus": DELETE, "tensor_parallel_size": 8, "bind": "127.0.0.1"}},
     "vllm.bind", "bind: 127.0.0.1", 1, "error"),
    ("LG901", {"train": {"args": {"learning_rate": -1}}}, "train.args.learning_rate", "learning_rate", 1, "error"),
    ("LG907", {"slurm": {"account": "a b"}}, "slurm.account", "account:", 1, "error"),
    ("LG910", {"job": {"output_dir": "runs/a\tb"}}, "job.output_dir", "output_dir:", 1, "error"),
    ("LG911", {"job": {"output_dir": "runs/$(whoami)"}}, "job.output_dir", "output_dir:", 1, "error"),
    ("LG915", {"vllm": {"device": "cpu"}}, "vllm.device", "device: cpu", 1, "error"),
    # TRL's own trainers (launchgen.kinds.trl_config, launchgen.checks.spec.trl): train.args takes TRL's field names
    ("LG901", {"train": {"trainer": "trl.grpo", "args": {"num_generation": 4}}}, "train.args.num_generation",
     "num_generation:", 1, "error"),
    ("LG920", {"vllm": {"mode": "colocate", "gpus": DELETE, "group_port": DELETE, "tensor_parallel_size": 1},
               "train": {"trainer": "trl.async_grpo"}}, "vllm.mode", "mode: colocate", 1, "error"),
    ("LG920", {"model": {"dtype": "float32"}, "vllm": {"device": "cpu", "gpus": DELETE, "tensor_parallel_size": 1},
               "train": {"trainer": "trl.async_grpo", "device": "cpu"}}, "train.device", "device: cpu", 2, "error"),
    ("LG920", {"train": {"trainer": "trl.async_grpo", "attn_implementation": "sdpa"}}, "train.attn_implementation",
     "attn_implementation: sdpa", 1, "error"),
    ("LG921", {"train": {"trainer": "trl.grpo", "args": {"vllm_mode": "colocate"}}}, "train.args.vllm_mode",
     "vllm_mode: colocate", 1, "error"),
    ("LG922", {"train": {"script": "train.py"}}, "train.trainer", "trainer: grpo", 1, "error"),
    ("LG742", {"vllm": {"version": "0.33.0"}, "train": {"trainer": "trl.grpo"}}, "vllm.version", "version:", 1,
     "warning"),
]


@pytest.mark.parametrize(("code", "patch", "path", "needle", "occurrence", "severity"), CASES,
                         ids=[c[0] for c in CASES])
def test_check_fires(model_dir: Path, code: str, patch: dict[str, Any], path: str, needle: str,
                     occurrence: int, severity: str) -> None:
    bad = merge(base(model_dir), patch)
    text = render(bad)
    found = find(issues_for(bad), code)
    assert found, f"{code} did not fire on:\n{text}"
    hit = next((i for i in found if i.path == path), None)
    assert hit is not None, f"{code} fired on {[i.path for i in found]}, expected {path}"
    assert hit.line == line_in(text, needle, occurrence)
    assert hit.severity == severity
    assert hit.file == "spec.yaml"
    assert hit.message and (hit.fix or severity == "info")
    # the good base spec does not fire it
    assert not find(issues_for(base(model_dir)), code)


def test_lg808_loopback_is_fine_on_a_shared_node(model_dir: Path) -> None:
    shared = merge(base(model_dir), {"vllm": {"bind": "127.0.0.1"}})
    loaded = load_spec_text(render(shared), "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert plan is not None and not find(issues, "LG808")


# --- checks that need a particular model config ------------------------------------------------------------

def _model(tmp_path: Path, **cfg: Any) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_lg203_attention_heads_not_divisible(tmp_path: Path) -> None:
    bad = base(_model(tmp_path, num_attention_heads=14, num_key_value_heads=2))
    hit = find(issues_for(bad), "LG203")
    assert [i.path for i in hit] == ["vllm.tensor_parallel_size"]
    assert hit[0].line == line_in(render(bad), "tensor_parallel_size")
    good = base(_model(tmp_path, num_attention_heads=16, num_key_value_heads=2))
    assert not find(issues_for(good), "LG203")


def test_lg204_kv_heads_cannot_be_split(tmp_path: Path) -> None:
    bad = base(_model(tmp_path, num_attention_heads=24, num_key_value_heads=6))
    hit = find(issues_for(bad), "LG204")
    assert [i.path for i in hit] == ["vllm.tensor_parallel_size"]
    assert hit[0].line == line_in(render(bad), "tensor_parallel_size")
    # 2 KV heads with TP 4: vLLM replicates them, fine
    good = base(_model(tmp_path, num_attention_heads=32, num_key_value_heads=2))
    assert not find(issues_for(good), "LG204")


def test_lg205_dp_for_dense_model(tmp_path: Path) -> None:
    bad = merge(base(_model(tmp_path, num_attention_heads=32, num_key_value_heads=8)),
                {"vllm": {"tensor_parallel_size": 2, "data_parallel_size": 2}})
    hit = find(issues_for(bad), "LG205")
    assert [(i.path, i.severity) for i in hit] == [("vllm.data_parallel_size", "warning")]
    assert hit[0].line == line_in(render(bad), "data_parallel_size")
    moe = merge(base(_model(tmp_path, num_attention_heads=32, num_key_value_heads=8, num_experts=64)),
                {"vllm": {"tensor_parallel_size": 2, "data_parallel_size": 2}})
    assert not find(issues_for(moe), "LG205")


def test_lg208_config_not_reachable_and_hf_cache_layout(tmp_path: Path) -> None:
    bad = merge(base("org/not-cached"), {})
    hit = find(issues_for(bad, env={"HF_HOME": str(tmp_path / "hf")}), "LG208")
    assert [(i.path, i.severity) for i in hit] == [("model.name_or_path", "info")]
    assert hit[0].line == line_in(render(bad), "name_or_path")
    # the same model in the HF cache layout: config found, heads checked (14 % 4 -> LG203), no LG208
    snap = tmp_path / "hf" / "hub" / "models--org--not-cached" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"num_attention_heads": 14, "num_key_value_heads": 2}))
    refs = tmp_path / "hf" / "hub" / "models--org--not-cached" / "refs"
    refs.mkdir()
    (refs / "main").write_text("abc123")
    issues = issues_for(bad, env={"HF_HOME": str(tmp_path / "hf")})
    assert not find(issues, "LG208")
    assert find(issues, "LG203")


def test_lg603_unknown_gqa_is_a_warning_and_mha_is_clean(tmp_path: Path) -> None:
    patch = {"train": {"attn_implementation": "kernels-community/flash-attn2@v3", "cuda_version": "12.8"}}
    unknown = merge(base("org/not-cached"), patch)
    hit = find(issues_for(unknown, env={"HF_HOME": str(tmp_path)}), "LG603")
    assert [i.severity for i in hit] == ["warning"]
    mha = merge(base(_model(tmp_path, num_attention_heads=32, num_key_value_heads=32)), patch)
    assert not find(issues_for(mha), "LG603")
    pinned = merge(base(_model(tmp_path, num_attention_heads=32, num_key_value_heads=8)),
                   {"train": {"attn_implementation": "kernels-community/flash-attn2@v2", "cuda_version": "12.8"}})
    assert not find(issues_for(pinned), "LG603")


# --- registry hygiene --------------------------------------------------------------------------------------

def test_every_check_code_is_documented_and_tested() -> None:
    registered = {c for chk in checks.CHECKS for c in chk.codes}
    assert registered <= set(CODES)
    registered -= {c for chk in checks.CHECKS if chk.stage == "files" for c in chk.codes}  # test_preflight.py
    # LG005 (an empty `vllm:`) is tested in test_input_yaml.py: the case table cannot write a blank value;
    # LG820 needs a model config with sizes, LG809 is tested with LG620: tests/test_static_checks.py;
    # LG342 needs a model whose config.json is missing or of another family: tests/test_preflight_peft.py
    # LG923 reads the script (the files stage), LG924 and TRL's own rules (LG930-LG941, each agreed with TRL in
    # tests/trainers/test_trl_rules.py): tests/test_trl_checks.py; LG813/LG814 beside LG809 (tests/test_static_checks.py);
    # LG815 renders a script of thousands of server ranks: tests/test_scale.py
    # LG214 needs a config.json with num_hidden_layers: test_pipeline_deeper_than_the_model
    trl_rules = {f"LG9{n}" for n in range(30, 42)}
    tested = {c[0] for c in CASES} | {"LG203", "LG204", "LG205", "LG208", "LG005", "LG820", "LG809", "LG342",
                                      "LG923", "LG924", "LG214", "LG813", "LG814", "LG815"} | trl_rules
    assert registered - tested == set(), f"checks without a unit test: {sorted(registered - tested)}"


def test_check_codes_doc_lists_every_code() -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "check-codes.md"
    check_generated(path, checks.codes_markdown() + "\n",
                    "LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_checks.py -k check_codes_doc",
                    begin="<!-- generated by launchgen.checks.codes_markdown()", end="<!-- end of the generated tables -->")
    doc = path.read_text()
    missing = [c for c in CODES if f"`{c}`" not in doc]
    assert missing == []
    assert checks.codes_markdown() in doc, "regenerate docs/check-codes.md from checks.codes_markdown()"


def test_strict_turns_warnings_into_errors(model_dir: Path) -> None:
    loaded = load_spec_text(render(merge(base(model_dir), {"vllm": {"bind": "0.0.0.0"}})), "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert plan is not None and [i.severity for i in issues] == ["warning"]
    plan, issues = run_checks(loaded, env={}, strict=True)
    assert plan is None and [i.severity for i in issues] == ["error"]


def test_plan_errors_become_issues(model_dir: Path) -> None:
    # what only the trainer config can judge (LG901) comes from building the plan, after the checks pass
    loaded = load_spec_text(render(merge(base(model_dir), {"train": {"args": {"learning_rate": -1}}})),
                            "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert plan is None
    assert [(i.code, i.path) for i in issues] == [("LG901", "train.args.learning_rate")]
    assert issues[0].line is not None


def test_trainer_config_is_resolved_before_the_checks(model_dir: Path) -> None:
    # LG901 is a spec-stage check: reported beside the other spec errors, not only once they are fixed
    bad = merge(base(model_dir), {"vllm": {"gpus": [0, 1, 2, 9]}, "train": {"args": {"learning_rate": -1}}})
    plan, issues = run_checks(load_spec_text(render(bad), "spec.yaml"), env={})
    assert plan is None and {(i.code, i.path) for i in issues if i.severity == "error"} == {
        ("LG101", "vllm.gpus.3"), ("LG901", "train.args.learning_rate")}
    # the checks read typed fields with the trainer's own defaults (rloo: num_generations 2)
    from launchgen.checks import Ctx

    ctx = Ctx(load_spec_text(render(merge(base(model_dir), {"train": {"trainer": "rloo"}})), "spec.yaml"), env={})
    assert ctx.trainer_cfg is not None and ctx.trainer_cfg.num_generations == 2
    assert ctx.trainer_cfg.steps_per_generation == ctx.trainer_cfg.gradient_accumulation_steps == 1
    # an argument the spec owns is left out of the config (LG902 reports it), the rest is still read
    owned = merge(base(model_dir), {"train": {"args": {"output_dir": "/x", "num_generations": 4}}})
    ctx = Ctx(load_spec_text(render(owned), "spec.yaml"), env={})
    assert ctx.trainer_cfg is not None and ctx.trainer_cfg.num_generations == 4


@pytest.mark.parametrize(("value", "code"), [("bf16", "LG902"), ("fp16", "LG606")])
def test_owned_argument_gets_one_message(model_dir: Path, value: str, code: str) -> None:
    # `precision` in train.args is owned by the spec: LG902, or LG606 where it contradicts train.precision
    loaded = load_spec_text(render(merge(base(model_dir), {"train": {"args": {"precision": value}}})),
                            "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert plan is None
    assert [(i.code, i.path) for i in issues] == [(code, "train.args.precision")]
    assert issues[0].line is not None


def test_port_offset_constant_matches_plan() -> None:
    from launchgen.planning.plan import MAX_PORT_OFFSET

    assert checks.PORT_OFFSET_MAX == MAX_PORT_OFFSET


def test_max_staleness_with_a_server_and_grpo_is_clean(model_dir: Path) -> None:
    spec = base(model_dir)
    spec["train"].setdefault("args", {})["generation"] = {"max_staleness": 2, "in_flight_at_push": "pause"}
    loaded = load_spec_text(render(spec), "spec.yaml")
    plan, issues = run_checks(loaded, env={})
    assert issues == [] and plan is not None


@pytest.mark.parametrize("row", [c for c in CASES if c[5] == "error" and c[0] != "LG901"], ids=lambda c: c[0])
def test_the_trainer_configs_own_refusal_is_no_second_message(model_dir: Path, row: tuple[Any, ...]) -> None:
    # the trainer config refuses some of these too (staleness, peft): a check names the field, LG901 stands down
    code, patch = row[0], row[1]
    errors = [(i.code, i.path) for i in issues_for(merge(base(model_dir), patch)) if i.severity == "error"]
    assert ("LG901", "train.args") not in errors, (code, errors)


def test_a_check_lives_in_the_folder_of_its_stage() -> None:
    """One answer to "where does a check go": by what it reads. `checks/spec/` holds the spec-stage checks (and the
    plan-stage ones: the plan is derived from the spec alone), `checks/files/` the files-stage ones, `checks/live/`
    the `--live` probes (which register no check: `live_checks` runs them)."""
    folders = {"spec": {"spec", "plan"}, "files": {"files"}, "live": set()}
    assert checks.CHECK_MODULES, "the package imports its check modules"
    for c in checks.CHECKS:
        module = c.fn.__module__
        assert module.startswith("launchgen.checks."), (c.name, module)
        folder = module.split(".")[2]
        if folder == "runner":  # the loader's own warnings (LG005), reported through the checks
            continue
        assert c.stage in folders[folder], f"{c.name} ({module}) is a {c.stage} check"


def test_a_raw_train_args_read_of_a_path_no_trainer_has_fails(model_dir: Path) -> None:
    """`Ctx.arg` is the one raw reader of train.args: a typo in a check's path raises instead of reading the default."""
    from launchgen.checks import Ctx

    ctx = Ctx(load_spec_text(render(base(model_dir)), "spec.yaml"), env={})
    assert ctx.arg("generation.importance_sampling.enabled", True) is True  # a real path: the default
    with pytest.raises(KeyError, match="no trainer's config has this field"):
        ctx.arg("generation.importance_sampling.enabeld")
    # the typed reader too: a typo would otherwise read as an unset field (None)
    assert ctx.value("generation.importance_sampling.enabled") is not None
    with pytest.raises(KeyError, match="no trainer's config has this field"):
        ctx.value("generation.importance_sampling.enabeld")


def test_a_config_refusal_hidden_behind_a_file_error_builds_no_plan(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """LG901's echo at train.args gives way to a files-stage error on a train field (one message per mistake), but
    the config still does not validate: run_checks returns no plan instead of tripping build_plan's invariant
    (found by tests/test_layout.py's shuffled-order property)."""
    monkeypatch.chdir(tmp_path)
    spec = {"job": {"name": "plain"}, "model": {"name_or_path": "org/model"},
            "train": {"trainer": "online_dpo", "args": {"data": {"path": "d.jsonl"}, "num_generations": 8}}}
    plan, issues = run_checks(load_spec_text(yaml.safe_dump(spec), "spec.yaml"), env={}, files=True)
    assert plan is None and "LG330" in {i.code for i in issues}


def test_pipeline_deeper_than_the_model(tmp_path: Path) -> None:
    """LG214: more pipeline stages than layers (the config says 2); as many as the layers is fine."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": 8,
                                                       "num_key_value_heads": 8, "num_hidden_layers": 2}))
    for pp, codes in ((4, ["LG214"]), (2, [])):
        spec = merge(base(tmp_path), {"vllm": {"nodes": pp, "gpus": DELETE, "tensor_parallel_size": 8,
                                               "pipeline_parallel_size": pp}})
        _, issues = run_checks(load_spec_text(render(spec), "t.yaml"), env={})
        assert [i.code for i in issues if i.code == "LG214"] == codes, [str(i) for i in issues]
        assert not [i for i in issues if i.severity == "error" and i.code not in ("LG214", "LG330")]
