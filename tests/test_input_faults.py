"""Inputs found by fault injection against 3388ad8 (issue 25): each is refused with a code, exit 2 and no traceback,
within seconds (a FIFO or /dev/zero named by the spec used to hang `check` or exhaust its memory)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tools import tool, unwrapped

from launchgen.input import directives


def _spec(tmp: Path, **patch: Any) -> Path:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "qwen2", "num_attention_heads": 8, "num_key_value_heads": 4}')
    (tmp / "d.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
    d: dict[str, Any] = {
        "job": {"name": "t"},
        "slurm": {"time": "02:00:00"},
        "model": {"name_or_path": str(model)},
        "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4, "group_port": 29551},
        "train": {"trainer": "grpo", "gpus": [4, 5, 6, 7], "args": {"data": {"path": str(tmp / "d.jsonl")}}},
    }
    for section, values in patch.items():
        d[section] = {**d.get(section, {}), **values}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def _launchgen(tmp: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("launchgen"), *args], cwd=tmp, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("field", ["accelerate_config", "deepspeed_config"])
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_distributed_config_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, fifo: Path,
                                                                            field: str, special: str) -> None:
    target = str(fifo) if special == "fifo" else special
    backend = "deepspeed_zero3"
    spec = _spec(tmp_path, train={"backend": backend, "distributed": {field: target}})
    cmds = [["check", str(spec)]]
    if field == "accelerate_config":  # the plan merges it into the generated one; render reads no other file
        cmds.append(["render", str(spec), "-o", str(tmp_path / "job.sbatch")])
    for cmd in cmds:
        r = _launchgen(tmp_path, *cmd)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        out = r.stdout + unwrapped(r.stderr)
        assert "Traceback" not in out and "internal error" not in out, out
        assert "not a regular file" in out, out


def test_data_and_model_config_that_are_fifos_do_not_hang_check(tmp_path: Path, fifo: Path) -> None:
    spec = _spec(tmp_path)
    d = yaml.safe_load(spec.read_text())
    d["train"]["args"]["data"]["path"] = str(fifo.with_suffix(".jsonl"))
    os.mkfifo(fifo.with_suffix(".jsonl"))
    model = tmp_path / "model"
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    spec.write_text(yaml.safe_dump(d))
    r = _launchgen(tmp_path, "check", str(spec))
    out = r.stdout + unwrapped(r.stderr)
    assert "LG331" in out and "not a regular file" in out, out
    assert "Traceback" not in out, out


def test_a_trl_script_that_is_not_a_regular_file_is_refused_not_called_missing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    os.mkfifo(script)
    spec = _spec(tmp_path, train={"trainer": "trl.grpo", "script": str(script), "args": {}})
    r = _launchgen(tmp_path, "check", str(spec))
    out = r.stdout + unwrapped(r.stderr)
    assert r.returncode == 2 and "LG922" in out and "a FIFO, not a regular file" in out, out
    assert "does not exist" not in out and "Traceback" not in out, out


def test_specfiles_reads_regular_files_up_to_the_limit_only(tmp_path: Path, fifo: Path) -> None:
    # imported here, not at the top: the CLI tests above must run (and fail) on 3388ad8, which has no specfiles
    from launchgen.input import specfiles

    f = tmp_path / "c.json"
    f.write_text("x" * 10)
    assert specfiles.read_text(f, limit=10) == "x" * 10
    with pytest.raises(specfiles.NotAFile, match="10 bytes"):
        specfiles.read_text(f, limit=9)
    with pytest.raises(specfiles.NotAFile, match="a FIFO"):
        specfiles.read_bytes(fifo)
    with pytest.raises(specfiles.NotAFile, match="a character device"):
        specfiles.read_bytes("/dev/zero")
    with pytest.raises(specfiles.NotAFile, match="a directory"):
        specfiles.read_bytes(tmp_path)


@pytest.mark.parametrize("entry", ["--export-file=vars.env", "--export-f vars.env", "--get-user-env",
                                   "--get-user=10L", "--input=in.txt", "-i in.txt", "-iin.txt", "--uid=0",
                                   "--gid=0", "--ntasks-per-gpu=1", "--ntasks-per-g 1"])
def test_sbatch_options_that_change_environment_io_or_tasks_are_refused_in_every_spelling(tmp_path: Path,
                                                                                          entry: str) -> None:
    with pytest.raises(directives.DirectiveError, match="is refused"):
        directives.validate(entry)
    r = _launchgen(tmp_path, "check", str(_spec(tmp_path, slurm={"extra_directives": [entry]})))
    out = r.stdout + unwrapped(r.stderr)
    assert r.returncode == 2 and "[slurm.extra_directives.0]" in out and "is refused" in out, out


def test_cpus_per_gpu_beside_the_cpus_per_task_a_shared_node_plan_writes_is_refused(tmp_path: Path) -> None:
    spec = _spec(tmp_path, slurm={"exclusive": False, "extra_directives": ["--cpus-per-gpu=4"]})
    r = _launchgen(tmp_path, "check", str(spec))
    out = r.stdout + unwrapped(r.stderr)
    assert r.returncode == 2 and "LG812" in out and "--cpus-per-task" in out, out
    # an exclusive node: launchgen writes no --cpus-per-task, so sbatch takes --cpus-per-gpu
    ok = _launchgen(tmp_path, "check", str(_spec(tmp_path, slurm={"extra_directives": ["--cpus-per-gpu=4"]})))
    assert "LG812" not in ok.stdout + ok.stderr, ok.stdout + ok.stderr


@pytest.mark.parametrize(("name", "value"), [("SHELLOPTS", "errexit"), ("BASH_ENV", "/tmp/x"), ("IFS", ":"),
                                             ("PATH", ""), ("PATH", "/opt/bin"), ("SECONDS", "0"), ("ENV", "/tmp/x"),
                                             ("BASHOPTS", "extglob"), ("HOME", "")])
def test_env_keys_that_break_the_job_shell_are_refused(tmp_path: Path, name: str, value: str) -> None:
    spec = _spec(tmp_path, slurm={"env": {"trainer": {name: value}}})
    r = _launchgen(tmp_path, "check", str(spec))
    out = r.stdout + unwrapped(r.stderr)
    assert r.returncode == 2 and "LG810" in out and f"slurm.env.trainer.{name}" in out, out


def test_ordinary_env_keys_pass(tmp_path: Path) -> None:
    spec = _spec(tmp_path, slurm={"env": {"all": {"NCCL_DEBUG": "INFO", "HOME_DIR": "", "PATHS": "x"}}})
    r = _launchgen(tmp_path, "check", str(spec))
    assert "LG810" not in r.stdout + r.stderr, r.stdout + r.stderr
