"""`check` of `trl.*` specs and `train.script` without importing TRL: the generated field table, the topology's
fields (LG921), the script's file (LG922/LG923), the TRL x vLLM window (LG741/LG742), and the run config the plan
embeds (what `python -m launchgen.trainers.trl` reads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tools import unwrapped

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.shared import compat
from launchgen.shared.issues import SpecError

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
            "GRPOConfig") in unwrapped(res.stderr)
    assert "did you mean `num_generations`?" in unwrapped(res.stderr)


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


def test_trls_batch_rules_are_refused_before_the_queue_with_the_real_world_size() -> None:
    """TRL's own generation-batch rule (launchgen.trainers.declarations.trl.rules, agreed with TRL in
    tests/trainers/test_trl_rules.py): one CPU process with 3 prompts a step and 4 generations each is LG932 at
    num_generations' line; two processes make it 6, still refused; 2 x 2 passes. On main `check` passed it."""
    def codes(bs: int, nodes: int = 1) -> list[tuple[str, str]]:
        text = _spec({"device": "cpu", "nodes": nodes, "precision": "fp32",
                      "args": {"data": {"path": "d.jsonl"}, "num_generations": 4, "per_device_train_batch_size": bs}})
        return [(i.code, i.path) for i in _issues(text) if i.code.startswith("LG93")]

    assert codes(3) == [("LG932", "train.args.num_generations")]
    assert codes(3, nodes=2) == [("LG932", "train.args.num_generations")]
    assert codes(2, nodes=2) == []
    assert codes(4) == []


_SWITCHABLE = ("LG920", "LG924")  # what TRL's trainer lacks: one client for several replicas; prompt truncation


def _switched(text: str) -> str:
    assert "trainer: grpo" in text
    return text.replace("trainer: grpo", "trainer: trl.grpo", 1)


def test_every_grpo_example_and_starter_switches_to_trl_grpo_by_its_trainer_line() -> None:
    """One line: `trainer: grpo` -> `trainer: trl.grpo`. Each spec passes `check`, or is refused only with a code
    that names what TRL's trainer lacks, at the field that asks for it. On main the starter and
    multi-node-70b were LG901 at `train.args.trl.grpo` (the pydantic union's tag) with a generic fix."""
    from launchgen.cli.init import LAYOUTS, starter_spec

    texts = {p.name: p.read_text() for p in sorted((ROOT / "examples").glob("*.yaml"))
             if "trainer: grpo" in p.read_text()}
    texts |= {f"init {layout}": text for layout in LAYOUTS if "trainer: grpo" in (text := starter_spec(layout))}
    assert len(texts) >= 9 and "init single-node-split" in texts, sorted(texts)
    for name, text in texts.items():
        errors = [i for i in _issues(_switched(text)) if i.severity == "error"]
        assert all(i.code in _SWITCHABLE for i in errors), (name, [(i.code, i.path, i.message) for i in errors])
        for i in errors:
            assert i.path in ("vllm.replicas", "train.args.data.max_prompt_length"), (name, i.path)


def test_a_yaml_1_1_float_is_a_float_for_trl_as_for_the_bundled_trainer() -> None:
    """`learning_rate: 1e-5` is text to PyYAML (YAML 1.1 wants `1.0e-5`); both trainers take it as 1e-5."""
    for trainer in ("grpo", "trl.grpo"):
        text = _spec({"trainer": trainer, "args": {"data": {"path": "d.jsonl"}, "learning_rate": "1e-5"}})
        assert [i for i in _issues(text) if i.severity == "error"] == [], trainer
    plan = build_plan(load_spec_text(_spec({"args": {"data": {"path": "d.jsonl"}, "learning_rate": "5e-7"}}),
                                     "spec.yaml"))
    assert plan.trainer.config.args["learning_rate"] == 5e-7  # type: ignore[union-attr]
    # an int field takes no exponent: the message says why YAML made it text
    issues = [i for i in _issues(_spec({"args": {"data": {"path": "d.jsonl"}, "max_steps": "1e3"}}))
              if i.severity == "error"]
    assert [i.code for i in issues] == ["LG901"] and "YAML 1.1" in issues[0].message, issues
    assert "1000" in issues[0].fix


