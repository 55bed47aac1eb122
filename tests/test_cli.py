"""The CLI contract: exit codes 0/2 (1 for internal errors), one line per issue, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen import __version__
from launchgen.cli import main
from launchgen.cli.init import LAYOUTS

GOOD = """\
job:
  name: demo
model:
  name_or_path: org/model
vllm:
  mode: server
  gpus: [0, 1, 2, 3]
  tensor_parallel_size: 4
  group_port: 29551
train:
  trainer: grpo
  args:
    data: {path: prompts.jsonl}
"""


@pytest.fixture(autouse=True)
def submit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` reads the data the specs name from the current directory (the submit directory): give it some."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (tmp_path / "sft.jsonl").write_text('{"prompt": "hi", "completion": "hello"}\n')


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env={"HF_HOME": "/nonexistent-hf-home", **(env or {})})


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def assert_clean_failure(r: Result, code: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in unwrapped(r.output)
    assert f" {code} " in unwrapped(r.stderr)
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_version() -> None:
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.stdout


def test_help_lists_verbs_and_examples() -> None:
    r = run("--help")
    assert r.exit_code == 0
    for verb in ("check", "init", "schema"):
        assert verb in r.stdout
    assert "Examples" in r.stdout


def test_check_good_spec_exits_0(tmp_path: Path) -> None:
    r = run("check", write(tmp_path, GOOD))
    assert r.exit_code == 0, r.output
    assert "ok (0 error(s)" in unwrapped(r.stderr)
    assert r.stdout == ""


def test_check_bad_yaml(tmp_path: Path) -> None:
    r = run("check", write(tmp_path, "job: [unclosed\n"))
    assert_clean_failure(r, "LG001")


def test_check_unknown_key_points_at_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("  tensor_parallel_size: 4\n", "  tensor_parallel_size: 4\n  tp_size: 4\n"))
    r = run("check", path)
    assert_clean_failure(r, "LG002")
    assert f"{path}:9: error LG002 [vllm.tp_size]" in unwrapped(r.stderr)


def test_check_missing_file(tmp_path: Path) -> None:
    r = run("check", str(tmp_path / "absent.yaml"))
    assert_clean_failure(r, "LG000")


def test_check_bad_value(tmp_path: Path) -> None:
    r = run("check", write(tmp_path, GOOD.replace("tensor_parallel_size: 4", "tensor_parallel_size: lots")))
    assert_clean_failure(r, "LG004")


def test_check_cross_field_error_line_format(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("tensor_parallel_size: 4", "tensor_parallel_size: 2"))
    r = run("check", path)
    assert_clean_failure(r, "LG201")
    first = next(ln for ln in unwrapped(r.stderr).splitlines() if "LG201" in ln)
    assert first.startswith(f"{path}:8: error LG201 [vllm.tensor_parallel_size] ")
    # wrapped at 80 columns in a pipe: the message's rest and the fix on indented lines after it
    line = next(ln for ln in unwrapped(r.stderr).splitlines() if "LG201" in ln)
    assert " Fix: " in line and line.startswith(first)
    assert all(len(ln) <= 80 for ln in unwrapped(r.stderr).splitlines() if not ln.startswith(str(tmp_path)))


def test_strict_turns_warning_into_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("  group_port: 29551\n", "  group_port: 29551\n  bind: 0.0.0.0\n"))
    r = run("check", path)
    assert r.exit_code == 0 and "warning LG801" in unwrapped(r.stderr)
    r = run("check", "--strict", path)
    assert r.exit_code == 2 and "error LG801" in unwrapped(r.stderr)


def test_json_format(tmp_path: Path) -> None:
    r = run("check", "--format", "json", write(tmp_path, GOOD.replace("port: 29551", "port: 80")))
    assert r.exit_code == 2
    payload = json.loads(r.stdout)
    assert payload["ok"] is False
    assert payload["summary"]["error"] >= 1
    hit = next(i for i in payload["issues"] if i["code"] == "LG401")
    assert hit["path"] == "vllm.group_port" and hit["line"] == 9 and hit["severity"] == "error"
    r = run("check", "--format", "json", write(tmp_path, GOOD, "ok.yaml"))
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True


def test_usage_error_keeps_click_exit_2() -> None:
    r = run("check", "--no-such-option", "x.yaml")
    assert r.exit_code == 2 and "Traceback" not in unwrapped(r.output)


def test_unexpected_exception_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import launchgen.cli.common as common

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(common, "run_checks", boom)
    r = run("check", write(tmp_path, GOOD))
    assert r.exit_code == 1
    assert "Traceback" not in unwrapped(r.output)
    assert "internal error: RuntimeError: kaboom" in unwrapped(r.stderr)
    assert "LAUNCHGEN_DEBUG=1" in unwrapped(r.stderr)
    r = run("check", write(tmp_path, GOOD), env={"LAUNCHGEN_DEBUG": "1"})
    assert isinstance(r.exception, RuntimeError)


def test_missing_verb_module_does_not_break_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    import launchgen.cli as cli

    monkeypatch.setattr(cli, "VERBS", (*cli.VERBS, "no-such-verb"))
    r = run("--help")
    assert r.exit_code == 0 and "no-such-verb" not in r.stdout
    assert run("no-such-verb").exit_code == 2


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_init_writes_a_spec_that_passes_strict_check(tmp_path: Path, layout: str) -> None:
    path = str(tmp_path / f"{layout}.yaml")
    r = run("init", path, "--layout", layout)
    assert r.exit_code == 0, r.output
    assert "#" in Path(path).read_text()  # commented
    r = run("check", "--strict", path)
    assert r.exit_code == 0, r.stderr
    assert " error " not in unwrapped(r.stderr) and " warning " not in unwrapped(r.stderr)


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    path = write(tmp_path, "keep me\n")
    r = run("init", path)
    assert r.exit_code == 2 and "--force" in unwrapped(r.stderr)
    assert Path(path).read_text() == "keep me\n"
    r = run("init", path, "--force", "--layout", "sft")
    assert r.exit_code == 0 and "trainer: sft" in Path(path).read_text()


def test_init_to_stdout() -> None:
    r = run("init", "-", "--layout", "colocate")
    assert r.exit_code == 0 and "mode: colocate" in r.stdout


def test_schema_json_and_markdown() -> None:
    r = run("schema")
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    assert {"job", "model", "vllm", "train", "slurm"} <= set(schema["properties"])
    r = run("schema", "--format", "markdown")
    assert r.exit_code == 0
    for field in ("`job.name`", "`vllm.tensor_parallel_size`", "`train.args`", "`slurm.env.trainer`",
                  "`job.port_offset`"):
        assert field in r.stdout
    assert "**required**" in r.stdout


def test_check_explain_prints_the_plan(tmp_path: Path) -> None:
    import launchgen.planning.view  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    r = run("check", "--explain", write(tmp_path, GOOD))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip(), "the plan view goes to stdout"


def test_render_refuses_to_overwrite(tmp_path: Path) -> None:
    import launchgen.cli.render  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    out = write(tmp_path, "existing\n", "job.sbatch")
    r = run("render", write(tmp_path, GOOD), "-o", out)
    assert r.exit_code == 2 and "Traceback" not in unwrapped(r.output)
    assert Path(out).read_text() == "existing\n"
    r = run("render", write(tmp_path, GOOD), "-o", out, "--force")
    assert r.exit_code == 0, r.output
    assert Path(out).read_text().startswith("#!")


def test_spec_reference_doc_is_current() -> None:
    from launchgen.cli.schema import markdown_document

    doc = Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"
    assert doc.read_text() == markdown_document() + "\n", (
        "docs/spec-reference.md is stale: run `launchgen schema --format markdown > docs/spec-reference.md`")
