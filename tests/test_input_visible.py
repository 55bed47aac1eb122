"""Nothing from a spec or a log drives the terminal: escape sequences and bidi overrides are printed as escapes
by check, plan and status (JSON output keeps the exact value: json.dumps escapes it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launchgen.cli import main
from launchgen.readback import status as S
from launchgen.shared.visible import visible

ESC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
BIDI = "\u202e"
SPEC = {
    "job": {"name": "demo"},
    "model": {"name_or_path": "org/model"},
    "slurm": {"env": {"all": {"GREETING": f"hi{ESC_TITLE}{BIDI}\nthere"}}},
    "vllm": {"gpus": [0, 1, 2, 3], "tensor_parallel_size": 4, "extra_args": [f"--served-model-name=x{CLEAR}"]},
    "train": {"trainer": "grpo", "args": {"data": {"path": "prompts.jsonl"}}},
}
UNSAFE = ("\x1b", "\x07", BIDI)


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), env={"HF_HOME": "/nonexistent-hf-home", "COLUMNS": "200"})
    return r.exit_code, r.stdout, r.stderr


def test_visible_escapes_controls_and_keeps_text() -> None:
    assert visible(f"a{ESC_TITLE}b\n\tc{BIDI}é") == "a\\x1b]0;pwned\\x07b\\n\tc\\u202eé"
    assert visible("plain: ünïcödé") == "plain: ünïcödé"


def test_plan_shows_escapes_not_control_sequences(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC, allow_unicode=True))
    code, out, err = run("plan", str(p))
    assert code == 0, err
    assert not any(c in out + err for c in UNSAFE)
    assert "\\x1b]0;pwned\\x07" in out and "\\x1b[2J" in out and "\\u202e" in out


def test_check_messages_show_escapes(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    bad = {**SPEC, "job": {"name": "demo", f"colour{CLEAR}": 1}, f"x{BIDI}": 2}
    p.write_text(yaml.safe_dump(bad, allow_unicode=True))
    code, out, err = run("check", str(p))
    assert code == 2
    assert not any(c in out + err for c in UNSAFE), err
    assert "colour\\x1b[2J" in err and "x\\u202e" in err
    # JSON keeps the exact key (json.dumps writes it as \u001b, which no terminal acts on)
    code, out, _err = run("check", "--format", "json", str(p))
    assert "\x1b" not in out
    assert f"job.colour{CLEAR}" in [i["path"] for i in json.loads(out)["issues"]]


def test_status_log_tail_shows_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fix = Path(__file__).resolve().parent / "fixtures" / "status"
    d = tmp_path / "job10"
    shutil.copytree(fix / "job10", d)
    st = S.analyse("10", S.scheduler_info_from_scontrol(
        S.parse_scontrol_oneliner((fix / "scontrol-job10.txt").read_text())[0]), "off", [], d, lines=5)
    assert st.failed_log is not None
    with open(st.failed_log, "a") as f:
        f.write(f"Traceback{CLEAR}{ESC_TITLE}\n")
    scontrol_text = (fix / "scontrol-job10.txt").read_text()

    def fake(cmd: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
        if cmd[:3] == ["scontrol", "show", "job"]:
            return 0, scontrol_text, ""
        return 1, "", "Slurm accounting storage is disabled"

    monkeypatch.setattr(S, "_run", fake)
    _code, out, _err = run("status", "10", "--job-dir", str(d))
    # a log's escape sequences are removed, as `logs` does (issue 37): the text stays, the clear and title go
    assert "Traceback\n" in out and "pwned" not in out and "\\x1b" not in out, out
    assert not any(c in out for c in UNSAFE)


def test_render_and_error_lines_show_escapes(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(SPEC, allow_unicode=True))
    out = tmp_path / f"job{CLEAR}.sbatch"
    code, _out, err = run("render", str(p), "-o", str(out))
    assert code == 0 and "job\\x1b[2J.sbatch" in err and "\x1b" not in err
    code, _out, err = run("render", str(p), "-o", str(out))
    assert code == 2 and "exists" in err and "\x1b" not in err
    code, _out, err = run("check", str(tmp_path / f"missing{ESC_TITLE}.yaml"))
    assert code == 2 and "\x1b" not in err and "\x07" not in err
