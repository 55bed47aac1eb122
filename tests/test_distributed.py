"""train.distributed: a user's accelerate / DeepSpeed config and the offload knobs, merged into the accelerate
config the trainer step launches with (parsed back by accelerate's own loader), and the file checks LG633/LG634/LG637."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from launchgen.checks import run_checks  # registers every check
from launchgen.input.loader import load_spec_text
from launchgen.input.spec import DistributedSection
from launchgen.planning.accelerate_config import accelerate_config
from launchgen.planning.plan import build_plan


def _accelerate_parses(cfg: dict[str, Any], tmp_path: Path) -> Any:
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config_from_file(str(path))


def test_zero3_offload_knobs(tmp_path: Path) -> None:
    cfg = accelerate_config("deepspeed_zero3", "bf16", 1, 8, "cuda",
                            DistributedSection(offload_optimizer=True, offload_params=True))
    assert cfg["deepspeed_config"] == {
        "deepspeed_multinode_launcher": "standard", "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
        "zero3_init_flag": True, "zero3_save_16bit_model": True, "zero_stage": 3,
    }
    parsed = _accelerate_parses(cfg, tmp_path)
    assert parsed.deepspeed_config["offload_param_device"] == "cpu" and parsed.num_processes == 8
    off = accelerate_config("deepspeed_zero3", "bf16", 1, 8, "cuda", DistributedSection(zero3_init_flag=False))
    assert off["deepspeed_config"]["zero3_init_flag"] is False
    assert off["deepspeed_config"]["offload_param_device"] == "none"


def test_fsdp2_offload() -> None:
    cfg = accelerate_config("fsdp", "bf16", 1, 4, "cuda", DistributedSection(offload_params=True))
    assert cfg["fsdp_config"]["fsdp_offload_params"] is True and cfg["fsdp_config"]["fsdp_version"] == 2
    assert accelerate_config("fsdp", "bf16", 1, 4, "cuda")["fsdp_config"]["fsdp_offload_params"] is False


def test_user_accelerate_config_is_the_base_and_launchgen_keys_win(tmp_path: Path) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text(yaml.safe_dump({
        "distributed_type": "DEEPSPEED", "num_processes": 99, "mixed_precision": "no", "dynamo_config": {"dynamo_backend": "INDUCTOR"},
        "deepspeed_config": {"gradient_clipping": 0.5, "zero_stage": 3, "offload_optimizer_device": "cpu"},
    }))
    cfg = accelerate_config("deepspeed_zero3", "bf16", 2, 16, "cuda", DistributedSection(accelerate_config=str(user)))
    assert cfg["num_processes"] == 16 and cfg["num_machines"] == 2 and cfg["mixed_precision"] == "bf16"
    assert cfg["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}  # the user's other keys are kept
    assert cfg["deepspeed_config"]["gradient_clipping"] == 0.5  # the user's tuning wins over launchgen's defaults
    assert cfg["deepspeed_config"]["offload_optimizer_device"] == "cpu"
    assert cfg["deepspeed_config"]["zero_stage"] == 3
    _accelerate_parses(cfg, tmp_path)


def test_deepspeed_file_is_passed_as_config_file(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    cfg = accelerate_config("deepspeed_zero3", "bf16", 1, 8, "cuda", DistributedSection(deepspeed_config=str(ds)))
    assert cfg["deepspeed_config"] == {"deepspeed_multinode_launcher": "standard",
                                       "deepspeed_config_file": str(ds.resolve()), "zero3_init_flag": True}
    assert _accelerate_parses(cfg, tmp_path).deepspeed_config["deepspeed_config_file"] == str(ds.resolve())


def _spec(model: Path, train: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "job": {"name": "t"}, "slurm": {"time": "02:00:00"}, "model": {"name_or_path": str(model)},
        "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4, "group_port": 29551},
        "train": {"trainer": "grpo", "args": {"data": {"path": "d.jsonl"}}, **train},
    }, sort_keys=False)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": 32,
                                               "num_key_value_heads": 8, "torch_dtype": "bfloat16"}))
    return d


def _codes(text: str) -> dict[str, list[Any]]:
    _, issues = run_checks(load_spec_text(text, "spec.yaml"), env={}, files=True)
    out: dict[str, list[Any]] = {}
    for i in issues:
        out.setdefault(i.code, []).append(i)
    return out


def test_file_checks(tmp_path: Path, model_dir: Path) -> None:
    bad_yaml = tmp_path / "list.yaml"
    bad_yaml.write_text("- not a mapping\n")
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text("distributed_type: FSDP\n")
    bad_json = tmp_path / "ds.json"
    bad_json.write_text("{not json")
    cases = [
        ({"distributed": {"accelerate_config": str(tmp_path / "missing.yaml")}}, "LG633", "cannot read"),
        ({"distributed": {"accelerate_config": str(bad_yaml)}}, "LG633", "expected a YAML mapping"),
        ({"backend": "deepspeed_zero3", "distributed": {"accelerate_config": str(fsdp)}}, "LG633",
         "says distributed_type FSDP, train.backend deepspeed_zero3 means DEEPSPEED"),
        ({"distributed": {"deepspeed_config": str(bad_json)}}, "LG634", "deepspeed_config with train.backend ddp"),
        ({"backend": "deepspeed_zero2", "distributed": {"deepspeed_config": str(bad_json)}}, "LG634",
         "cannot read"),
        ({"precision": "fp16"}, "LG637", "stored in bfloat16"),
    ]
    for train, code, needle in cases:
        text = _spec(model_dir, train)
        found = _codes(text).get(code)
        assert found, (code, train)
        assert needle in found[0].message, found[0].message
        assert found[0].line is not None
    good = tmp_path / "ok.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    clean = _codes(_spec(model_dir, {"backend": "deepspeed_zero3", "distributed": {"deepspeed_config": str(good)}}))
    assert not {"LG633", "LG634", "LG635", "LG637"} & set(clean)


def test_rendered_accelerate_yaml_carries_the_offload(model_dir: Path) -> None:
    text = _spec(model_dir, {"backend": "deepspeed_zero3", "distributed": {"offload_optimizer": True}})
    plan = build_plan(load_spec_text(text, "spec.yaml"))
    acc = yaml.safe_load(plan.trainer.accelerate_config_yaml)
    assert acc["deepspeed_config"]["offload_optimizer_device"] == "cpu"
    assert acc["deepspeed_config"]["offload_param_device"] == "none"


def test_lg361_eval_data_file_checks(tmp_path: Path, model_dir: Path) -> None:
    # (kept beside the other file-stage checks of this change: it needs files on disk)
    good = tmp_path / "eval.jsonl"
    good.write_text('{"prompt": "a"}\n')
    wrong = tmp_path / "q.jsonl"
    wrong.write_text('{"question": "a"}\n')
    broken = tmp_path / "b.jsonl"
    broken.write_text("{not json\n")
    for path, needle in [(tmp_path / "missing.jsonl", "does not exist"), (wrong, "no prompt column 'prompt'"),
                         (broken, str(broken))]:
        found = _codes(_spec(model_dir, {"args": {"data": {"path": str(good)}, "eval_data": {"path": str(path)},
                                                  "eval_strategy": "steps"}})).get("LG361")
        assert found and needle in found[0].message and found[0].line is not None, (path, found)
    clean = _codes(_spec(model_dir, {"args": {"data": {"path": str(good)}, "eval_data": {"path": str(good)},
                                              "eval_strategy": "steps"}}))
    assert "LG361" not in clean


def test_lg343_peft_refuses_deepspeed_and_fsdp1_not_fsdp2(tmp_path: Path, model_dir: Path) -> None:
    lora = {"args": {"data": {"path": "d.jsonl"}, "peft": {"r": 8}}}
    assert "LG343" not in _codes(_spec(model_dir, {"backend": "fsdp", **lora}))
    assert "LG343" not in _codes(_spec(model_dir, {"backend": "ddp", **lora}))
    found = _codes(_spec(model_dir, {"backend": "deepspeed_zero2", **lora}))["LG343"]
    assert len(found) == 1 and found[0].path == "train.backend" and "not DeepSpeed" in found[0].message
    v1 = tmp_path / "fsdp1.yaml"
    v1.write_text(yaml.safe_dump({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1}}))
    v2 = tmp_path / "fsdp2.yaml"
    v2.write_text(yaml.safe_dump({"distributed_type": "FSDP", "fsdp_config": {"fsdp_offload_params": False}}))
    found = _codes(_spec(model_dir, {"backend": "fsdp", "distributed": {"accelerate_config": str(v1)}, **lora}))["LG343"]
    assert len(found) == 1 and found[0].path == "train.distributed.accelerate_config", found
    assert "fsdp_version: 1" in found[0].message and found[0].line is not None
    assert "LG343" not in _codes(_spec(model_dir, {"backend": "fsdp", "distributed": {"accelerate_config": str(v2)},
                                                   **lora}))
    # without peft an FSDP1 file is the user's choice
    assert "LG343" not in _codes(_spec(model_dir, {"backend": "fsdp", "distributed": {"accelerate_config": str(v1)}}))
