"""Every local `trl.*` entry end to end through a rendered `--bash` script (shellcheck clean): accelerate launch,
`launchgen.rank`, TRL's own trainer class on CPU with the tiny model, 2 steps, the completion marker and
metrics.jsonl in the job directory, the plain step lines in the trainer log."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchgen.trainers.trl.entries import TRL_ENTRIES
from tools import env_with_venv, tool
from trl_runs import trl_cfg

from launchgen.loader import load_spec_text
from launchgen.plan import build_plan
from launchgen.render import render_script, render_steps

TOY_REWARDS = Path(__file__).parent / "trainers"
LOCAL = [n for n, e in TRL_ENTRIES.items() if e.vllm != "server"]  # async_grpo: tests/vllm_real/test_trl.py
#: Run-config keys the spec owns (job.output_dir, train.device) or names elsewhere (model.name_or_path).
_SPEC_OWNED = ("output_dir", "use_cpu")


def trl_spec(tmp_path: Path, model: Path, name: str, **args: Any) -> str:
    cfg = trl_cfg(tmp_path, model, name, **args)
    train_args = {k: v for k, v in cfg["args"].items() if k not in _SPEC_OWNED}
    train_args.update({k: cfg[k] for k in ("data", "rewards", "save_final_model") if k in cfg})
    return yaml.safe_dump({
        "version": 1,
        "job": {"name": f"trl-{name.replace('_', '-')}", "output_dir": "runs/%j"},
        "slurm": {"time": "00:30:00", "max_restarts": 0},
        "model": {"name_or_path": str(model), "dtype": "float32"},
        "train": {"device": "cpu", "nodes": 1, "trainer": f"trl.{name}", "precision": "fp32", "args": train_args},
    }, sort_keys=False)


def render_bash(tmp_path: Path, text: str) -> Path:
    plan = build_plan(load_spec_text(text, str(tmp_path / "spec.yaml")))
    script = tmp_path / "job.sh"
    script.write_text(render_script(plan, "bash"))
    paths = [str(script)]
    for rel, body in render_steps(plan, "bash").items():
        (tmp_path / rel.replace("/", "_")).write_text(body)
        paths.append(str(tmp_path / rel.replace("/", "_")))
    lint = subprocess.run([tool("shellcheck"), "--shell=bash", "--severity=style", *paths], capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout
    return script


@pytest.mark.slow
@pytest.mark.parametrize("name", LOCAL)
def test_each_trl_entry_runs_two_steps_under_the_rendered_bash_script(name: str, tmp_path: Path,
                                                                       tiny_model_dir: Path) -> None:
    script = render_bash(tmp_path, trl_spec(tmp_path, tiny_model_dir, name))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(TOY_REWARDS), env.get("PYTHONPATH", "")])  # the `module:function` reward
    t0 = time.perf_counter()
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    took = time.perf_counter() - t0
    job = tmp_path / "runs" / "local"
    log = job / "logs" / "attempt-0" / "trainer-local.log"
    assert res.returncode == 0, res.stderr[-2000:] + (log.read_text()[-4000:] if log.exists() else "")
    marker = json.loads((job / "trainer" / "launchgen-complete.json").read_text())
    assert marker["trainer"] == f"trl.{name}" and marker["global_step"] == 2
    steps = [json.loads(x)["step"] for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert [x.split()[2] for x in log.read_text().splitlines() if x.startswith("[launchgen] step")] == ["1/2", "2/2"]
    print(f"trl.{name}: rendered --bash job, 2 steps, {took:.1f}s wall")


@pytest.mark.slow
def test_the_user_script_example_runs_under_its_rendered_bash_script(tmp_path: Path, tiny_model_dir: Path) -> None:
    """examples/trl-script.yaml: the unchanged TRL script (examples/trl_grpo_script.py) as the job's trainer."""
    root = Path(__file__).resolve().parent.parent
    ex = tmp_path / "examples"
    (ex / "data").mkdir(parents=True)
    (ex / "tiny-model").symlink_to(tiny_model_dir)
    for name in ("trl-script.yaml", "trl_grpo_script.py", "data/tiny-math.jsonl"):
        (ex / name).write_text((root / "examples" / name).read_text())
    text = (ex / "trl-script.yaml").read_text()
    plan = build_plan(load_spec_text(text, "examples/trl-script.yaml"))
    script = tmp_path / "trl-script.sh"
    script.write_text(render_script(plan, "bash"))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    job = tmp_path / "launchgen-runs" / "local"
    log = job / "logs" / "attempt-0" / "trainer-local.log"
    assert res.returncode == 0, res.stderr[-2000:] + (log.read_text()[-4000:] if log.exists() else "")
    marker = json.loads((job / "trainer" / "launchgen-complete.json").read_text())
    assert marker["global_step"] == 2 and marker["trainer"] == "script:examples/trl_grpo_script.py"
    text = log.read_text()
    assert "[launchgen] step 2/2" in text
    assert (job / "trainer" / "model.safetensors").is_file()  # the script's own trainer.save_model(output_dir)
