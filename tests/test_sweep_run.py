"""A `--bash` sweep run for real: the example's two points, each trained by the bundled GRPO trainer on CPU in its own
job directory, one after the other; `status local` is one row per point; Ctrl-C stops the running point and starts
no other."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tools import env_with_venv, tool, unwrapped

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/sweeps/cpu-quickstart-lr.yaml"


def _workdir(tmp: Path, tiny_model_dir: Path) -> Path:
    (tmp / "examples" / "data").mkdir(parents=True)
    (tmp / "examples" / "sweeps").mkdir()
    (tmp / "examples" / "tiny-model").symlink_to(tiny_model_dir)
    for name in ("data/tiny-math.jsonl", "sweeps/cpu-quickstart-lr.yaml"):
        (tmp / "examples" / name).write_text((ROOT / "examples" / name).read_text())
    return tmp


def _env() -> dict[str, str]:
    env = env_with_venv()  # as in an activated venv: the scripts call `accelerate`
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _launchgen(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("launchgen"), *args], cwd=work, env=_env(), capture_output=True, text=True,
                          timeout=120, check=False)


def _render(work: Path, max_parallel: int = 2) -> Path:
    spec = work / EXAMPLE
    spec.write_text(spec.read_text().replace("max_parallel: 2", f"max_parallel: {max_parallel}"))
    res = _launchgen(work, "render", EXAMPLE, "--bash", "-o", "sweep.sh")
    assert res.returncode == 0, res.stderr
    return work / "sweep.sh"


@pytest.mark.slow
def test_a_bash_sweep_runs_every_point_in_its_own_job_directory(tmp_path: Path, tiny_model_dir: Path) -> None:
    work = _workdir(tmp_path, tiny_model_dir)
    script = _render(work)
    res = subprocess.run(["bash", str(script)], cwd=work, env=_env(), capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    for name in ("lr1e-5", "lr3e-5"):
        job = work / "launchgen-runs" / "local" / name
        assert (job / "trainer" / "launchgen-complete.json").is_file(), res.stderr[-4000:]
        assert (job / "trainer" / "metrics.jsonl").read_text().count('"step"') == 2
        assert f"learning_rate: {'1.0e-05' if name == 'lr1e-5' else '3.0e-05'}" in (job / "trainer.yaml").read_text()
        assert '"point"' in (job / "launchgen-sweep.json").read_text()
    assert "points: lr1e-5: exit 0 lr3e-5: exit 0" in unwrapped(res.stderr)
    # side by side (sweep.max_parallel 2, no GPUs to share): their runs overlap, each on ports of its own slot
    spans, ports = [], []
    for name in ("lr1e-5", "lr3e-5"):
        job = work / "launchgen-runs" / "local" / name
        events = (job / "logs" / "attempt-0" / "events.log").read_text().splitlines()
        spans.append((events[0].split()[0], events[-1].split()[0]))
        ports.append({p["name"]: p["value"] for p in json.loads((job / "launchgen-plan.json").read_text())["ports"]})
    assert spans[1][0] < spans[0][1] and spans[0][0] < spans[1][1], spans
    assert ports[0]["main_process"] != ports[1]["main_process"], ports
    st = _launchgen(work, "status", "local")
    assert st.returncode == 0, st.stderr
    rows = [ln for ln in st.stdout.splitlines() if "point: lr" in ln]
    assert len(rows) == 2 and all("state: COMPLETED" in r and "steps: 2" in r for r in rows), st.stdout
    # the report overlays both points' curves and tabulates their final metrics; opened in headless Chromium
    rep = _launchgen(work, "report", "local")
    assert rep.returncode == 0, rep.stderr
    from chromium import open_in_chromium

    dom = open_in_chromium(work / "launchgen-runs" / "local" / "launchgen-report.html", tmp_path / "chromium")
    assert re.search(r'<div id="comparison-plot"[^>]*class="[^"]*js-plotly-plot', dom), "not drawn by plotly.js"
    assert dom.count('class="main-svg"') >= 2 and dom.count('class="point"') >= 8, "too few markers were drawn"
    assert "<td>lr1e-5</td><td>2</td>" in dom and "<td>lr3e-5</td><td>2</td>" in dom


@pytest.mark.slow
def test_ctrl_c_stops_the_running_point_and_starts_no_other(tmp_path: Path, tiny_model_dir: Path) -> None:
    work = _workdir(tmp_path, tiny_model_dir)
    script = _render(work, max_parallel=1)
    # a terminal's Ctrl-C: SIGINT to the whole foreground process group
    p = subprocess.Popen(["bash", str(script)], cwd=work, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    log = work / "launchgen-runs" / "local" / "lr1e-5" / "logs" / "attempt-0" / "trainer-local.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and log.stat().st_size) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.poll() is None, "the sweep ended before its first trainer started"
    os.killpg(p.pid, signal.SIGINT)
    _out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-4000:]
    assert "stopped: the points not run are not started" in err
    assert not (work / "launchgen-runs" / "local" / "lr3e-5").exists()
    # nothing of the run survives it
    left = subprocess.run([sys.executable, "-c", _SCAN, str(work)], capture_output=True, text=True, check=False)
    assert not left.stdout.strip(), left.stdout


_SCAN = r"""
import os, sys
needle = sys.argv[1].encode()
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if needle in cmd and stat[0] != "Z":
        print(pid, cmd.replace(b"\0", b" ")[:200].decode(errors="replace"))
"""
