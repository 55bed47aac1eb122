"""`launchgen report` (issue 28): the run's timeline and curves in one self-contained HTML page.

The job directory here is written in the job-directory contract's own formats (`launchgen.shared.jobdir`): two attempts
of a server + two-node trainer job, the first preempted (USR2, exit 75, requeue), the second complete. The page
is opened in headless Chromium (Debian's `chromium`, which `.ci/run` installs; missing, it fails) with every
host unresolvable, and the DOM it builds must hold both plotly figures with their traces: the page draws with
no network. Real runs: `tests/test_render_lifecycle.py` reports on the quickstart's directory, and the SLURM
scenarios' directories are reported on in `tests/slurm/test_scenarios.py`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import assert_figures_rendered, open_in_chromium
from click.testing import CliRunner
from tools import unwrapped

from launchgen.cli import main
from launchgen.readback import runreport
from launchgen.shared import jobdir as J

T0 = 1_796_400_000.0


def _events(lines: list[tuple[float, str, tuple[str, ...], dict[str, object]]]) -> str:
    return "".join(J.format_event(name, *words, ts=T0 + t, **values) + "\n" for t, name, words, values in lines)


def make_job_dir(root: Path) -> Path:
    job = root / "job-4242"
    logs = job / "logs"
    (job / "trainer").mkdir(parents=True)
    (job / J.PLAN_FILE).write_text(json.dumps({"job_name": "grpo-demo", "job_id": "4242",
                                               "layout": {"trainer_output_dir": "trainer"}}))
    E = J.Ev
    attempts = {
        0: [(0, E.START, (), {"job": "4242", "attempt": 0, "restart_count": 0}),
            (1, E.SERVER_START, (), {"nodes": "node3"}), (1, E.TRAINER_START, (), {"nodes": "node1,node2"}),
            (20, E.SERVER_HEALTHY, (), {"after": "19s"}), (60, E.USR2, (), {}),
            (70, E.TRAINER_EXIT, (), {"status": 75}), (71, E.REQUEUE, (), {"restart": 1}),
            (72, E.EXIT, (), {"status": 0})],
        1: [(100, E.START, (), {"job": "4242", "attempt": 1, "restart_count": 1}),
            (101, E.SERVER_START, (), {"nodes": "node3"}), (101, E.TRAINER_START, (), {"nodes": "node1,node2"}),
            (115, E.SERVER_HEALTHY, (), {"after": "14s"}), (150, E.TRAINER_EXIT, (), {"status": 0}),
            (151, E.COMPLETE, (), {}), (152, E.EXIT, (), {"status": 0})],
    }
    for n, lines in attempts.items():
        d = logs / f"attempt-{n}"
        d.mkdir(parents=True)
        (d / "events.log").write_text(_events(lines))
        for role, node in (("server", "node3"), ("trainer", "node1"), ("trainer", "node2")):
            (d / f"{role}-{node}.log").write_text(f"{role} on {node}\n")
    records = []
    for step in range(1, 9):
        wall = T0 + (20 + 5 * step if step <= 6 else 115 + 5 * (step - 6))
        records.append({"step": step, "reward": 0.1 * step, "kl": 0.001 * step, "loss": 0.5 / step,
                        "num_tokens": 1000.0 * step, "time/generate": 2.0, "time/score": 0.1, "time/train": 1.5,
                        "time/sync_weights": 0.4, "async/staleness": float(step % 2),
                        "rewards/accuracy/mean": 0.1 * step, J.METRICS_WALL_KEY: wall})
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "rew'  # a line torn by a kill
    (job / "trainer" / J.METRICS_FILE).write_text(text)
    return job


def test_timeline_has_each_role_per_node_per_attempt_and_what_happened(tmp_path: Path) -> None:
    rep = runreport.build("4242", make_job_dir(tmp_path))
    names = [ln.name for ln in rep.lanes]
    for a in (0, 1):
        assert [n for n in names if n.startswith(f"attempt {a} ")] == [
            f"attempt {a} · job", f"attempt {a} · server · node3", f"attempt {a} · trainer · node1",
            f"attempt {a} · trainer · node2"]
    kinds = {ln.name: [m.kind for m in ln.marks] for ln in rep.lanes}
    assert kinds["attempt 0 · server · node3"].count("healthy") == 1
    assert kinds["attempt 0 · server · node3"].count("sync") == 6  # steps 1-6 ran in attempt 0
    assert kinds["attempt 1 · server · node3"].count("sync") == 2
    assert kinds["attempt 0 · trainer · node1"].count("step") == 6
    assert kinds["attempt 1 · trainer · node2"].count("step") == 2
    assert "signal" in kinds["attempt 0 · job"] and "requeue" in kinds["attempt 0 · job"]
    assert "complete" in kinds["attempt 1 · job"]
    t0 = rep.lane("attempt 0 · trainer · node1")
    assert t0 is not None and t0.first_to_end and "exited 75" in t0.how  # preempted: checkpointed, exit 75
    assert t0.start == T0 + 1 and t0.end == T0 + 70
    assert rep.summary  # the post-mortem's words for the latest attempt
    assert any("1 line(s) that are not a step record" in n for n in rep.notes)
    assert [c.title for c in rep.phases] == ["generate", "score", "train", "sync"]
    tps = rep.curves["tokens/s"][0]
    assert tps.steps == list(range(1, 9)) and tps.values[1] == pytest.approx(1000.0 / 5.0)  # wall time between
    assert tps.values[6] == pytest.approx(1000.0 / 4.0)  # across the requeue: the step's own phases
    assert {c.title for c in rep.curves["reward"]} == {"reward", "accuracy"}


def test_report_page_renders_in_headless_chromium_without_network(tmp_path: Path) -> None:
    job = make_job_dir(tmp_path)
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", str(job), "-o", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert not re.findall(r"<(?:script|link|img)[^>]+(?:src|href)=\"?(?:https?:)?//", html), "fetches at view time"
    dom = open_in_chromium(out, tmp_path / "profile")
    assert_figures_rendered(dom)
    assert "ended first: exited 75" in dom or "ended first: checkpointed and exited 75" in dom


def test_report_default_output_and_errors(tmp_path: Path) -> None:
    job = make_job_dir(tmp_path)
    r = CliRunner().invoke(main, ["report", str(job)])
    assert r.exit_code == 0 and (job / "launchgen-report.html").is_file(), r.output
    r = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such directory" in unwrapped(r.stderr)
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "not a launchgen job directory" in unwrapped(r.stderr)


def test_report_without_plotly_says_how_to_get_it(tmp_path: Path) -> None:
    job = make_job_dir(tmp_path)
    probe = ("import sys; sys.modules['plotly'] = None\n"
             "from launchgen.cli import main\n"
             f"main(['report', {str(job)!r}, '-o', {str(tmp_path / 'x.html')!r}])")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install 'launchgen[report]'" in unwrapped(r.stderr), unwrapped(r.stderr)
    assert "Traceback" not in unwrapped(r.stderr)
