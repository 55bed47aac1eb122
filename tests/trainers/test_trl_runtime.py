"""`python -m launchgen.trainers.trl`: TRL 1.16's own trainers (the registry's trl, CPU, the tiny model built in
code) under launchgen's lifecycle: each entry trains, a signal checkpoints and exits 75, the next run resumes
without training a step twice, a finished run writes the marker, and config mistakes are one line and exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES
from launchgen.trainers.trl.run import main, run
from trl_runs import metric_steps, trl_cfg

from launchgen.shared.jobdir import COMPLETE_MARKER, EXIT_CONFIG, EXIT_OK, EXIT_PREEMPTED

LOCAL = [n for n, e in TRL_ENTRIES.items() if e.vllm != "server"]  # async_grpo needs a server: tests/vllm_real


def _run(cfg: dict[str, Any]) -> int:
    return run(TrlRunConfig.model_validate(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("name", LOCAL)
def test_each_trl_entry_trains_two_steps_and_writes_the_marker(name: str, tmp_path: Path, tiny_model_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = trl_cfg(tmp_path, tiny_model_dir, name)
    t0 = time.perf_counter()
    assert _run(cfg) == EXIT_OK
    took = time.perf_counter() - t0
    out = Path(cfg["args"]["output_dir"])
    assert metric_steps(out) == [1, 2]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(r.get("loss"), float) for r in records), records
    marker = json.loads((out / COMPLETE_MARKER).read_text())
    assert marker["trainer"] == f"trl.{name}" and marker["global_step"] == 2
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[launchgen] step")]
    assert [x.split()[2] for x in lines] == ["1/2", "2/2"], lines
    print(f"trl.{name}: 2 steps in {took:.1f}s")


@pytest.mark.slow
def test_signal_checkpoints_exits_75_and_the_next_run_resumes_each_step_once(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import toy_rewards

    cfg = trl_cfg(tmp_path, tiny_model_dir, "grpo", max_steps=4)
    cfg["rewards"] = [{"name": "toy_rewards:target_fraction_signal"}]
    out = Path(cfg["args"]["output_dir"])
    monkeypatch.setattr(toy_rewards, "_calls", 0)
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 2)  # USR2 while step 2 scores its completions
    assert _run(cfg) == EXIT_PREEMPTED
    assert (out / "checkpoint-2").is_dir()
    assert not (out / COMPLETE_MARKER).exists()
    assert metric_steps(out) == [1, 2]
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert _run(cfg) == EXIT_OK
    assert metric_steps(out) == [1, 2, 3, 4]  # steps 3 and 4 once each: nothing trained twice
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert json.loads((out / COMPLETE_MARKER).read_text())["global_step"] == 4


def _main_with(tmp_path: Path, cfg: dict[str, Any]) -> int:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return main(["--config", str(path)])


def test_an_unknown_trl_field_is_one_line_with_the_closest_name(tmp_path: Path, tiny_model_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = trl_cfg(tmp_path, tiny_model_dir, "grpo", num_generation=4)
    assert _main_with(tmp_path, cfg) == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "args.num_generation" in err and "GRPOConfig" in err and "did you mean `num_generations`" in err


def test_a_wrong_type_names_the_field_and_trls_own_validation_is_exit_2(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main_with(tmp_path, trl_cfg(tmp_path, tiny_model_dir, "grpo", learning_rate="fast")) == EXIT_CONFIG
    assert "GRPOConfig.learning_rate takes float, got str 'fast'" in capsys.readouterr().err
    # TRL's __post_init__: the generation batch (4 x 1) must divide into groups of num_generations (3)
    assert _main_with(tmp_path, trl_cfg(tmp_path, tiny_model_dir, "grpo", num_generations=3)) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("error: TRL's GRPOConfig: ") and "Traceback" not in err


@pytest.mark.parametrize("name", [n for n, e in TRL_ENTRIES.items() if e.teacher_field is not None])
def test_a_distillation_without_its_teacher_is_exit_2_naming_the_field(
        name: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    field = TRL_ENTRIES[name].teacher_field
    cfg = trl_cfg(tmp_path, tiny_model_dir, name)
    del cfg["args"][field]
    assert _main_with(tmp_path, cfg) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"args.{field}" in err and "teacher model" in err and "Traceback" not in err, err


def test_resume_never_refuses_a_directory_with_checkpoints(tmp_path: Path, tiny_model_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = trl_cfg(tmp_path, tiny_model_dir, "sft", resume="never")
    cfg["resume"] = "never"
    del cfg["args"]["resume"]
    (Path(cfg["args"]["output_dir"]) / "checkpoint-1").mkdir(parents=True)
    assert _main_with(tmp_path, cfg) == EXIT_CONFIG
    assert "resume: never, but" in capsys.readouterr().err
