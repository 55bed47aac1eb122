"""`check` of `trl.*` specs and `train.script` without importing TRL: the generated field table, the topology's
fields (LG921), the script's file (LG922/LG923), the TRL x vLLM window (LG741/LG742), and the run config the plan
embeds (what `python -m launchgen.trainers.trl` reads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.shared import compat

ROOT = Path(__file__).resolve().parents[1]


def _spec(train: dict[str, Any], vllm: dict[str, Any] | None = None) -> str:
    d: dict[str, Any] = {"job": {"name": "t"}, "slurm": {"time": "01:00:00"}, "model": {"name_or_path": "org/m"},
                         "train": {"trainer": "trl.grpo", **train}}
    if vllm is not None:
        d["vllm"] = vllm
    return yaml.safe_dump(d, sort_keys=False)


def _issues(text: str, files: bool = False) -> list[Any]:
    return run_checks(load_spec_text(text, "spec.yaml"), env={}, files=files)[1]


def test_a_typo_in_a_grpoconfig_field_is_exit_2_with_line_and_suggestion_without_importing_trl(
        tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec({"args": {"data": {"path": "d.jsonl"}, "learning_rate": 1e-6, "num_generation": 4}}))
    code = ("import sys, runpy; sys.argv = ['launchgen', 'check', sys.argv[1], '--no-files']\n"
            "try:\n    runpy.run_module('launchgen', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules)\n"
            "print('HEAVY', heavy, 'RC', rc)\n")
    res = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, timeout=120)
    assert "HEAVY [] RC 2" in res.stdout, res.stdout + res.stderr
    line = next(i for i, x in enumerate(spec.read_text().splitlines(), 1) if "num_generation:" in x)
    assert (f"spec.yaml:{line}: error LG901 [train.args.num_generation] `num_generation` is not a field of TRL's "
            "GRPOConfig") in res.stderr
    assert "did you mean `num_generations`?" in res.stderr


def test_a_value_equal_to_the_topology_is_accepted_and_a_contradiction_names_both_fields() -> None:
    server = {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4}
    same = _issues(_spec({"args": {"data": {"path": "d.jsonl"}, "use_vllm": True, "vllm_mode": "server",
                                   "bf16": True}}, server))
    assert [i for i in same if i.severity == "error"] == []
    bad = [i for i in _issues(_spec({"args": {"data": {"path": "d.jsonl"}, "bf16": False,
                                              "vllm_server_host": "10.0.0.1"}}, server)) if i.code == "LG921"]
    assert {i.path for i in bad} == {"train.args.bf16", "train.args.vllm_server_host"}
    bf16 = next(i for i in bad if i.path == "train.args.bf16")
    assert "train.precision" in bf16.message and "False" in bf16.message
    # a TRL config brought over with vllm_server_timeout equal to the spec's health_timeout: told of the margin
    timeout = [i for i in _issues(_spec({"args": {"data": {"path": "d.jsonl"}, "vllm_server_timeout": 900}},
                                        {**server, "health_timeout": 900})) if i.code == "LG921"]
    assert [i.path for i in timeout] == ["train.args.vllm_server_timeout"]
    assert "vllm.health_timeout (+ 60 s) makes it 960.0" in timeout[0].message, timeout[0].message


def test_the_plan_embeds_the_run_config_with_what_the_topology_owns() -> None:
    text = _spec({"args": {"data": {"path": "d.jsonl"}, "generation": {"max_completion_length": 64},
                           "report_to": ["jsonl"]}},
                 {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4, "health_timeout": 300})
    plan = build_plan(load_spec_text(text, "spec.yaml"))
    cfg = yaml.safe_load(plan.trainer.config_yaml)
    assert cfg["trainer"] == "trl.grpo" and cfg["model_name_or_path"] == "org/m"
    args = cfg["args"]
    assert args["max_completion_length"] == 64  # the bundled generation.* key, as TRL's field
    assert args["report_to"] == []  # metrics.jsonl is always written
    assert (args["use_vllm"], args["vllm_mode"], args["bf16"], args["fp16"]) == (True, "server", True, False)
    assert args["vllm_server_timeout"] == 360.0
    assert cfg["server"]["port"] == 8000
    keys = [o.key for o in plan.trainer.overrides]
    assert keys == ["args.output_dir", "server.host", "server.port", "server.group_port"]
    assert plan.trainer.module == "launchgen.trainers.trl"


def test_auto_checkpointing_gives_trl_its_configs_value_else_trls_default() -> None:
    """launchgen does not estimate TRL's trainers: under `auto` (the default) a TRL config's own
    gradient_checkpointing is kept, else TRL 1.16's default (on); a spec value is written as today."""
    server = {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4}

    def written(train: dict[str, Any]) -> Any:
        text = _spec({"args": {"data": {"path": "d.jsonl"}}, **train}, server)
        assert [i for i in _issues(text) if i.severity == "error"] == []
        return yaml.safe_load(build_plan(load_spec_text(text, "spec.yaml")).trainer.config_yaml)["args"][
            "gradient_checkpointing"]

    assert written({}) is True
    assert written({"args": {"data": {"path": "d.jsonl"}, "gradient_checkpointing": False}}) is False
    assert written({"gradient_checkpointing": False}) is False
    both = _issues(_spec({"gradient_checkpointing": True,
                          "args": {"data": {"path": "d.jsonl"}, "gradient_checkpointing": False}}, server))
    assert [i.path for i in both if i.code == "LG921"] == ["train.args.gradient_checkpointing"]


