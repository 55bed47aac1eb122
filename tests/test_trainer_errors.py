"""A failed trainer names its own exception (type, message, the user's file:line) in the job's summary, `status`
and `report`, for every kind of trainer; accelerate's `CalledProcessError`, which restates only the exit status,
never stands in for it (issue 35, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from launchgen.trainers.declarations.errors import failure_line
from test_trl_render import render_bash
from tools import env_with_venv

from launchgen.cli import main as cli_main
from launchgen.readback import runreport
from launchgen.shared import jobdir

_REWARD = '''def score(prompts, completions, **columns):
    raise ValueError("the reward cannot read " + repr(completions[0])[:10])
'''
_SCRIPT = '''from trl import GRPOConfig, TrlParser

parser = TrlParser(GRPOConfig)
(args,) = parser.parse_args_and_config()
raise KeyError("dataset_name")
'''


def test_failure_line_names_the_users_frame_not_the_library_it_called(tmp_path: Path) -> None:
    user = tmp_path / "mine.py"
    user.write_text("import json\n\ndef go():\n    return json.loads('{')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import mine  # type: ignore[import-not-found]

        with pytest.raises(ValueError) as caught:
            mine.go()
    finally:
        sys.path.remove(str(tmp_path))
    line = failure_line(caught.value)
    assert line.startswith(jobdir.TRAINER_ERROR_PREFIX + "JSONDecodeError: Expecting property name")
    assert line.endswith(f"{user}:4)"), line  # json's own frames are the library's


def _spec(model: Path, trainer: str, **train: Any) -> str:
    args: dict[str, Any] = {"num_generations": 4, "per_device_train_batch_size": 4, "max_steps": 2,
                            "rewards": [{"name": "badreward:score"}]}
    if trainer == "grpo":
        args["generation"] = {"max_completion_length": 4}
    else:
        args["max_completion_length"] = 4
    if "script" in train:
        args = {"max_steps": 2}
    else:
        args["data"] = {"path": "prompts.jsonl"}
    return yaml.safe_dump({
        "version": 1, "job": {"name": "fails", "output_dir": "runs/%j"},
        "slurm": {"time": "00:30:00", "max_restarts": 0},
        "model": {"name_or_path": str(model), "dtype": "float32"},
        "train": {"device": "cpu", "nodes": 1, "trainer": trainer, "precision": "fp32", "args": args, **train},
    }, sort_keys=False)


@pytest.mark.slow
@pytest.mark.parametrize(("trainer", "train", "reason"), [
    ("grpo", {}, "ValueError: the reward cannot read"),
    ("trl.grpo", {}, "ValueError: the reward cannot read"),
    ("trl.grpo", {"script": "train.py"}, "KeyError: 'dataset_name' (train.py:5)"),
], ids=["bundled", "trl", "script"])
def test_a_failed_trainer_is_named_by_its_own_exception(trainer: str, train: dict[str, Any], reason: str,
                                                       tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "badreward.py").write_text(_REWARD)
    (tmp_path / "train.py").write_text(_SCRIPT)
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "Say {i}", "answer": "7"}}\n' for i in range(8)))
    script = render_bash(tmp_path, _spec(tiny_model_dir, trainer, **train))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 1, res.stdout + res.stderr
    says = [x for x in (res.stdout + res.stderr).splitlines() if "the trainer says:" in x]
    assert len(says) == 1 and reason in says[0] and "CalledProcessError" not in says[0], says
    if "script" not in train:
        assert "(badreward.py:2)" in says[0], says
    job = tmp_path / "runs" / "local"
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        status = CliRunner().invoke(cli_main, ["status", "local", "--job-dir", str(job)])
    finally:
        os.chdir(cwd)
    assert reason in " ".join(status.output.split()), status.output
    report = runreport.build("local", job)
    assert reason in report.summary
    assert any(reason in lane.how for lane in report.lanes if lane.role == "trainer"), report.lanes
