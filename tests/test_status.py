"""`launchgen status` / `launchgen logs` from recorded scheduler output and job directories (no cluster needed).

The scontrol fixtures and job directories under tests/fixtures/status/ were recorded from real jobs on the
local SLURM 22.05 cluster (tests/slurm/cluster/): job 8 completed (scenario 9), job 10 was requeued once by
USR2 and then refused a second requeue (the cap), job 12 was cancelled, job 3 failed (trainer exit 1).
The sacct text is written in 22.05's `-P -n -D` format (that cluster runs without accounting by default).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tools import unwrapped

from launchgen.readback import status as S

FIX = Path(__file__).resolve().parent / "fixtures" / "status"


def scontrol(job: str) -> S.SchedulerInfo:
    recs = S.parse_scontrol_oneliner((FIX / f"scontrol-job{job}.txt").read_text())
    assert len(recs) == 1
    return S.scheduler_info_from_scontrol(recs[0])


# ------------------------------------------------------------------------------------------ parsing


def test_scontrol_fields_of_recorded_jobs() -> None:
    done = scontrol("8")
    assert (done.state, done.exit_code, done.exit_signal, done.finished) == ("COMPLETED", 0, 0, True)
    assert done.node_list == "node1" and done.work_dir and done.std_out and done.std_out.endswith("-8.out")
    requeued = scontrol("10")
    assert (requeued.state, requeued.exit_code, requeued.restarts) == ("FAILED", 75, 1)
    cancelled = scontrol("12")
    assert (cancelled.state, cancelled.exit_code, cancelled.exit_signal) == ("CANCELLED", 0, 15)
    failed = scontrol("3")
    assert (failed.state, failed.reason, failed.exit_code) == ("FAILED", "NonZeroExitCode", 1)


def test_scontrol_values_with_spaces_and_het_lines() -> None:
    text = (
        "JobId=7 HetJobId=7 HetJobOffset=0 JobName=a b JobState=RUNNING Reason=None ExitCode=0:0 "
        "Command=/my dir/job.sbatch WorkDir=/my dir StdOut=/my dir/x-7.out CPUs/Task=1 ReqB:S:C:T=0:0:*:* Power=\n"
        "JobId=8 HetJobId=7 HetJobOffset=1 JobName=a b JobState=RUNNING ExitCode=0:0 Power=\n"
    )
    recs = S.parse_scontrol_oneliner(text)
    assert [r["JobId"] for r in recs] == ["7", "8"]
    assert recs[0]["WorkDir"] == "/my dir" and recs[0]["Command"] == "/my dir/job.sbatch"
    assert recs[0]["JobName"] == "a b" and recs[0]["CPUs/Task"] == "1" and recs[0]["Power"] == ""
    assert S.parse_scontrol_oneliner("slurm_load_jobs error: Invalid job id specified") == []


SACCT = """\
42|lg-preempt|REQUEUED|0:0|2026-12-02T13:00:00|2026-12-02T13:01:00|node1|/work/sub
42.batch|batch|CANCELLED|0:15|2026-12-02T13:00:00|2026-12-02T13:01:00|node1|
42.0|bash|CANCELLED|0:15|2026-12-02T13:00:01|2026-12-02T13:01:00|node1|
42|lg-preempt|COMPLETED|0:0|2026-12-02T13:01:05|2026-12-02T13:02:00|node1|/work/sub
42.batch|batch|COMPLETED|0:0|2026-12-02T13:01:05|2026-12-02T13:02:00|node1|
42.0|server|CANCELLED|0:15|2026-12-02T13:01:06|2026-12-02T13:01:59|node1|
42.1|trainer|COMPLETED|0:0|2026-12-02T13:01:06|2026-12-02T13:01:58|node1|
43|other|COMPLETED|0:0|2026-12-02T13:01:05|2026-12-02T13:02:00|node2|/x
"""


def test_sacct_latest_run_and_its_steps() -> None:
    info, steps = S.parse_sacct(SACCT, "42")
    assert info is not None and info.source == "sacct"
    assert (info.state, info.restarts, info.work_dir) == ("COMPLETED", 1, "/work/sub")
    assert [s.step_id for s in steps] == ["batch", "0", "1"]  # only the latest run's steps
    assert steps[1].exit_signal == 15 and steps[2].exit_code == 0
    assert S.parse_sacct(SACCT, "99") == (None, [])


def test_text_events_of_the_rendered_script() -> None:
    evs = S.parse_events_text((FIX / "job10" / "logs" / "attempt-0" / "events.log").read_text(), 0)
    names = [e.event for e in evs]
    assert names[:3] == ["attempt_start", "step_start", "step_start"]
    assert "signal" in names and "requeue" in names and names[-1] == "job_end"
    exit_ev = next(e for e in evs if e.event == "step_exit")
    assert (exit_ev.role, exit_ev.exit_code) == ("trainer", 75)
    assert next(e for e in evs if e.event == "signal").signal == "USR2"
    failed = S.parse_events_text("2026-12-02T13:00:00Z server_failed exit=1\n"
                                 "2026-12-02T13:00:05Z server_failed health_timeout\n"
                                 "garbage line\n", 2)
    assert [(e.event, e.exit_code, e.attempt) for e in failed] == [("server_died", 1, 2), ("health_timeout", None, 2)]


# ------------------------------------------------------------------------------------------ analysis


def _jobdir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(FIX / name, d)
    return d


def test_requeued_job_post_mortem(tmp_path: Path) -> None:
    d = _jobdir(tmp_path, "job10")
    st = S.analyse("10", scontrol("10"), "off", [], d, lines=5)
    assert st.attempt == 1 and st.attempts == [0, 1]
    roles = {r.role: r for r in st.roles}
    assert roles["trainer"].state == "preempted" and roles["trainer"].exit_code == 75
    assert roles["server"].state == "stopped" and "after the trainer ended" in roles["server"].how
    assert st.first_to_end == "trainer"
    assert st.failed_log and st.failed_log.endswith("attempt-1/trainer-node1.log")
    assert st.failed_log_tail and len(st.failed_log_tail) <= 5
    assert any("requeue refused" in n for n in st.notes), st.notes
    assert any("USR2" in n for n in st.notes), st.notes
    assert st.last_health is not None and st.last_health.ok
    json.dumps(st.to_dict())  # --format json must serialise


def test_completed_job_post_mortem(tmp_path: Path) -> None:
    d = _jobdir(tmp_path, "job8")
    st = S.analyse("8", scontrol("8"), "off", [], d)
    roles = {r.role: r for r in st.roles}
    assert roles["trainer"].state == "exited" and roles["trainer"].exit_code == 0
    assert roles["server"].state == "stopped"
    assert st.first_to_end == "trainer" and st.failed_log is None and st.failed_log_tail == []
    assert "COMPLETED" in st.summary and "trainer ended first" in st.summary


def _synthetic(tmp_path: Path, events: str, server_log: str = "", trainer_log: str = "") -> Path:
    d = tmp_path / "job"
    a = d / "logs" / "attempt-0"
    a.mkdir(parents=True)
    (a / "events.log").write_text(events)
    (a / "server-node1.log").write_text(server_log)
    (a / "trainer-node2.log").write_text(trainer_log)
    (d / "launchgen-plan.json").write_text(json.dumps({"nodes": [
        {"name": "node1", "position": 1, "roles": ["server"]},
        {"name": "node2", "position": 0, "roles": ["trainer"]}]}))
    return d


def _info(state: str, code: int = 1, sig: int = 0) -> S.SchedulerInfo:
    return S.SchedulerInfo(source="scontrol", job_id="5", state=state, exit_code=code, exit_signal=sig)


def test_server_died_before_health_names_its_log(tmp_path: Path) -> None:
    d = _synthetic(tmp_path,
                   "2026-12-02T13:00:00Z start job=5 attempt=0 restart_count=0\n"
                   "2026-12-02T13:00:00Z server_start nodes=node1\n"
                   "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                   "2026-12-02T13:00:03Z server_failed exit=1\n"
                   "2026-12-02T13:00:04Z exit status=1\n",
                   server_log="loading\nValueError: no model at /nope\n")
    st = S.analyse("5", _info("FAILED"), "off", [], d, lines=1)
    assert st.first_to_end == "server"
    server = next(r for r in st.roles if r.role == "server")
    assert server.state == "health_failure" and server.exit_code == 1 and server.nodes == ["node1"]
    assert st.failed_log and st.failed_log.endswith("server-node1.log")
    assert st.failed_log_tail == ["ValueError: no model at /nope"]
    assert next(r for r in st.roles if r.role == "trainer").state == "stopped"
    assert st.last_health is not None and not st.last_health.ok


def test_health_timeout_and_scancel(tmp_path: Path) -> None:
    d = _synthetic(tmp_path, "2026-12-02T13:00:00Z server_start nodes=node1\n"
                   "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                   "2026-12-02T13:15:00Z server_failed health_timeout\n")
    st = S.analyse("5", _info("FAILED"), "off", [], d)
    assert next(r for r in st.roles if r.role == "server").state == "health_timeout"
    assert "health timeout" in st.summary

    d2 = _synthetic(tmp_path / "b", "2026-12-02T13:00:00Z server_start nodes=node1\n"
                    "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                    "2026-12-02T13:00:09Z server_healthy after=9s\n"
                    "2026-12-02T13:01:00Z signal TERM\n")
    st2 = S.analyse("5", _info("CANCELLED", 0, 15), "off", [], d2)
    assert {r.state for r in st2.roles} == {"stopped"}
    assert all("scancel" in r.how for r in st2.roles)


def test_running_job(tmp_path: Path) -> None:
    d = _synthetic(tmp_path, "2026-12-02T13:00:00Z server_start nodes=node1\n"
                   "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                   "2026-12-02T13:00:09Z server_healthy after=9s\n")
    st = S.analyse("5", _info("RUNNING", 0), "off", [], d)
    assert [r.state for r in st.roles] == ["running", "running"]
    assert st.first_to_end is None and "running" in st.summary
    assert st.last_health is not None and st.last_health.ok


def test_sacct_steps_name_roles_without_events(tmp_path: Path) -> None:
    d = tmp_path / "nolog"
    (d / "logs" / "attempt-0").mkdir(parents=True)
    (d / "logs" / "attempt-0" / "trainer-node2.log").write_text("x\n")
    _, steps = S.parse_sacct(SACCT, "42")
    st = S.analyse("42", _info("COMPLETED", 0), "on", steps, d)
    roles = {r.role: r for r in st.roles}
    assert roles["trainer"].state == "exited" and "from sacct" in roles["trainer"].how
    assert roles["server"].state == "killed"
    assert any("no events log" in n for n in st.notes)


def test_tail_reads_from_the_end(tmp_path: Path) -> None:
    f = tmp_path / "big.log"
    f.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert S.tail(f, 3) == ["line 99997", "line 99998", "line 99999"]
    assert len(S.tail(f, 0)) == 100_000
    g = tmp_path / "small.log"
    g.write_bytes(b"a\nb\nno newline at the end")
    assert S.tail(g, 2) == ["b", "no newline at the end"]
    assert S.tail(g, 9) == ["a", "b", "no newline at the end"]
    g.write_bytes(b"")
    assert S.tail(g, 3) == []


# ------------------------------------------------------------------------------------------ discovery + CLI


def _fake_run(monkeypatch: pytest.MonkeyPatch, scontrol_text: str, sacct_err: str = "Slurm accounting storage is disabled",
              script: str = "") -> None:
    def run(cmd: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
        if cmd[:3] == ["scontrol", "show", "job"]:
            return (0, scontrol_text, "") if scontrol_text else (1, "", "slurm_load_jobs error: Invalid job id specified")
        if cmd[:3] == ["scontrol", "write", "batch_script"]:
            return (0, script, "") if script else (1, "", "error")
        if cmd[0] == "sacct":
            return 1, "", sacct_err
        raise AssertionError(cmd)

    monkeypatch.setattr(S, "_run", run)


def test_job_dir_found_from_the_batch_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job10")
    out = tmp_path / "submit" / "lg-requeue-cap-10.out"
    out.parent.mkdir()
    out.write_text(f"2026-12-02T13:07:58Z launchgen: job 10 attempt 0: logs in {d}/logs/attempt-0\n")
    line = (f"JobId=10 JobName=lg JobState=FAILED Reason=NonZeroExitCode Restarts=1 ExitCode=75:0 "
            f"WorkDir={out.parent} StdErr={out} StdIn=/dev/null StdOut={out} Power=")
    _fake_run(monkeypatch, line)
    st = S.collect("10")
    assert st.job_dir == str(d)
    assert st.accounting.startswith("off") and "disabled" in st.accounting


def test_job_dir_found_from_the_batch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job8")
    line = f"JobId=8 JobState=COMPLETED ExitCode=0:0 WorkDir={tmp_path} StdOut={tmp_path}/gone-8.out Power="
    _fake_run(monkeypatch, line, script=f"#!/bin/bash\nLG_OUTPUT_DIR={tmp_path}/job%j\n")
    (tmp_path / "job8").rename(tmp_path / "job8x")
    shutil.copytree(tmp_path / "job8x", d)
    assert S.collect("8").job_dir == str(d)


def test_unknown_job_says_pass_job_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_run(monkeypatch, "")
    with pytest.raises(S.StatusError, match="--job-dir"):
        S.collect("12345")
    with pytest.raises(S.StatusError, match="numeric"):
        S.collect("12;rm -rf /")


def _cli(args: list[str]) -> Any:
    from launchgen.cli import main

    return CliRunner().invoke(main, args)


def test_cli_status_table_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job10")
    _fake_run(monkeypatch, (FIX / "scontrol-job10.txt").read_text())
    r = _cli(["status", "10", "--job-dir", str(d), "--format", "json"])
    assert r.exit_code == 3, r.output  # FAILED (the requeue cap): a failed job exits non-zero
    data = json.loads(r.output)
    assert data["first_to_end"] == "trainer" and data["attempt"] == 1
    assert data["scheduler"]["restarts"] == 1
    r = _cli(["status", "10", "--job-dir", str(d)])
    assert r.exit_code == 3, r.output
    assert "┏" not in unwrapped(r.output) and "  - attempt: 1; role: trainer; node: node1;" in unwrapped(r.output)  # piped: records
    for text in ("trainer", "preempted", "attempt: 1", "accounting (sacct): off", "trainer-node1.log"):
        assert text in unwrapped(r.output), r.output


def test_cli_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job10")
    _fake_run(monkeypatch, (FIX / "scontrol-job10.txt").read_text())
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "server", "--attempt", "0", "--path-only"])
    assert r.exit_code == 0 and r.output.strip().endswith("attempt-0/server-node1.log"), r.output
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--node", "0", "-n", "1"])
    assert r.exit_code == 0 and r.output.strip(), r.output
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--attempt", "7"])
    assert r.exit_code == 2 and "attempts 0, 1" in unwrapped(r.output)
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--node", "node9"])
    assert r.exit_code == 2 and "node1" in unwrapped(r.output)


def test_status_never_imports_torch() -> None:
    import subprocess
    import sys

    code = "import sys, launchgen.readback.status, launchgen.cli.status, launchgen.cli.logs; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# ------------------------------------------------------------------------------------------ a failed job explains itself
# early298/ was recorded on the local cluster: a CPU job (no vLLM) whose slurm.setup line `source .venv/bin/activate`
# named a missing file; the batch script died a second after it started, before any step (issue 13).


def _early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sub = tmp_path / "submit"
    shutil.copytree(FIX / "early298", sub)
    out = sub / "early-298.out"
    out.write_text(out.read_text().replace("/tmp/early", str(sub)))
    _fake_run(monkeypatch, (FIX / "scontrol-job298.txt").read_text().replace("/tmp/early", str(sub)))
    return sub


def test_early_death_shows_the_batch_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = _early(tmp_path, monkeypatch)
    st = S.collect("298")
    assert st.job_dir == str(sub / "runs" / "298") and st.failed and st.over
    assert st.batch_log == str(sub / "early-298.out") and st.failed_log == st.batch_log
    assert st.failed_log_tail[-1].endswith(".venv/bin/activate: No such file or directory")
    assert [(r.role, r.state) for r in st.roles] == [("trainer", "not_started")]  # no vLLM: no server row
    assert "never started" in st.roles[0].how and "no step started" in st.summary
    assert not any("has not started yet" in n for n in st.notes), st.notes
    r = _cli(["status", "298"])
    assert r.exit_code == 3, r.output
    assert ".venv/bin/activate: No such file or directory" in unwrapped(r.output) and "FAILED" in unwrapped(r.output)
    assert "server" not in unwrapped(r.output).replace("sacct", "")
    data = json.loads(_cli(["status", "298", "--format", "json"]).output)
    assert data["failed"] and data["batch_log"].endswith("early-298.out")


def test_batch_log_found_beside_the_job_dir_without_the_scheduler(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sub = _early(tmp_path, monkeypatch)
    _fake_run(monkeypatch, "")  # the controller forgot the job
    st = S.collect("298", job_dir=sub / "runs" / "298")
    assert st.batch_log == str(sub / "early-298.out")


def test_step_log_that_explains_wins_over_the_batch_log(tmp_path: Path) -> None:
    d = _synthetic(tmp_path, "2026-12-02T13:00:00Z server_start nodes=node1\n"
                   "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                   "2026-12-02T13:00:05Z trainer_exit status=1\n", trainer_log="ValueError: boom\n")
    (tmp_path / "lg-5.out").write_text("launchgen: the trainer exited with status 1\n")
    (d / "launchgen-plan.json").write_text(json.dumps({"layout": {"batch_log": "lg-%j.out"}, "nodes": [
        {"name": "node1", "position": 1, "roles": ["server"]}, {"name": "node2", "position": 0, "roles": ["trainer"]}]}))
    st = S.analyse("5", _info("FAILED"), "off", [], d)
    assert st.failed_log and st.failed_log.endswith("trainer-node2.log") and st.batch_log == str(tmp_path / "lg-5.out")
    # an empty trainer log explains nothing: then the batch log is shown
    Path(st.failed_log).write_text("")
    st = S.analyse("5", _info("FAILED"), "off", [], d)
    assert st.failed_log == str(tmp_path / "lg-5.out")


def test_job_without_vllm_has_no_server_row(tmp_path: Path) -> None:
    d = tmp_path / "job"
    (d / "logs" / "attempt-0").mkdir(parents=True)
    (d / "logs" / "attempt-0" / "events.log").write_text("2026-12-02T13:00:00Z trainer_start nodes=node1\n"
                                                         "2026-12-02T13:00:05Z trainer_exit status=0\n")
    (d / "logs" / "attempt-0" / "trainer-node1.log").write_text("done\n")
    st = S.analyse("5", _info("COMPLETED", 0), "off", [], d)  # no plan file: roles from logs and events
    assert [r.role for r in st.roles] == ["trainer"] and not st.failed


def test_copied_attempt_directory_is_ignored(tmp_path: Path) -> None:
    d = _jobdir(tmp_path, "job10")
    shutil.copytree(d / "logs" / "attempt-0", d / "logs" / "attempt-0.bak")
    (d / "logs" / "attempt-x").mkdir()
    st = S.analyse("10", scontrol("10"), "off", [], d)
    assert st.attempts == [0, 1] and all(".bak" not in lg.path for lg in st.logs)


def _local_run(tmp_path: Path, trainer_status: int, end: bool = True) -> Path:
    d = tmp_path / "launchgen-runs" / "local"
    a = d / "logs" / "attempt-0"
    a.mkdir(parents=True)
    (d / "launchgen-plan.json").write_text(json.dumps({"scheduler": "bash", "job_id": "local", "nodes": [
        {"name": "local", "position": 0, "roles": ["trainer"]}]}))
    events = "2026-12-02T13:00:00Z start job=local attempt=0\n2026-12-02T13:00:00Z trainer_start nodes=local\n"
    if end:
        events += f"2026-12-02T13:00:04Z trainer_exit status={trainer_status}\n2026-12-02T13:00:04Z exit status={trainer_status}\n"
    (a / "events.log").write_text(events)
    (a / "trainer-local.log").write_text("step 1\nerror: model.name_or_path './nomodel': not found\n")
    return d


def test_status_local_from_the_job_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scheduler(cmd: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
        raise AssertionError(f"a local run asks no scheduler: {cmd}")

    monkeypatch.setattr(S, "_run", no_scheduler)
    d = _local_run(tmp_path, 2)
    for cwd in (d, tmp_path):  # in the job directory, or where `bash job.sh` ran
        monkeypatch.chdir(cwd)
        r = _cli(["status", "local"])
        assert r.exit_code == 3, r.output
        assert "local run (--bash): ended, exit 2" in unwrapped(r.output) and "not found" in unwrapped(r.output)
        assert "server" not in unwrapped(r.output)
    ok = _local_run(tmp_path / "ok", 0)
    assert _cli(["status", "local", "--job-dir", str(ok)]).exit_code == 0
    running = S.collect("local", _local_run(tmp_path / "run", 0, end=False))
    assert [r.state for r in running.roles] == ["running"] and not running.over and not running.failed
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = _cli(["status", "local"])
    assert r.exit_code == 2 and "--job-dir" in unwrapped(r.output)


def test_piped_status_keeps_paths_whole_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "a-rather-long-project-directory-name" / "experiments" / "grpo-qwen-7b-sweep-03"
    deep.mkdir(parents=True)
    sub = _early(deep, monkeypatch)
    r = CliRunner().invoke(__import__("launchgen.cli", fromlist=["main"]).main, ["status", "298"],
                           env={"COLUMNS": "80"})
    out = r.output.splitlines()
    for path in (str(sub / "runs" / "298"), str(sub / "early-298.out")):
        assert any(path in line for line in out), (path, r.output)  # never split across lines
    report = out[: next(i for i, line in enumerate(out) if line.startswith("last "))]  # the log tail is verbatim
    for line in report:
        # wrapped at word boundaries: a longer line only where one word (a path) is itself too long
        assert len(line) <= 80 or max(len(w) for w in line.split()) > 60, line
    assert any(len(line) > 80 for line in report), "the paths here are long enough to need wrapping"
    assert not any(ch in unwrapped(r.output) for ch in "┏│…"), r.output  # no squeezed table in a pipe


def test_plan_at_100_columns_is_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from launchgen.input.loader import load_spec
    from launchgen.planning.plan import build_plan
    from launchgen.planning.view import command_line, print_plan

    root = Path(__file__).resolve().parents[1]
    plan = build_plan(load_spec(str(root / "examples" / "multi-node-70b.yaml")))
    buf = io.StringIO()
    print_plan(plan, Console(file=buf, width=100))
    text = buf.getvalue()
    assert "…" not in text
    assert all(len(line) <= 100 or " " not in line.strip() for line in text.splitlines())
    joined = " ".join(text.split())
    for word in command_line(plan.trainer.argv).split():
        assert word in joined, word
    wide = io.StringIO()
    print_plan(plan, Console(file=wide, width=400))
    assert "┏" in wide.getvalue()  # a terminal wide enough still gets the tables


def test_logs_follow_until_the_job_ends(tmp_path: Path) -> None:
    """The real CLI in a subprocess: prints the last lines, then what is appended, and stops at the job's end
    (the job's state is read every follow.STATE_EVERY_S = 5 s)."""
    import subprocess
    import sys
    import time

    d = _local_run(tmp_path, 0, end=False)
    log = d / "logs" / "attempt-0" / "trainer-local.log"
    p = subprocess.Popen([sys.executable, "-c", "from launchgen.cli import main; main()", "logs", "local",
                          "--job-dir", str(d), "--role", "trainer", "-n", "1", "-f"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(2.0)
        assert p.poll() is None, p.communicate()
        with log.open("a") as fh:
            fh.write("step 2\nstep 3 (no newline yet)")
        time.sleep(1.0)
        with (d / "logs" / "attempt-0" / "events.log").open("a") as fh:
            fh.write("2026-12-02T13:00:04Z trainer_exit status=0\n2026-12-02T13:00:04Z exit status=0\n")
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out.splitlines() == ["error: model.name_or_path './nomodel': not found", "step 2",
                                "step 3 (no newline yet)"], out
    assert "the job is over" in err


def test_follow_moves_to_the_next_attempt_and_waits_for_a_missing_log(tmp_path: Path) -> None:
    from launchgen.readback.follow import Target, follow

    first = tmp_path / "a0.log"
    first.write_text("old\n")
    second = tmp_path / "a1.log"
    states = iter([Target(str(first), False), Target(None, False), Target(str(second), False),
                   Target(str(second), True)])
    out: list[str] = []
    notes: list[str] = []

    def tick(_s: float) -> None:
        if first.read_text() == "old\n":
            first.write_text("old\nlast of attempt 0\n")
        elif not second.exists():
            second.write_text("attempt 1 starts\n")

    follow(Target(str(first), False), lambda: next(states), out.append, notes.append, lines=5,
           state_every_s=0, sleep=tick)
    assert out == ["old", "last of attempt 0", "attempt 1 starts"], out
    assert any(str(second) in n for n in notes)
    waiting: list[str] = []
    follow(Target(None, True), lambda: Target(None, True), out.append, waiting.append, lines=5)
    assert waiting == []


def test_logs_of_the_batch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = _early(tmp_path, monkeypatch)
    r = _cli(["logs", "298", "--role", "trainer"])
    assert r.exit_code == 2 and str(sub / "early-298.out") in unwrapped(r.output) and "--role batch" in unwrapped(r.output), r.output
    r = _cli(["logs", "298", "--role", "batch", "-n", "1"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(".venv/bin/activate: No such file or directory"), r.stdout
    r = _cli(["logs", "298", "--role", "batch", "--path-only"])
    assert r.stdout.strip() == str(sub / "early-298.out")


def test_a_replica_log_is_read_as_its_replica_on_its_node(tmp_path: Path) -> None:
    from launchgen.planning.replicas import replica_role
    from launchgen.readback.jobfiles import find_logs
    from launchgen.shared.jobdir import DEFAULT_LAYOUT

    for role in (replica_role(0), replica_role(1), "trainer"):  # the names the script writes (nodes.j2)
        log = tmp_path / DEFAULT_LAYOUT.role_log("server", 0, "node-3").replace("server", role, 1)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("x\n")
    logs = sorted((lg.role, lg.node, lg.replica, lg.name) for lg in find_logs(tmp_path))
    assert logs == [("server", "node-3", 0, "server"), ("server", "node-3", 1, "server-r1"),
                    ("trainer", "node-3", 0, "trainer")]


@pytest.mark.parametrize("verb", ["status", "logs", "report", "plan"])
def test_every_job_side_verb_fails_with_one_prefix_and_status_2(tmp_path: Path, verb: str) -> None:
    """`status`, `logs`, `report` and `plan --from-run` spell a fatal error the same way (`launchgen: error: `, as
    the spec verbs and `report` did while `status` and `logs` printed a bare `error: `), so one grep finds it."""
    missing = str(tmp_path / "no-such-job")
    args = {
        "status": ["status", "--job-dir", missing, "298"],
        "logs": ["logs", "--role", "trainer", "--job-dir", missing, "298"],
        "report": ["report", missing],
        "plan": ["plan", str(Path(__file__).parent.parent / "examples" / "local-cpu-quickstart.yaml"),
                 "--from-run", missing],
    }[verb]
    r = CliRunner().invoke(__import__("launchgen.cli", fromlist=["main"]).main, args)
    assert r.exit_code == 2, r.output
    last = unwrapped(r.stderr).splitlines()[-1]
    assert last.startswith("launchgen: error: ") and missing in last, unwrapped(r.stderr)
    assert "Traceback" not in unwrapped(r.output)


#: what a log can hold that must not reach the terminal (issue 37): a title (OSC 0), a clipboard write (OSC 52),
#: a hyperlink (OSC 8), a DCS string, a screen clear (CSI), C1 CSI, a reset (ESC c)
HOSTILE = ("\x1b]0;pwned\x07 \x1b]52;c;ZXZpbA==\x1b\\ \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x1bPq#0\x1b\\"
           " \x1b[2J \u009b2J \x1bc done")


def test_logs_and_status_strip_osc_and_every_other_control_sequence(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job10")
    _fake_run(monkeypatch, (FIX / "scontrol-job10.txt").read_text())
    for log in d.glob("logs/attempt-*/trainer-*.log"):
        with log.open("a") as f:
            f.write(HOSTILE + "\n")
    from launchgen.cli import main

    # color=True: click passes CSI through as on a terminal, so what is left is launchgen's own doing
    logs = CliRunner().invoke(main, ["logs", "10", "--job-dir", str(d), "--role", "trainer", "-n", "1"], color=True)
    assert logs.exit_code == 0, logs.output
    assert logs.output.strip().endswith("link     done"), repr(logs.output)
    status = CliRunner().invoke(main, ["status", "10", "--job-dir", str(d)], color=True)
    assert "link     done" in unwrapped(status.output), status.output
    for out in (logs.output, status.output):
        assert "\x1b" not in out and "\u009b" not in out and "\\x1b" not in out and "pwned" not in out, repr(out)


def test_a_pending_job_shows_its_expected_start_not_an_exit(tmp_path: Path) -> None:
    """Recorded from the local cluster: `sbatch --begin=now+3600` (JobState=PENDING, Reason=BeginTime, ExitCode=0:0,
    StartTime set). On main: `job PENDING (exit 0)` and no start time."""
    recs = S.parse_scontrol_oneliner((FIX / "scontrol-job-pending.txt").read_text())
    info = S.scheduler_info_from_scontrol(recs[0])
    st = S.analyse(info.job_id, info, "off", [], None)
    assert "exit" not in st.summary, st.summary
    assert f"expected to start {info.start_time.replace('T', ' ')} (BeginTime)" in st.summary, st.summary


def test_status_shows_the_steps_trained_and_the_last_reward_and_loss(tmp_path: Path) -> None:
    d = _synthetic(tmp_path, "2026-12-02T13:00:00Z trainer_start nodes=node2\n"
                   "2026-12-02T13:00:30Z trainer_exit exit=0\n")
    out = d / "trainer"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.25, "loss": 0.5}\n'
                                       '{"step": 2, "reward": 0.375, "loss": null}\n')
    st = S.analyse("5", _info("COMPLETED", 0), "off", [], d)
    assert "trained: step 2 last recorded (2 metrics record(s)); last reward 0.375" in st.notes, st.notes
