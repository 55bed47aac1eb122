"""The post-mortem's rules on job directories written through the contract's own writer (`format_event`,
`RunRecord`), so what `status` concludes is tied to what the scripts write, not to hand-typed fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchgen.readback.postmortem import analyse
from launchgen.readback.slurmquery import SchedulerInfo
from launchgen.shared import jobdir as J

T0 = 1764680000.0


def _job(tmp_path: Path, events: list[tuple[str, tuple[str, ...], dict[str, object]]],
         roles: tuple[str, ...] = ("server", "trainer"), logs: dict[str, str] | None = None) -> Path:
    d = tmp_path / "job"
    lay = J.DEFAULT_LAYOUT
    attempt = d / lay.log_dir.format(attempt=0)
    attempt.mkdir(parents=True)
    plan = {"nodes": [{"position": 0, "name": "node1", "roles": list(roles)}], "layout": lay.to_json()}
    (d / lay.plan_json).write_text(json.dumps(J.RunRecord(plan=plan, attempt=0, job_id="5").to_json()))
    lines = [J.format_event(name, *words, ts=T0 + i, **values) for i, (name, words, values) in enumerate(events)]
    (d / lay.events_log.format(attempt=0)).write_text("\n".join(lines) + "\n")
    for role, text in (logs or {}).items():
        (d / lay.role_log(role, 0, "node1")).write_text(text)
    return d


def _info(state: str, code: int) -> SchedulerInfo:
    return SchedulerInfo(source="scontrol", job_id="5", state=state, exit_code=code, exit_signal=0)


START = [(J.Ev.START, (), {"job": "5", "attempt": 0}), (J.Ev.SERVER_START, (), {"nodes": "node1"}),
         (J.Ev.TRAINER_START, (), {"nodes": "node1"})]


def test_health_timeout_is_the_servers_end_and_the_trainer_was_stopped(tmp_path: Path) -> None:
    d = _job(tmp_path, [*START, (J.Ev.SERVER_FAILED, (J.Ev.HEALTH_TIMEOUT,), {}),
                        (J.Ev.EXIT, (), {"status": J.EXIT_SERVER_FAILED})],
             logs={"server": "loading...\n", "trainer": "waiting for the server\n"})
    st = analyse("5", _info("FAILED", 1), "off", [], d)
    roles = {r.role: r for r in st.roles}
    assert roles["server"].state == "health_timeout" and st.first_to_end == "server"
    assert roles["trainer"].state == "stopped" and "after the server ended" in roles["trainer"].how
    assert st.failed and st.failed_log and st.failed_log.endswith("server-node1.log")
    assert st.last_health is not None and not st.last_health.ok


@pytest.mark.parametrize(("status", "state", "failed"), [
    (J.EXIT_OK, "exited", False),
    (J.EXIT_PREEMPTED, "preempted", False),  # checkpointed for a re-run: not a failure of a local run
    (J.EXIT_CONFIG, "failed", True),
    (128 + 9, "killed", True),
])
def test_a_local_runs_trainer_status(tmp_path: Path, status: int, state: str, failed: bool) -> None:
    d = _job(tmp_path, [START[0], START[2], (J.Ev.TRAINER_EXIT, (), {"status": status}),
                        (J.Ev.EXIT, (), {"status": status})], roles=("trainer",))
    st = analyse(J.LOCAL_JOB_ID, None, "not used", [], d)
    (trainer,) = st.roles
    assert (trainer.state, trainer.exit_code, st.failed, st.over) == (state, status, failed, True)
    if status > 128:
        assert "SIGKILL" in trainer.how


def test_requeue_and_usr2_notes(tmp_path: Path) -> None:
    d = _job(tmp_path, [*START, (J.Ev.SERVER_HEALTHY, (), {"after": "12s"}), (J.Ev.USR2, (), {}),
                        (J.Ev.TRAINER_EXIT, (), {"status": J.EXIT_PREEMPTED}), (J.Ev.REQUEUE, (), {"restart": 1}),
                        (J.Ev.EXIT, (), {"status": J.EXIT_PREEMPTED})])
    st = analyse("5", _info("PENDING", 0), "off", [], d)
    assert any(n.startswith("requeue (attempt 0)") for n in st.notes), st.notes
    assert any("received SIGUSR2" in n for n in st.notes), st.notes
    assert st.last_health is not None and st.last_health.ok and st.last_health.message == "healthy after 12s"
    assert {r.role: r.state for r in st.roles} == {"trainer": "preempted", "server": "stopped"}


def test_scancel_stops_both_roles(tmp_path: Path) -> None:
    d = _job(tmp_path, [*START, (J.Ev.SIGNAL, ("TERM",), {}), (J.Ev.EXIT, (), {"status": 143})])
    st = analyse("5", _info("CANCELLED", 0), "off", [], d)
    assert [(r.state, r.signal) for r in st.roles] == [("stopped", "TERM")] * 2
    assert all("(scancel)" in r.how for r in st.roles)


def test_each_signal_is_described_for_what_the_script_did(tmp_path: Path) -> None:
    """A plain scancel is no checkpoint + requeue (3388ad8 said so for every signal); HUP and a SIGKILL of a
    --bash script (recorded by its watcher) are failures with their own words."""
    d = _job(tmp_path, [*START, (J.Ev.SIGNAL, ("TERM",), {}), (J.Ev.EXIT, (), {"status": 143})])
    notes = analyse("5", _info("CANCELLED", 0), "off", [], d).notes
    assert any("SIGTERM" in n and "no requeue" in n for n in notes) and not any("checkpoint + requeue" in n
                                                                                for n in notes), notes
    for sig, words in (("HUP", "hang-up"), ("KILL", "watcher")):
        d = _job(tmp_path / sig, [*START, (J.Ev.SIGNAL, (sig,), {}), (J.Ev.EXIT, (), {"status": 128 + 9})])
        st = analyse(J.LOCAL_JOB_ID, None, "not used", [], d)
        assert st.failed and any(f"SIG{sig}" in n and words in n for n in st.notes), st.notes


def test_a_preempted_trainer_does_not_promise_a_requeue(tmp_path: Path) -> None:
    d = _job(tmp_path, [*START, (J.Ev.TRAINER_EXIT, (), {"status": J.EXIT_PREEMPTED}),
                        (J.Ev.EXIT, (), {"status": J.EXIT_PREEMPTED})])
    st = analyse("5", _info("COMPLETED", 0), "off", [], d)
    trainer = next(r for r in st.roles if r.role == "trainer")
    assert "a requeued attempt resumes" not in trainer.how and "resumes from that checkpoint" in trainer.how


def test_a_failed_preflight_is_named_with_its_codes(tmp_path: Path) -> None:
    d = _job(tmp_path, [START[0], (J.Ev.PREFLIGHT, (), {"status": "failed", "codes": "PF101,PF104", "seconds": 2}),
                        (J.Ev.EXIT, (), {"status": 1})])
    st = analyse("5", _info("FAILED", 1), "off", [], d)
    assert any("preflight failed before any model loaded: PF101" in n and "PF104" in n for n in st.notes), st.notes


@pytest.mark.parametrize(("codes", "says"), [("timeout", "did not finish within 90 s"),
                                             ("none", "failed before any probe reported")])
def test_a_preflight_that_reported_no_code_says_why(tmp_path: Path, codes: str, says: str) -> None:
    d = _job(tmp_path, [START[0], (J.Ev.PREFLIGHT, (), {"status": "failed", "codes": codes, "seconds": 90}),
                        (J.Ev.EXIT, (), {"status": 1})])
    st = analyse("5", _info("FAILED", 1), "off", [], d)
    note = next(n for n in st.notes if n.startswith("preflight failed"))
    assert says in note and "?" not in note.split("(logs/")[0], note
