"""PF109: the preflight finds every command a role runs, and the trainer's Python finds launchgen's and TRL's
modules, before any model loads (issue 35, item 1). On main, a `--bash` job run from a shell without its
environment passed the preflight and ended later with status 127 (`accelerate: command not found`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_render_lifecycle import _spec, _write_script
from tools import tool

from launchgen.jobside import allocprobe as A
from launchgen.script.preflightfacts import trainer_modules

_RECORD = {"trainer": {"argv": ["accelerate", "launch", "-m", "launchgen.jobside.rank", "launchgen.trainers.trl"]},
           "server": {"argv": [["vllm", "serve", "m"]]}}


def _bin(tmp: Path, name: str, shebang: str) -> Path:
    d = tmp / "bin"
    d.mkdir(parents=True, exist_ok=True)
    exe = d / name
    exe.write_text(f"#!{shebang}\n")
    exe.chmod(0o755)
    return d


def test_a_command_missing_from_path_is_pf109_naming_role_command_and_fix(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    failures = A.command_probes(_RECORD, ["trainer", "server"], {"PATH": str(empty)}, {},
                                find=lambda py, mods: [])
    assert [c for c, _ in failures] == ["PF109", "PF109"]
    assert "the trainer runs `accelerate`, which is not on PATH" in failures[0][1]
    assert "the server runs `vllm`" in failures[1][1] and "slurm.setup" in failures[1][1]


def test_a_trainer_python_without_launchgen_or_trl_is_pf109_by_asking_that_python(tmp_path: Path) -> None:
    # an `accelerate` whose interpreter is a Python without launchgen: a plain interpreter with -I ignores our paths
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    py = tmp_path / "python3"
    py.symlink_to(bare)
    d = _bin(tmp_path, "accelerate", str(py))
    facts = {"trainer_modules": trainer_modules("launchgen.trainers.trl")}
    asked: list[str] = []

    def find(python: str, modules: list[str]) -> list[str] | None:
        asked.append(python)
        return A.missing_modules(python, modules)

    failures = A.command_probes(_RECORD, ["trainer"], {"PATH": str(d)}, facts, find=find)
    assert asked == [str(py)]
    assert [c for c, _ in failures] == ["PF109"], failures
    assert "cannot import launchgen.jobside.rank, launchgen.trainers.trl, trl" in failures[0][1], failures
    # the environment that has them: nothing to report
    ok = _bin(tmp_path / "ok", "accelerate", sys.executable)
    assert A.command_probes(_RECORD, ["trainer"], {"PATH": str(ok)}, facts) == []


def test_a_role_inside_a_pyxis_image_is_not_judged_from_the_host(tmp_path: Path) -> None:
    facts = {"trainer_image": "img", "server_image": "img"}
    assert A.command_probes(_RECORD, ["trainer", "server"], {"PATH": str(tmp_path)}, facts) == []


def test_a_bash_job_run_without_its_environment_stops_in_the_preflight(tmp_path: Path) -> None:
    """The rendered script itself, from a shell whose PATH has python3 and the system tools but not accelerate."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    path = os.pathsep.join([str(tools), "/usr/bin", "/bin"])
    assert shutil.which("accelerate", path=path) is None, f"accelerate is installed system-wide ({path})"
    script = _write_script(tmp_path, _spec(max_steps=3))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV")}
    env["PATH"] = path
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "preflight PF109 on local: the trainer runs `accelerate`, which is not on PATH" in res.stderr, res.stderr
    assert "the server runs `vllm`" in res.stderr
    events = (tmp_path / "runs/local/logs/attempt-0/events.log").read_text()
    assert "codes=PF109" in events and "server_start" not in events, events
    st = subprocess.run([tool("launchgen"), "status", "local", "--job-dir", str(tmp_path / "runs/local")],
                        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "preflight failed before any model loaded: PF109" in st.stdout, st.stdout