def test_script_checks_read_the_file(tmp_path: Path) -> None:
    missing = _issues(_spec({"script": str(tmp_path / "nope.py")}), files=True)
    assert [i.path for i in missing if i.code == "LG922"] == ["train.script"]
    plain = tmp_path / "plain.py"
    plain.write_text("import os\nprint(os.environ['LAUNCHGEN_TRL_OUTPUT_DIR'])\n")
    found = [i for i in _issues(_spec({"script": str(plain)}), files=True) if i.code in ("LG922", "LG923")]
    assert [(i.code, i.severity) for i in found] == [("LG923", "warning")]
    parsed = _issues(_spec({"script": str(ROOT / "examples" / "trl_grpo_script.py")}), files=True)
    assert not [i for i in parsed if i.code in ("LG922", "LG923")]


def test_the_trl_vllm_window_is_a_row_of_the_compat_table() -> None:
    window = compat.trl_vllm_window("1.16.0")
    assert window is not None and (window.vllm_low, window.vllm_high) == ("0.22.0", "0.31.0")
    assert compat.trl_issues("1.16.0", "0.30.0", table_version="1.16.0", source="installed") == []
    outside = compat.trl_issues("1.16.0", "0.33.0", table_version="1.16.0", source="installed")
    assert [i.code for i in outside] == ["LG742"]
    other = compat.trl_issues("1.15.0", None, table_version="1.16.0", source="installed")
    assert [(i.code, i.severity) for i in other] == [("LG741", "warning")]
    versions = {"trl": None, "vllm": "0.30.0"}
    live = compat.installed_issues(versions, uses_hub_kernel=False, liger=False, needs_vllm=True,
                                   trl_table="1.16.0")
    assert ("LG741", "info") in [(i.code, i.severity) for i in live]


def test_trl_dpo_reads_preference_rows(tmp_path: Path) -> None:
    """trl.dpo's rows are prompt/chosen/rejected (facts.data `pairs`), not SFT rows."""
    good, bad = tmp_path / "pairs.jsonl", tmp_path / "other.jsonl"
    good.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    bad.write_text('{"prompt": "a", "good": "b", "rejected": "c"}\n')
    ok = _issues(_spec({"trainer": "trl.dpo", "args": {"data": {"path": str(good)}}}), files=True)
    assert not [i for i in ok if i.code == "LG332"]
    found = [i for i in _issues(_spec({"trainer": "trl.dpo", "args": {"data": {"path": str(bad)}}}), files=True)
             if i.code == "LG332"]
    assert len(found) == 1 and "missing chosen" in found[0].message
