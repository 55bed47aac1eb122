"""The job-directory contract (launchgen.shared.jobdir): every writer's output parses with the one reader.

Writers: `format_event` (the Python form of `lg_event`), the rendered scripts' `lg_event` lines, the run-record
writer the scripts run with `python3`, `Plan.to_json`, the trainers' completion marker, `launchgen.jobside.rank`'s pid
and exit files. Readers: `parse_event`, `RunRecord.from_json`, `CompletionMarker.from_json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from render_cases import EXAMPLES, VARIANTS, plan_for, renderable

from launchgen.script.render import render_script
from launchgen.shared import jobdir as J

#: a sample for every declared field, as the scripts write them
SAMPLES = {"job": "1234", "attempt": "0", "restart_count": "2", "spec_sha256": "ab" * 32,
           "nodes": "node1 node2", "after": "17s", "exit": "137", "status": "75", "restart": "3",
           "replica": "1", "codes": "PF101,PF104", "seconds": "2", "rank": "1", "node": "node3"}


@pytest.mark.parametrize("kind", list(J.EVENTS.values()), ids=lambda k: k.name)
def test_every_event_round_trips(kind: J.EventKind) -> None:
    values = {k: SAMPLES[k] for k in kind.keys}
    words = kind.words[:1]
    line = J.format_event(kind.name, *words, ts=1764680000.0, **values)
    ev = J.parse_event(line)
    assert ev is not None, line
    assert (ev.name, ev.words, ev.fields, ev.ts) == (kind.name, words, values, 1764680000.0)
    assert ev.time_text == "2025-12-02T12:53:20Z" and line.startswith(ev.time_text)


def test_writer_refuses_what_the_contract_lacks() -> None:
    with pytest.raises(ValueError, match="unknown event"):
        J.format_event("trainer_exploded")
    with pytest.raises(ValueError, match="no word or field 'code'"):
        J.format_event(J.Ev.TRAINER_EXIT, code=1)
    with pytest.raises(ValueError, match="no word or field 'USR1'"):
        J.format_event(J.Ev.SIGNAL, "USR1")


def test_parser_skips_what_is_not_an_event() -> None:
    assert J.parse_event("garbage line") is None
    assert J.parse_event("2026-12-02T13:00:0") is None  # a torn write
    assert J.parse_event("2026-13-40T13:00:00Z start") is None  # not a time
    assert [e.name for e in J.parse_events("x\n2026-12-02T13:00:00Z usr2\n\n")] == ["usr2"]


# ------------------------------------------------------------------------------------ rendered scripts ---

_SHELL_EXPANSION_RE = re.compile(r"\$\(\([^)]*\)\)|\$\{[^}]*\}|\$\w+")


def _event_lines(script: str) -> list[str]:
    """The event text of every `lg_event`/`lg_fail` call, each shell expansion replaced by `@`; `lg_fail`'s first
    argument is the rest of a `server_failed` event."""
    out = []
    for m in re.finditer(r'^\s*(lg_event|lg_fail) "([^"]*)"', script, re.M):
        text = _SHELL_EXPANSION_RE.sub("@", m[2])
        out.append(f"{J.Ev.SERVER_FAILED} {text}" if m[1] == "lg_fail" else text)
    return out


def _check_declared(text: str) -> str:
    ev = J.parse_event(f"2026-12-02T13:00:00Z {text}")
    assert ev is not None, text
    kind = J.EVENTS.get(ev.name)
    assert kind is not None, f"{text!r}: event {ev.name!r} is not declared in launchgen.shared.jobdir"
    # `@` is a run-time value: as a word, one of the declared words (`signal $1`)
    assert all(w in kind.words or (w == "@" and kind.words) for w in ev.words), text
    assert set(ev.fields) <= set(kind.keys), text
    return ev.name


CASES = [(n, s) for n in EXAMPLES + list(VARIANTS) for s in ("sbatch", "bash") if renderable(n, s)]


@pytest.mark.parametrize(("name", "sched"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_rendered_event_lines_are_declared_events(name: str, sched: str) -> None:
    script = render_script(plan_for(name), sched)
    names = {_check_declared(text) for text in _event_lines(script)}
    assert {J.Ev.START, J.Ev.TRAINER_START, J.Ev.TRAINER_EXIT, J.Ev.EXIT, J.Ev.USR2, J.Ev.SIGNAL} <= names
    assert f"%({J.EVENT_TIME_FORMAT})T" in script  # lg_event stamps with the contract's time format
    assert J.RUN_RECORD_WRITER in script
    # what `status` looks for in a batch script and a batch log
    assert f"\n{J.OUTPUT_DIR_VAR}=" in script and f"{J.LOGS_ANNOUNCEMENT} $LG_LOG_DIR" in script
    assert f"\n{J.ENV_PID_DIR}=" in script  # where launchgen.jobside.rank writes and steps/signal.sh reads


def test_every_declared_event_is_written_by_some_script() -> None:
    """No event is documented that nothing writes."""
    written = {_check_declared(t) for n, s in CASES for t in _event_lines(render_script(plan_for(n), s))}
    assert written == set(J.EVENTS)


# ---------------------------------------------------------------------------------------- run record ---


def test_static_record_round_trips() -> None:
    plan = plan_for("single-node-split")
    data = json.loads(json.dumps(plan.to_json()))
    assert data["record_version"] == J.RECORD_VERSION
    rec = J.RunRecord.from_json(data)
    assert rec.attempt is None and rec.logs is None and rec.role_nodes() == {"server": [], "trainer": []}
    assert rec.to_json() == data
    assert rec.layout_value("events_log") == plan.layout.events_log == J.DEFAULT_LAYOUT.events_log


def test_the_scripts_writer_produces_a_record_the_reader_reads(tmp_path: Path) -> None:
    """The record writer as the rendered job runs it (its heredoc, plain python3, the attempt's environment)
    writes a record that reads back as `RunRecord` with every run-time field filled."""
    plan = plan_for("single-node-split")
    script = render_script(plan, "sbatch")
    writer = script.split("<<'LAUNCHGEN_PY' || lg_log \"could not write", 1)[1].split("\n", 1)[1]
    writer = writer.split("\nLAUNCHGEN_PY\n", 1)[0] + "\n"
    assert writer == J.RUN_RECORD_WRITER
    static = tmp_path / J.STATIC_PLAN_FILE
    static.write_text(json.dumps(plan.to_json()))
    log_dir = tmp_path / J.DEFAULT_LAYOUT.log_dir.format(attempt=1)
    log_dir.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "LG_NODE_LIST": "nodeA", "LG_ATTEMPT": "1", "LG_JOB_DIR": str(tmp_path),
           "LG_SCHEDULER": "sbatch", "SLURM_SUBMIT_DIR": "/sub", "LG_JOB_ID": "42", "LG_RESTART_COUNT": "1",
           "LG_LOG_DIR": str(log_dir), "LG_SERVER_HOST": "nodeA", "LG_PORT_OFFSET": "0",
           J.ENV_PID_DIR: str(tmp_path / "run")}
    env |= {p.var: str(p.base) for p in plan.ports}
    out = tmp_path / J.PLAN_FILE
    subprocess.run(["python3", "-", str(static), str(out)], input=writer, text=True, env=env,
                   check=True)
    data = json.loads(out.read_text())
    assert json.loads((log_dir / J.PLAN_FILE).read_text()) == data
    rec = J.RunRecord.from_json(data)
    assert (rec.version, rec.job_id, rec.attempt, rec.restart_count, rec.scheduler) == (1, "42", 1, 1, "sbatch")
    assert rec.role_nodes() == {"server": ["nodeA"], "trainer": ["nodeA"]}
    layout = J.DEFAULT_LAYOUT
    assert rec.logs and rec.logs["trainer"]["nodeA"] == str(tmp_path / layout.role_log("trainer", 1, "nodeA"))
    assert rec.logs["events"] == str(tmp_path / layout.events_log.format(attempt=1))
    assert rec.batch_log() == "/sub/" + plan.layout.batch_log.replace("%j", "42")
    assert rec.complete_marker == str(tmp_path / layout.complete_marker)
    assert rec.to_json() == data
    unset = [f.name for f in dataclasses.fields(rec) if getattr(rec, f.name) is None]
    assert unset == [], f"the writer does not fill {unset}"
    assert [f.name for f in J.run_time_fields()] == [f.name for f in dataclasses.fields(rec)][2:]
    assert not set(data) - set(plan.to_json()) - {f.name for f in dataclasses.fields(rec)}, "keys only the writer knows"


def test_a_hand_edited_record_reads_with_bad_fields_absent() -> None:
    rec = J.RunRecord.from_json({"attempt": "one", "logs": [], "job_id": "7", "nodes": "x"})
    assert (rec.attempt, rec.logs, rec.job_id, rec.version) == (None, None, "7", 0)
    assert rec.role_nodes() == {"server": [], "trainer": []}


# ---------------------------------------------------------------------------------- layout and files ---


def test_layout_names() -> None:
    lay = J.DEFAULT_LAYOUT
    assert lay.role_log("server", 3, "node7") == "logs/attempt-3/server-node7.log"
    assert J.role_log_of("server-node7.log") == ("server", "node7", 0)
    assert J.role_log_of("server-r2-node7.log") == ("server", "node7", 2)
    assert J.role_log_of("trainer-node7.log") == ("trainer", "node7", 0)
    assert J.role_log_of("signal.log") is None and J.role_log_of("batch-node1.log") is None
    assert lay.logs_root() == "logs" and J.attempt_of("attempt-12") == 12 and J.attempt_of("attempt-0.bak") is None
    assert J.announced_job_dirs("t launchgen: job 9 attempt 2: logs in /a b/x/logs/attempt-2\n"
                                "logs in /runs/9/logs/attempt-3\n") == ["/runs/9"]
    assert J.pid_file("/p", "n1", 3) == Path("/p/n1/rank3.pid") and J.exit_file("/p", "n1", 3).name == "rank3.exit"


def test_rank_writes_the_contracts_pid_and_exit_files(tmp_path: Path) -> None:
    env = {**os.environ, J.ENV_PID_DIR: str(tmp_path), J.ENV_NODE_NAME: "nodeZ", "RANK": "2"}
    p = subprocess.run([sys.executable, "-m", "launchgen.jobside.rank", "json.tool", "--help"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert J.pid_file(tmp_path, "nodeZ", 2).read_text().strip().isdigit()
    assert J.exit_file(tmp_path, "nodeZ", 2).read_text() == "0\n"


def test_the_trainers_marker_reads_back(tmp_path: Path) -> None:
    from launchgen.trainers import checkpoint

    path = checkpoint.write_complete_marker(tmp_path, 12, "grpo")
    assert path.name == J.COMPLETE_MARKER
    marker = J.CompletionMarker.from_json(json.loads(path.read_text()))
    assert (marker.trainer, marker.global_step) == ("grpo", 12) and marker.finished_at > 0
    assert checkpoint.EXIT_PREEMPTED == J.EXIT_PREEMPTED == 75


def test_the_script_looks_for_the_marker_where_the_trainer_writes_it() -> None:
    """The trainer writes COMPLETE_MARKER into its output_dir (the layout's trainer_output_dir); the script's
    requeue step tests the layout's complete_marker."""
    for name in EXAMPLES:
        plan = plan_for(name)
        lay = plan.layout
        assert lay.complete_marker == f"{lay.trainer_output_dir}/{J.COMPLETE_MARKER}"
        script = render_script(plan, "sbatch")
        assert f"LG_TRAINER_OUTPUT=$LG_JOB_DIR/{lay.trainer_output_dir}\n" in script
        assert f"LG_COMPLETE_MARKER=$LG_JOB_DIR/{lay.complete_marker}\n" in script


def test_a_real_bash_run_writes_only_contract_lines(tmp_path: Path) -> None:
    """The rendered --bash script with the lifecycle stand-ins: its events.log and run record, through the reader."""
    from test_render_lifecycle import _run, _spec, _write_script

    res = _run(tmp_path, _write_script(tmp_path, _spec(max_steps=10)), FAKE_VLLM_PIDFILE=str(tmp_path / "pid"),
               FAKE_TRAINER_STEP_S="0.25")
    assert res.returncode == J.EXIT_OK, res.stderr
    job = tmp_path / "runs" / J.LOCAL_JOB_ID
    rec = J.RunRecord.from_json(json.loads((job / J.PLAN_FILE).read_text()))
    assert (rec.version, rec.attempt, rec.job_id, rec.scheduler) == (J.RECORD_VERSION, 0, J.LOCAL_JOB_ID, "bash")
    assert rec.logs and Path(rec.logs["events"]) == job / J.DEFAULT_LAYOUT.events_log.format(attempt=0)
    text = Path(rec.logs["events"]).read_text()
    events = J.parse_events(text)
    assert len(events) == len(text.splitlines())  # every line parses
    assert all(e.name in J.EVENTS for e in events)
    assert [e.name for e in events][:4] == [J.Ev.START, J.Ev.PREFLIGHT, J.Ev.SERVER_START, J.Ev.TRAINER_START]
    ends = {e.name: e.fields for e in events}
    assert ends[J.Ev.TRAINER_EXIT] == {"status": "0"} and ends[J.Ev.EXIT] == {"status": "0"}
    assert ends[J.Ev.START]["job"] == J.LOCAL_JOB_ID and J.Ev.COMPLETE in ends
    assert J.announced_job_dirs(res.stdout + res.stderr) == [str(job.resolve())]
    assert Path(str(rec.complete_marker)).is_file()  # the stand-in trainer's marker (its fields: not ours)


def test_the_contract_is_standard_library_only() -> None:
    """Trainers, login-node verbs and the compute node's python3 all read it: it pulls in nothing else (but the
    static record's compact form, whose source the run-record writer carries)."""
    code = ("import sys, launchgen.shared.jobdir; "
            "print(sorted(m for m in sys.modules if m.startswith('launchgen') or m in ('pydantic', 'yaml', 'jinja2')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == \
        "['launchgen', 'launchgen.shared', 'launchgen.shared.jobdir', 'launchgen.shared.noderuns']"


def test_templates_take_the_pid_directory_from_the_contract() -> None:
    """The pid directory's variable and path have one owner (`ENV_PID_DIR`, `Layout.pid_dir`): the templates read
    them from the render context and never spell them."""
    templates = Path(__file__).resolve().parents[1] / "templates"
    for path in templates.rglob("*.j2"):
        text = path.read_text()
        assert J.ENV_PID_DIR not in text, path
        assert "/pids" not in text, path
