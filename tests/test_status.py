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

from launchgen import status as S

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


def test_jsonl_events_tolerate_torn_lines_and_aliases() -> None:
    text = ('{"ts": 10, "event": "step_exit", "role": "trainer", "rc": "3"}\n'
            '{"time": "2026-12-02T13:00:00+00:00", "type": "signal", "signal": 12}\n{"event": "step_')
    evs = S.parse_events(text)
    assert [(e.event, e.exit_code) for e in evs] == [("step_exit", 3), ("signal", None)]
    assert evs[1].signal == "USR2" and evs[1].ts is not None


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
    for text in ("trainer", "preempted", "attempt: 1", "accounting (sacct): off", "trainer-node1.log"):
        assert text in r.output, r.output


def test_cli_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _jobdir(tmp_path, "job10")
    _fake_run(monkeypatch, (FIX / "scontrol-job10.txt").read_text())
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "server", "--attempt", "0", "--path-only"])
    assert r.exit_code == 0 and r.output.strip().endswith("attempt-0/server-node1.log"), r.output
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--node", "0", "-n", "1"])
    assert r.exit_code == 0 and r.output.strip(), r.output
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--attempt", "7"])
    assert r.exit_code == 2 and "attempts 0, 1" in r.output
    r = _cli(["logs", "10", "--job-dir", str(d), "--role", "trainer", "--node", "node9"])
    assert r.exit_code == 2 and "node1" in r.output


def test_status_never_imports_torch() -> None:
    import subprocess
    import sys

    code = "import sys, launchgen.status, launchgen.cli.status, launchgen.cli.logs; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