def test_check_reports_each_trl_rule_at_the_field_the_user_wrote() -> None:
    """Every row of launchgen.trainers.declarations.trl.rules through `check`, with the values TRL itself refuses in
    tests/trainers/test_trl_rules.py (CASES): its code, at a field of the row, and no other TRL rule."""
    sys.path.insert(0, str(ROOT / "tests" / "trainers"))
    try:
        from test_trl_rules import _BASE, CASES
    finally:
        sys.path.remove(str(ROOT / "tests" / "trainers"))
    from launchgen.trainers.declarations.trl.rules import TRL_RULES

    server = yaml.safe_load((ROOT / "examples" / "local-cpu-server.yaml").read_text())
    for rule in TRL_RULES:
        args, world, rewards = CASES[rule.code][True]
        name = rule.trainers[0]
        train_args = {**_BASE[name], **{k: v for k, v in args.items() if k != "use_vllm"},
                      "data": {"path": "d.jsonl"}, "rewards": [{"name": "accuracy"}] * rewards}
        d: dict[str, Any] = {"job": {"name": "t"}, "slurm": {"time": "01:00:00"}, "model": {"name_or_path": "org/m"},
                             "train": {"trainer": f"trl.{name}", "device": "cpu", "nodes": world, "precision": "fp32",
                                       "args": train_args}}
        if args.get("use_vllm"):  # use_vllm is the topology's: a vllm section turns it on
            d["vllm"] = server["vllm"]
        found = [(i.code, i.path) for i in _issues(yaml.safe_dump(d)) if i.code.startswith("LG93")
                 or i.code.startswith("LG94")]
        assert [c for c, _ in found] == [rule.code], (rule.code, found)
        assert found[0][1].removeprefix("train.args.") in rule.fields, found


def test_a_script_with_a_bundled_trainer_is_one_message_not_bundled_advice() -> None:
    """LG922 alone: on main it came with LG901 `data` required and `max_completion_length` belongs in
    `generation` (the bundled trainer's advice, to a script whose train.args are TRL flags)."""
    text = (ROOT / "examples" / "trl-script.yaml").read_text().replace("trainer: trl.grpo ", "trainer: grpo ")
    issues = [i for i in _issues(text) if i.severity == "error"]
    assert [(i.code, i.path) for i in issues] == [("LG922", "train.trainer")], issues


def test_script_args_written_as_one_string_gets_its_words_as_the_list() -> None:
    """On main the fix was the GPU-list example `[0, 1, 2, 3]`."""
    text = (ROOT / "examples" / "trl-script.yaml").read_text().replace(
        "script_args: [--dataset_name, examples/data/tiny-math.jsonl]",
        'script_args: "--dataset_name examples/data/tiny-math.jsonl"')
    with pytest.raises(SpecError) as refused:
        load_spec_text(text, "spec.yaml")
    issues = refused.value.issues
    assert [(i.code, i.path) for i in issues] == [("LG004", "train.script_args")], issues
    assert issues[0].fix == "Write a YAML list, one item per word: `[--dataset_name, examples/data/tiny-math.jsonl]`."


def test_a_tab_in_the_indentation_is_named_with_its_fix() -> None:
    """On main: `found character that cannot start any token`, fix `Fix the YAML syntax at that line.`"""
    for text in ("version: 1\njob:\n\tname: x\n", "version: 1\njob:\n  name: x\n\t\n"):
        with pytest.raises(SpecError) as refused:
            load_spec_text(text, "spec.yaml")
        (issue,) = refused.value.issues
        assert issue.code == "LG001" and "tab" in issue.message, issue
        assert issue.fix == "YAML indents with spaces only: replace the tab(s) on that line with spaces."


def test_a_time_limit_with_a_unit_letter_gets_the_slurm_spelling() -> None:
    """`time: 1d` (and 12h, 90min): on main the generic 'documented type and range' fix."""
    for written, want in (("1d", "1-00:00:00"), ("12h", "12:00:00"), ("36h", "1-12:00:00"), ("90min", "90")):
        text = _spec({"args": {"data": {"path": "d.jsonl"}}}).replace('time: 01:00:00', f"time: {written}")
        with pytest.raises(SpecError) as refused:
            load_spec_text(text, "spec.yaml")
        (issue,) = refused.value.issues
        assert (issue.code, issue.path) == ("LG004", "slurm.time") and f'`time: "{want}"`' in issue.fix, issue
