"""What a new user meets in the first ten minutes (issue 28): `init` then `check` in an empty directory, the
bundled examples checked from the repo root, one way to render in every help text, `python -m launchgen`, help
that fits 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen.cli import VERBS, main
from launchgen.cli.init import _DATA, LAYOUTS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env={"HF_HOME": "/nonexistent-hf-home", "COLUMNS": "80",
                                                     **(env or {})})


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_init_then_check_in_an_empty_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               layout: str) -> None:
    """The starter names a data file it cannot bring: init says in one line what to add; with it, `check`
    accepts the spec, and `check --no-files` accepts it before."""
    monkeypatch.chdir(tmp_path)
    r = run("init", "topology.yaml", "--layout", layout)
    assert r.exit_code == 0, r.output
    data, _rows = _DATA[layout]
    said = r.stderr.strip().splitlines()
    assert all(len(x) <= 80 for x in said), said  # wrapped at COLUMNS (on main one line of 160-183 characters)
    text = " ".join(x.strip() for x in said)
    assert f"add {data} here" in text and "launchgen check topology.yaml" in text, said

    r = run("check", "topology.yaml")
    assert r.exit_code == 2
    errors = re.findall(r" error (LG\d+) \[([^\]]+)\]", r.stderr)
    assert errors == [("LG330", "train.args.data.path")], r.stderr  # the one thing init told the user to add
    r = run("check", "--no-files", "--strict", "topology.yaml")
    assert r.exit_code == 0, r.stderr

    rows = ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
            if layout == "sft" else {"prompt": "1+1?", "answer": "2"})
    (tmp_path / data).write_text(json.dumps(rows) + "\n")
    r = run("check", "--strict", "topology.yaml")
    assert r.exit_code == 0, r.stderr
    r = run("init", "again.yaml", "--layout", layout)
    assert r.stderr.strip() == f"wrote again.yaml ({layout}); next: launchgen check again.yaml"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_bundled_example_passes_check_from_the_repo_root(example: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    r = run("check", str(example.relative_to(ROOT)))
    assert r.exit_code == 0, r.stderr
    assert " error " not in unwrapped(r.stderr)


def test_no_files_skips_exactly_the_file_reading_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = (ROOT / "examples" / "single-node-split.yaml").read_text()
    (tmp_path / "s.yaml").write_text(spec.replace("tensor_parallel_size: 4", "tensor_parallel_size: 3"))
    r = run("check", "--no-files", "s.yaml")
    codes = set(re.findall(r" (?:error|warning) (LG\d+) ", r.stderr))
    assert r.exit_code == 2 and "LG330" not in codes and codes, r.stderr  # spec errors still reported
    r = run("check", "s.yaml")
    assert "LG330" in unwrapped(r.stderr)  # examples/data is not below tmp_path


def _help_texts() -> dict[str, str]:
    out = {"launchgen": run("--help").stdout}
    for verb in VERBS:
        r = run(verb, "--help")
        if r.exit_code == 0:
            out[verb] = r.stdout
    return out


def test_help_fits_80_columns_and_renders_one_way() -> None:
    texts = _help_texts()
    assert {"launchgen", "init", "check", "plan", "render", "status", "logs", "report"} <= set(texts)
    for name, text in texts.items():
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, f"{name} --help has lines over 80 columns: {wide}"
        assert not re.findall(r"launchgen render[^#\n]* >", text), f"{name} --help teaches `render > FILE`"
    assert "render topology.yaml -o job.sbatch" in texts["launchgen"]
    starter = run("init", "-").stdout
    assert "render topology.yaml -o job.sbatch" in starter and not re.findall(r"launchgen render[^\n]* >", starter)


def test_python_dash_m_launchgen_is_the_cli() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "launchgen", "--help"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: launchgen ")
    r = subprocess.run([sys.executable, "-m", "launchgen", "check", "--no-files", "examples/colocate.yaml"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "colocate.yaml: ok" in unwrapped(r.stderr), r.stderr


def test_the_stdin_example_of_check_help_passes_in_an_empty_directory(tmp_path: Path) -> None:
    """`check --help` shows reading a spec from stdin with init's starter; in an empty directory the starter's data
    file is not there yet, so the example checks the spec alone (on main it exited 2 with LG330)."""
    shown = run("check", "--help").output
    example = next(x.split("#")[0].strip() for x in shown.splitlines() if "launchgen init - |" in x)
    r = subprocess.run(["bash", "-c", example.replace("launchgen", f"{sys.executable} -m launchgen")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HOME": "/nonexistent"})
    assert r.returncode == 0, r.stderr
