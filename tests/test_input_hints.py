"""Mistaken keys and values get a fix that names the right key: "did you mean", TRL names pointed to their
launchgen path (one table, which also renders docs/trl-names.md), and messages in words, not class names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from generated import check_generated
from tools import unwrapped

from launchgen.checks import run_checks
from launchgen.cli import main
from launchgen.input import trlnames
from launchgen.input.loader import load_spec_text
from launchgen.input.spec import Spec
from launchgen.shared.issues import Issue, SpecError

ROOT = Path(__file__).resolve().parents[1]

GOOD = """\
job: {name: demo}
model: {name_or_path: org/model}
vllm: {gpus: [0, 1, 2, 3], tensor_parallel_size: 4}
train:
  trainer: grpo
  args:
    data: {path: prompts.jsonl}
"""


def issues(text: str) -> list[Issue]:
    try:
        loaded = load_spec_text(text, "spec.yaml")
    except SpecError as exc:
        return exc.issues
    return run_checks(loaded, env={"HF_HOME": "/nonexistent-hf-home"})[1]


def only(text: str, code: str) -> Issue:
    found = [i for i in issues(text) if i.code == code]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("text", "path", "fix"), [
    (GOOD.replace("tensor_parallel_size", "tensor_paralel_size"), "vllm.tensor_paralel_size",
     "Did you mean `tensor_parallel_size`?"),
    (GOOD.replace("vllm:", "vLLM:"), "vLLM", "Did you mean `vllm`?"),
    (GOOD.replace("job: {name: demo}", "job: {nmae: demo}"), "job.nmae", "Did you mean `name`?"),
    (GOOD.replace("trainer: grpo", "trainer: grpo\n  precison: bf16"), "train.precison",
     "Did you mean `precision`?"),
])
def test_unknown_keys_get_did_you_mean(text: str, path: str, fix: str) -> None:
    hit = [i for i in issues(text) if i.code == "LG002"]
    assert [(i.path, i.fix) for i in hit] == [(path, fix)]


@pytest.mark.parametrize(("replace", "path", "fix"), [
    (("{gpus:", "{mode: sever, gpus:"), "vllm.mode", "Did you mean `server`?"),
    (("trainer: grpo", "trainer: GRPO"), "train.trainer", "Did you mean `grpo`?"),
    (("trainer: grpo", "trainer: grpo\n  backend: fspd"), "train.backend", "Did you mean `fsdp`?"),
])
def test_enum_values_get_did_you_mean(replace: tuple[str, str], path: str, fix: str) -> None:
    hit = only(GOOD.replace(*replace), "LG004")
    assert (hit.path, hit.fix) == (path, fix)


@pytest.mark.parametrize(("extra", "code", "path", "points_to"), [
    ("use_vllm: true\n", "LG002", "use_vllm", "`vllm`"),
    ("vllm_mode: colocate\n", "LG002", "vllm_mode", "`vllm.mode`"),
    ("    use_vllm: true\n", "LG901", "train.args.use_vllm", "`vllm`"),
    ("    vllm_mode: server\n", "LG901", "train.args.vllm_mode", "`vllm.mode`"),
    ("    max_completion_length: 256\n", "LG901", "train.args.max_completion_length",
     "`train.args.generation.max_completion_length`"),
    ("    fp16: true\n", "LG901", "train.args.fp16", "`train.precision`"),
    ("    bf16: true\n", "LG901", "train.args.bf16", "`train.precision`"),
    ("    vllm_server_host: 10.0.0.1\n", "LG901", "train.args.vllm_server_host", "no launchgen key"),
    ("    vllm_tensor_parallel_size: 2\n", "LG901", "train.args.vllm_tensor_parallel_size",
     "`vllm.tensor_parallel_size`"),
    ("    model_name_or_path: x\n", "LG901", "train.args.model_name_or_path", "`model.name_or_path`"),
])
def test_trl_keys_point_to_where_they_belong(extra: str, code: str, path: str, points_to: str) -> None:
    text = GOOD + extra if extra.startswith("    ") else extra + GOOD
    hit = only(text, code)
    assert hit.path == path
    assert points_to in hit.fix and (hit.fix.startswith("TRL's") or " goes in " in hit.fix), hit.fix
    assert hit.line == text.splitlines().index(extra.rstrip("\n")) + 1


def test_a_trainer_argument_one_level_off_says_where_it_goes() -> None:
    hit = only(GOOD.replace("trainer: grpo", "trainer: grpo\n  learning_rate: 1.0e-6"), "LG002")
    assert (hit.path, hit.fix) == ("train.learning_rate", "`learning_rate` goes in `train.args.learning_rate`.")


@pytest.mark.parametrize("vllm", ["{gpus: [0, 1, 2, 3], tensor_parallel_size: 4}",
                                  "{mode: colocate, tensor_parallel_size: 1}"])
def test_trl_vllm_memory_key_gets_one_message_in_either_mode(vllm: str) -> None:
    """It is TRL's name for vllm.gpu_memory_utilization: one message saying so, not also LG502's "only applies
    to colocate mode" (which is about the trainer's own colocate field and disagreed with it; issue 28)."""
    text = GOOD.replace("{gpus: [0, 1, 2, 3], tensor_parallel_size: 4}", vllm) + \
        "    vllm_gpu_memory_utilization: 0.5\n"
    about = [i for i in issues(text) if "vllm_gpu_memory_utilization" in i.path]
    assert [(i.code, i.path) for i in about] == [("LG901", "train.args.vllm_gpu_memory_utilization")], about
    assert "`vllm.gpu_memory_utilization`" in about[0].fix


