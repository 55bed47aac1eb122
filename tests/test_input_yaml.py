"""Hostile and mistaken YAML: every case exits 2 with a code and a line, fast, through the real CLI process.

Alias bombs and recursive aliases used to expand in the loader (minutes, then MemoryError or RecursionError);
duplicate keys silently kept the last value; an unquoted `8:00:00` became 28800; binary files were an internal
error. Each case here runs `launchgen check` as a subprocess, so a traceback or a hang is seen as the user
would see it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen.cli import main
from launchgen.input import yamlguard
from launchgen.input.loader import load_spec_text
from launchgen.input.yamlguard import MAX_SPEC_BYTES
from launchgen.shared.issues import SpecError

GOOD = """\
job:
  name: demo
model:
  name_or_path: org/model
train:
  trainer: sft
  args:
    data: {path: prompts.jsonl}
"""


def bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["junk_key_nobody_knows:", '  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return GOOD + "\n".join(lines) + "\n"


#: the data file GOOD names, with the columns sft and the default reward read (check peeks at it)
ROWS = '{"prompt": "1+1?", "completion": "2", "answer": "2"}\n'


def launchgen(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HOME": "/nonexistent-hf-home"}
    env.pop("LAUNCHGEN_DEBUG", None)
    (cwd / "prompts.jsonl").write_text(ROWS)
    return subprocess.run([sys.executable, "-c", "from launchgen.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def assert_refused(r: subprocess.CompletedProcess[str], code: str, line: int | None) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in unwrapped(r.stderr) and "internal error" not in unwrapped(r.stderr), r.stderr
    where = f":{line}: " if line is not None else ": "
    assert any(f" error {code}" in ln and where in ln for ln in unwrapped(r.stderr).splitlines()), r.stderr
    assert "[]" not in unwrapped(r.stderr)


def check_file(tmp_path: Path, data: str | bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    p = tmp_path / "spec.yaml"
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return launchgen("check", *extra, str(p), cwd=tmp_path)


# --- hostile YAML ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [bomb(), bomb(levels=30, width=2)], ids=["billion-laughs", "deep-doubling"])
def test_alias_bomb_under_an_unknown_key_is_refused_fast(tmp_path: Path, text: str) -> None:
    t0 = time.monotonic()
    r = check_file(tmp_path, text)
    elapsed = time.monotonic() - t0
    assert_refused(r, "LG001", None)
    assert "alias" in unwrapped(r.stderr)
    # the interpreter start is most of this; the expansion used to take 37-71 s
    assert elapsed < 5, elapsed


def test_alias_bomb_in_process_is_well_under_a_second() -> None:
    t0 = time.monotonic()
    with pytest.raises(SpecError) as exc:
        load_spec_text(bomb(), "spec.yaml")
    assert time.monotonic() - t0 < 0.5
    assert [i.code for i in exc.value.issues] == ["LG001"]


@pytest.mark.parametrize("text", [
    GOOD + "x: &a [*a]\n",
    GOOD + "x: &a {k: *a}\n",
    "job: &a {name: demo, self: *a}\nmodel: {name_or_path: m}\n",
], ids=["list", "mapping", "section"])
def test_recursive_alias_is_lg001(tmp_path: Path, text: str) -> None:
    r = check_file(tmp_path, text)
    assert_refused(r, "LG001", None)
    assert "recursive alias" in unwrapped(r.stderr)


def test_deep_nesting_is_lg001(tmp_path: Path) -> None:
    for text in (GOOD + "x: " + "[" * 5000 + "]" * 5000 + "\n", GOOD + "x: " + "[" * 70 + "]" * 70 + "\n"):
        r = check_file(tmp_path, text)
        assert_refused(r, "LG001", None)
        assert "nested too deeply" in unwrapped(r.stderr)


@pytest.mark.parametrize("text", [bomb(), GOOD + "x: &a [*a]\n", GOOD + "x: " + "[" * 3000 + "]" * 3000 + "\n",
                                  GOOD + "t: 8:00:00\n" + GOOD.splitlines()[0] + "\n"],
                         ids=["bomb", "recursive", "deep", "base60-and-duplicate"])
def test_pure_python_yaml_is_guarded_too(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """Where PyYAML lacks libyaml, the pure-Python composer recurses and reports plain styles as None."""
    monkeypatch.setattr(yamlguard, "_LOADER", yaml.SafeLoader)
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, "spec.yaml")
    assert exc.value.issues and all(i.code in ("LG001", "LG004", "LG006") for i in exc.value.issues)
    if "8:00:00" in text:
        assert {i.code for i in exc.value.issues} == {"LG004", "LG006"}


def test_benign_aliases_still_work() -> None:
    text = GOOD.replace("train:", "slurm:\n  env:\n    all: &e {A: '1'}\n    trainer: *e\ntrain:")
    loaded = load_spec_text(text, "spec.yaml")
    assert loaded.spec.slurm.env.trainer == {"A": "1"}


def test_oversized_spec_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    text = GOOD + "# " + "x" * (MAX_SPEC_BYTES + 10) + "\n"
    t0 = time.monotonic()
    r = check_file(tmp_path, text)
    assert_refused(r, "LG001", None)
    assert "at most 1,048,576" in unwrapped(r.stderr)
    assert time.monotonic() - t0 < 5


def test_check_is_linear_near_the_size_limit(tmp_path: Path) -> None:
    # the biggest spec accepted: ~1 MiB of env values (10 MB used to take up to 176 s)
    n = 9000
    env = "".join(f"      V{i}: '{'v' * 100}'\n" for i in range(n))
    text = GOOD.replace("train:", "slurm:\n  env:\n    all:\n" + env + "train:")
    assert len(text) < MAX_SPEC_BYTES
    t0 = time.monotonic()
    r = check_file(tmp_path, text)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("data", [
    bytes(range(256)) * 4,
    GOOD.encode() + b"  bad: \xff\xfe\n",
    b"\x7fELF\x02\x01\x01\x00" + bytes(200),
], ids=["binary", "latin1-byte", "elf"])
def test_binary_or_non_utf8_is_lg001(tmp_path: Path, data: bytes) -> None:
    r = check_file(tmp_path, data)
    assert_refused(r, "LG001", None)


@pytest.mark.parametrize("text", ["=\n", GOOD + "x: !python/object:os.system {}\n", GOOD + "y: !custom 1\n"])
def test_unknown_tags_are_lg001(tmp_path: Path, text: str) -> None:
    r = check_file(tmp_path, text)
    assert_refused(r, "LG001", text.count("\n"))


def test_control_character_in_the_file_is_lg001_with_its_line(tmp_path: Path) -> None:
    r = check_file(tmp_path, GOOD.replace("name: demo", "name: de\x1bmo"))
    assert_refused(r, "LG001", 2)
    assert "\x1b" not in unwrapped(r.stderr)


def test_nul_escape_is_refused_at_its_line(tmp_path: Path) -> None:
    r = check_file(tmp_path, GOOD.replace("name_or_path: org/model", 'name_or_path: "org/\\0model"'))
    assert_refused(r, "LG004", 4)
    assert "[model.name_or_path]" in unwrapped(r.stderr) and "NUL" in unwrapped(r.stderr)
    # even inside the free-form trainer arguments and env values
    r = check_file(tmp_path, GOOD.replace("prompts.jsonl", '"p\\0.jsonl"'))
    assert_refused(r, "LG004", 8)
    assert "[train.args.data.path]" in unwrapped(r.stderr)


# --- mistaken YAML ---------------------------------------------------------------------------------------------

def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    text = GOOD.replace("  name: demo\n", "  name: demo\n  name: other\n")
    r = check_file(tmp_path, text)
    assert_refused(r, "LG006", 3)
    assert "first at line 2" in unwrapped(r.stderr) and "[job.name]" in unwrapped(r.stderr)


def test_duplicate_section_is_an_error(tmp_path: Path) -> None:
    text = GOOD + "job:\n  name: again\n"
    r = check_file(tmp_path, text)
    assert_refused(r, "LG006", 9)
    assert "first at line 1" in unwrapped(r.stderr)


def test_merge_keys_are_not_duplicates() -> None:
    text = GOOD.replace("train:", "slurm:\n  env:\n    all: &e {A: '1'}\n    trainer: {<<: *e, B: '2'}\ntrain:")
    loaded = load_spec_text(text, "spec.yaml")
    assert loaded.spec.slurm.env.trainer == {"A": "1", "B": "2"}


def test_unquoted_base60_time_says_quote_it(tmp_path: Path) -> None:
    r = check_file(tmp_path, GOOD + "slurm:\n  time: 8:00:00\n")
    assert_refused(r, "LG004", 10)
    assert 'Quote it: "8:00:00"' in unwrapped(r.stderr) and "28800" in unwrapped(r.stderr)


@pytest.mark.parametrize(("line", "shown", "kind"), [
    ("model: {name_or_path: m, revision: 1.10}", "1.10", "number"),
    ("model: {name_or_path: m}\nslurm: {partition: on}", "on", "boolean"),
    ("model: {name_or_path: 2026-01-01}", "2026-01-01", "date"),
    ("model: {name_or_path: m}\nslurm: {env: {all: {HF_HUB_OFFLINE: 1}}}", "1", "number"),
])
def test_text_field_given_a_yaml_number_or_boolean_says_quote_it(line: str, shown: str, kind: str) -> None:
    text = "job: {name: demo}\n" + line + "\n"
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, "spec.yaml")
    [issue] = exc.value.issues
    assert issue.code == "LG004" and f"`{shown}` is read by YAML as a {kind}" in issue.message
    assert issue.fix == f'Quote it: "{shown}".'


def test_time_in_minutes_as_a_number_is_accepted() -> None:
    loaded = load_spec_text(GOOD + "slurm:\n  time: 480\n", "spec.yaml")
    assert loaded.spec.slurm.time_seconds == 480 * 60


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative data paths resolve from the directory check runs in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(ROWS)


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, env={"HF_HOME": "/nonexistent-hf-home"})


def test_empty_vllm_section_warns_and_fails_strict(tmp_path: Path) -> None:
    text = GOOD.replace("trainer: sft", "trainer: grpo").replace("train:", "vllm:\n  # mode: server\ntrain:")
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    r = run("check", str(p))
    assert r.exit_code == 0, r.output
    assert f"{p}:5: warning LG005 [vllm]" in unwrapped(r.stderr)
    s = run("check", "--strict", str(p))
    assert s.exit_code == 2 and "error LG005" in unwrapped(s.stderr)


def test_explicit_null_vllm_and_empty_other_sections_are_quiet(tmp_path: Path) -> None:
    text = GOOD.replace("train:", "slurm:\nvllm: null\ntrain:")
    loaded = load_spec_text(text, "spec.yaml")
    assert loaded.spec.vllm is None and not loaded.warnings


def test_empty_job_section_reports_the_missing_field() -> None:
    with pytest.raises(SpecError) as exc:
        load_spec_text(GOOD.replace("job:\n  name: demo\n", "job:\n"), "spec.yaml")
    assert [(i.code, i.path, i.line) for i in exc.value.issues] == [("LG003", "job.name", 1)]


# --- where specs come from --------------------------------------------------------------------------------------

def test_check_reads_stdin_and_several_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD + "junk: 1\n")
    r = run("check", "-", str(good), stdin=GOOD)
    assert r.exit_code == 0, r.output
    assert "<stdin>: ok" in unwrapped(r.stderr) and f"{good}: ok" in unwrapped(r.stderr)
    r = run("check", str(good), str(bad))
    assert r.exit_code == 2
    assert f"{good}: ok" in unwrapped(r.stderr) and f"{bad}:9: error LG002 [junk]" in unwrapped(r.stderr)
    j = run("check", "--format", "json", str(good), str(bad))
    assert j.exit_code == 2
    import json

    payload = json.loads(j.stdout)
    assert payload["ok"] is False and [s["ok"] for s in payload["specs"]] == [True, False]


def test_empty_spec_says_so() -> None:
    r = run("check", "-", stdin="# only a comment\n")
    assert r.exit_code == 2 and "<stdin>:1: error LG001 the spec is empty" in unwrapped(r.stderr)


def test_stdin_errors_name_stdin() -> None:
    r = run("check", "-", stdin="job: [\n")
    assert r.exit_code == 2 and r.stderr.startswith("<stdin>:")


def test_render_reads_stdin() -> None:
    r = run("render", "-", stdin=GOOD)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("#!")
