"""`launchgen plan` and `launchgen render`: same checks as `check`, script-only stdout, exit 2 on errors."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen.cli import main
from launchgen.input.loader import load_spec
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script

ROOT = Path(__file__).resolve().parent.parent
SPLIT = str(ROOT / "examples" / "single-node-split.yaml")
MULTI = str(ROOT / "examples" / "multi-node-70b.yaml")

WARNS = """\
job: {name: w}
model: {name_or_path: org/model}
vllm: {gpus: [0, 1], tensor_parallel_size: 2, group_port: 51216}
train:
  args: {data: {path: d.jsonl}}
"""

BAD = """\
job: {name: b}
model: {name_or_path: org/model}
vllm: {gpus: [0, 1], tensor_parallel_size: 2}
train:
  gpus: [1, 2]
  args: {data: {path: d.jsonl}, learning_rate: -1}
"""


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"HF_HOME": "/nonexistent-hf-home"})


def test_render_stdout_is_exactly_the_script() -> None:
    r = run("render", SPLIT)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == render_script(build_plan(load_spec(SPLIT)), "sbatch")


def test_render_warnings_go_to_stderr_only(tmp_path: Path) -> None:
    spec = tmp_path / "w.yaml"
    spec.write_text(WARNS)
    r = run("render", str(spec))
    assert r.exit_code == 0
    assert r.stdout.startswith("#!/bin/bash\n") and "LG" not in r.stdout.split("\n", 1)[0]
    assert "warning LG403" in unwrapped(r.stderr) and "LG403" not in r.stdout


def test_render_and_plan_refuse_errors_with_a_message_each(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD)
    for verb in ("render", "plan"):
        r = run(verb, str(spec))
        assert r.exit_code == 2
        assert r.stdout == ""
        lines = [line for line in unwrapped(r.stderr).splitlines() if line.strip()]
        assert lines and all(" error " in line or " warning " in line or " info " in line for line in lines)
        assert "Traceback" not in unwrapped(r.stderr)
        assert any("[train.gpus]" in line or "[train.args.learning_rate]" in line for line in lines)


def test_render_bash_refuses_multi_node() -> None:
    r = run("render", MULTI, "--bash")
    assert r.exit_code == 2 and r.stdout == "" and "LG909" in unwrapped(r.stderr)


def test_render_output_file_force_and_mode(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    assert run("render", SPLIT, "--bash", "-o", str(out)).exit_code == 0
    assert os.access(out, os.X_OK) and out.read_text().startswith("#!/bin/bash")
    out.write_text("keep me")
    r = run("render", SPLIT, "--bash", "-o", str(out))
    assert r.exit_code == 2 and "--force" in unwrapped(r.stderr) and out.read_text() == "keep me"
    assert run("render", SPLIT, "--bash", "-o", str(out), "--force").exit_code == 0
    assert out.read_text() == render_script(build_plan(load_spec(SPLIT)), "bash")


def test_plan_text_and_json() -> None:
    r = run("plan", MULTI)
    assert r.exit_code == 0, r.stderr
    assert "GPU map" in r.stdout and "Ports" in r.stdout and "GPU 0-7 server TP0-7" in r.stdout  # 80 columns
    r = run("plan", MULTI, "--format", "json")
    data = json.loads(r.stdout)
    assert [n["roles"] for n in data["nodes"]] == [["trainer"]] * 4 + [["server"]]
    assert {p["name"]: p["host_position"] for p in data["ports"]}["group"] == 0


def test_docs_teach_the_safe_output_form_and_a_failed_render_keeps_the_file(tmp_path: Path) -> None:
    """`render > job.sbatch` lets the shell empty job.sbatch before launchgen runs: help, README and the examples
    show -o, and with -o a failing render leaves an existing script as it was (issue 13)."""
    r = run("render", "--help")
    assert "-o FILE, the safe form" in " ".join(r.stdout.split()), r.stdout
    root = Path(__file__).resolve().parents[1]
    for doc in [root / "README.md", *sorted((root / "examples").glob("*.yaml"))]:
        bad = re.findall(r"launchgen render[^#\n]* >", doc.read_text())
        assert not bad, f"{doc.name} teaches `render > FILE`: {bad}"
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD)
    out = tmp_path / "job.sbatch"
    out.write_text("#!/bin/bash\n# the user's working script\n")
    r = run("render", str(spec), "-o", str(out), "--force")
    assert r.exit_code == 2 and r.stdout == ""
    assert out.read_text() == "#!/bin/bash\n# the user's working script\n"