def test_colocate_memory_field_in_server_mode_is_lg502() -> None:
    hit = only(GOOD + "    generation: {vllm_colocate: {gpu_memory_utilization: 0.5}}\n", "LG502")
    assert hit.path == "train.args.generation.vllm_colocate.gpu_memory_utilization"


@pytest.mark.parametrize(("replace", "path", "fix"), [
    (("trainer: grpo", "trainer: grpo\n  backend: zero3"), "train.backend", "Did you mean `deepspeed_zero3`?"),
    (("gpus: [0, 1, 2, 3]", "gpus: 0-3"), "vllm.gpus", "`[0, 1, 2, 3]`"),
    (("gpus: [0, 1, 2, 3]", "gpus: '0,1,2,3'"), "vllm.gpus", "`[0, 1, 2, 3]`"),
    (("gpus: [0, 1, 2, 3]", "gpus: 2"), "vllm.gpus", "`[2]`"),
])
def test_values_a_newcomer_writes_get_the_value_meant(replace: tuple[str, str], path: str, fix: str) -> None:
    hit = only(GOOD.replace(*replace), "LG004")
    assert hit.path == path and fix in hit.fix, hit


def test_accelerate_process_count_says_where_the_world_size_comes_from() -> None:
    hit = only(GOOD.replace("trainer: grpo", "trainer: grpo\n  num_processes: 8"), "LG002")
    assert hit.path == "train.num_processes"
    assert hit.fix.startswith("accelerate's `num_processes`") and "train.nodes x" in hit.fix, hit.fix


def test_trl_table_points_only_at_paths_that_exist() -> None:
    spec_paths = _paths(Spec)
    from launchgen.trainers.declarations.configs import CONFIGS

    args_paths = {f"train.args.{p}" for cls in CONFIGS.values() for p in _paths(cls)}
    for t in trlnames.TRL_NAMES:
        if t.path:
            assert t.path in spec_paths | args_paths | {"vllm", "model"}, t


def _paths(model: type, prefix: str = "") -> set[str]:
    from pydantic import BaseModel

    from launchgen.input.hints import _alternatives

    out = set()
    for name, f in model.model_fields.items():  # type: ignore[attr-defined]
        path = f"{prefix}{name}"
        out.add(path)
        for alt in _alternatives(f.annotation):
            if isinstance(alt, type) and issubclass(alt, BaseModel):
                out |= _paths(alt, f"{path}.")
    return out


def test_trl_names_doc_matches_the_table() -> None:
    from launchgen.kinds.trl_config import names_page

    check_generated(ROOT / "docs" / "trl-names.md", names_page(),
                    "LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_input_hints.py -k trl_names_doc")
    doc = (ROOT / "docs" / "trl-names.md").read_text()
    assert doc == names_page(), "regenerate docs/trl-names.md from launchgen.kinds.trl_config.names_page()"
    for t in trlnames.TRL_NAMES:
        assert f"| `{t.trl}` |" in doc


# --- messages ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    GOOD.replace("vllm: {gpus: [0, 1, 2, 3], tensor_parallel_size: 4}", "vllm: 5"),
    GOOD.replace("job: {name: demo}", "job: [demo]"),
    GOOD + "slurm: text\n",
    GOOD + "slurm: {env: {all: [1]}}\n",
    GOOD.replace("data: {path: prompts.jsonl}", "data: prompts.jsonl"),
])
def test_no_class_names_in_messages(text: str) -> None:
    found = issues(text)
    assert found
    # (the documented `launchgen.trainers.declarations.config.TrainerConfig` in LG901's fix is a reference, not a leak)
    names = {"Spec", "VLLMSpec", "SlurmSection", "JobSection", "ModelSpec", "TrainSpec", "RoleEnv", "DataSection",
             "GenerationSection"}
    for i in found:
        assert not names & set(re.findall(r"\w+", i.message + " " + i.fix)), i
    assert any("must be a mapping" in i.message for i in found)


def test_sft_with_vllm_gets_lg503_only() -> None:
    text = GOOD.replace("trainer: grpo", "trainer: sft").replace("tensor_parallel_size: 4", "tensor_parallel_size: 8")
    assert [i.code for i in issues(text) if i.severity == "error"] == ["LG503"]


def test_loader_issues_are_sorted_by_line_and_never_print_an_empty_field(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("job: {name: demo}\nmodel: {name_or_path: m}\nvllm: 5\nslurm: [1]\nbogus: 1\n")
    r = CliRunner().invoke(main, ["check", str(p)])
    lines = [int(m.group(1)) for m in re.finditer(rf"{re.escape(str(p))}:(\d+): error", r.stderr)]
    assert lines == sorted(lines) == [3, 4, 5]
    p.write_text("- not a mapping\n")
    r = CliRunner().invoke(main, ["check", str(p)])
    assert r.exit_code == 2 and "[]" not in unwrapped(r.stderr) and "LG001" in unwrapped(r.stderr)


def test_user_keys_with_brackets_are_reported_by_name() -> None:
    hit = only(yaml.safe_dump({"job": {"name": "demo", "a[0]": 1}, "model": {"name_or_path": "m"}}), "LG002")
    assert hit.path == "job.a[0]"
