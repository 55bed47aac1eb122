"""Run rendered --bash scripts on this machine with stand-in `vllm` and `accelerate` first on PATH.

The stand-ins (tests/fakes/lifecycle_bin) start in ~0.1 s, so each scenario costs a few seconds: what is tested
is the script's lifecycle (start, health, teardown, exit status, logs, USR2), not vLLM or training.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tools import env_with_venv, path_with_venv

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import MAX_PORT_OFFSET, build_plan
from launchgen.script.render import render_script
from launchgen.shared import ports

FAKES = Path(__file__).parent / "fakes" / "lifecycle_bin"


def _free_port() -> int:
    """A free port low enough that the job-id offset (up to MAX_PORT_OFFSET) keeps it valid: the kernel's own
    pick comes from the ephemeral range, where base + offset can pass 65535."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 65535 - MAX_PORT_OFFSET - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-55000")


def _spec(health_timeout: int = 30, max_steps: int = 5, extra_train: str = "") -> str:
    return f"""
job:
  name: life
  output_dir: runs/%j
slurm:
  gpus_per_node: 4
  max_restarts: 2
model:
  name_or_path: fake-model
vllm:
  mode: server
  gpus: [0, 1]
  tensor_parallel_size: 2
  port: {_free_port()}
  group_port: {_free_port()}
  health_timeout: {health_timeout}
train:
  gpus: [2, 3]
  main_process_port: {_free_port()}
{extra_train}
  args:
    data: {{path: unused.jsonl}}
    max_steps: {max_steps}
"""


def _write_script(tmp: Path, spec_text: str) -> Path:
    plan = build_plan(load_spec_text(spec_text, "life.yaml"))
    script = tmp / "job.sh"
    script.write_text(render_script(plan, "bash"))
    return script


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = path_with_venv(env["PATH"], FAKES)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("VLLM_SERVER_DEV_MODE", None)
    env.update(extra)
    return env


def _run(tmp: Path, script: Path, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], cwd=tmp, env=_env(**extra), capture_output=True, text=True,
                          timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def _server_pid(tmp: Path) -> int:
    return int((tmp / "server.pid").read_text())


def test_happy_path_exit_0_server_stopped_logs_and_records(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=10))
    # 10 steps x 0.25 s: long enough for the supervisor (1 s polls) to see the server healthy
    res = _run(tmp_path, script, FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"),
               LAUNCHGEN_STANDIN_STARTUP_DELAY="0.5", FAKE_TRAINER_STEP_S="0.25")
    assert res.returncode == 0, res.stderr
    job = tmp_path / "runs" / "local"
    assert (job / "trainer" / "launchgen-complete.json").is_file()
    assert not _alive(_server_pid(tmp_path)), "the server must be stopped when training ends"
    logs = job / "logs" / "attempt-0"
    server_log = (logs / "server-local.log").read_text()
    trainer_log = (logs / "trainer-local.log").read_text()
    # GPU positions from the plan, dev mode only on the server
    assert "CUDA_VISIBLE_DEVICES=0,1" in server_log
    assert "CUDA_VISIBLE_DEVICES=2,3" in trainer_log
    assert "VLLM_SERVER_DEV_MODE=None" in trainer_log
    # the job directory records what ran
    for name in ("spec.yaml", "trainer.yaml", "accelerate.yaml", "job.sh", "launchgen-plan.json",
                 "steps/server.sh", "steps/trainer.sh"):
        assert (job / name).is_file(), name
    assert (job / "job.sh").read_text() == script.read_text()
    plan = json.loads((job / "launchgen-plan.json").read_text())
    assert plan["attempt"] == 0 and plan["nodes"][0]["name"] == "local"
    assert plan["logs"]["server"]["local"] == str(logs / "server-local.log")
    events = (logs / "events.log").read_text()
    assert "server_healthy" in events and "trainer_exit status=0" in events and "complete" in events


def test_setup_lines_run_in_the_script_and_every_step_even_reading_unset_variables(tmp_path: Path) -> None:
    text = _spec(max_steps=1).replace("  max_restarts: 2", "  max_restarts: 2\n  setup:\n"
                                      "    - 'echo \"setup-ran${NOT_SET_ANYWHERE}\" >&2'")
    script = _write_script(tmp_path, text)
    res = _run(tmp_path, script)
    assert res.returncode == 0, res.stderr
    assert "setup-ran" in res.stderr
    logs = tmp_path / "runs/local/logs/attempt-0"
    assert "setup-ran" in (logs / "server-local.log").read_text()
    assert "setup-ran" in (logs / "trainer-local.log").read_text()


def test_gpus_map_through_inherited_cuda_visible_devices(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=1))
    res = _run(tmp_path, script, CUDA_VISIBLE_DEVICES="GPU-a,GPU-b,GPU-c,GPU-d")
    assert res.returncode == 0, res.stderr
    logs = tmp_path / "runs" / "local" / "logs" / "attempt-0"
    assert "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b" in (logs / "server-local.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=GPU-c,GPU-d" in (logs / "trainer-local.log").read_text()


def test_server_crash_at_start_fails_fast_naming_the_log(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(health_timeout=120))
    start = time.monotonic()
    res = _run(tmp_path, script, LAUNCHGEN_STANDIN_CRASH_AT_START="1")
    elapsed = time.monotonic() - start
    assert res.returncode == 1
    assert elapsed < 20, f"took {elapsed:.1f} s: must fail on the server's death, not at the health timeout"
    log = tmp_path / "runs" / "local" / "logs" / "attempt-0" / "server-local.log"
    errors = [line for line in res.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "before it became healthy" in errors[0] and str(log) in errors[0]
    assert "cannot load model" in log.read_text()
    assert not (tmp_path / "runs" / "local" / "trainer" / "launchgen-complete.json").exists()


def test_health_timeout_stops_everything(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(health_timeout=3))
    start = time.monotonic()
    res = _run(tmp_path, script, LAUNCHGEN_STANDIN_NEVER_HEALTHY="1",
               FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    elapsed = time.monotonic() - start
    assert res.returncode == 1
    assert 3 <= elapsed < 20
    assert "did not become healthy within 3 s" in res.stderr
    assert not _alive(_server_pid(tmp_path))


def test_trainer_crash_tears_down_server_and_passes_exit_code(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec())
    res = _run(tmp_path, script, FAKE_TRAINER_CRASH_AT_STEP="2", FAKE_TRAINER_EXIT_CODE="7",
               FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid"))
    assert res.returncode == 7, res.stderr
    assert not _alive(_server_pid(tmp_path))
    assert "trainer_exit status=7" in (tmp_path / "runs/local/logs/attempt-0/events.log").read_text()
    # the job's last line says where the trainer's error is
    last = res.stderr.strip().splitlines()[-1]
    assert "ERROR" in last and str(tmp_path / "runs/local/logs/attempt-0/trainer-local.log") in last, res.stderr


def test_server_death_mid_training_stops_trainer_nonzero(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=1000))
    start = time.monotonic()
    res = _run(tmp_path, script, LAUNCHGEN_STANDIN_DIE_AFTER_S="4", FAKE_TRAINER_STEP_S="0.05")
    assert res.returncode != 0
    assert time.monotonic() - start < 20
    assert "during training" in res.stderr
    assert not (tmp_path / "runs/local/trainer/launchgen-complete.json").exists()


def test_usr2_checkpoints_through_pid_files_and_rerun_resumes(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=40))
    env = _env(FAKE_TRAINER_STEP_S="0.1")
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    steps = tmp_path / "runs/local/trainer/steps.jsonl"
    deadline = time.monotonic() + 20
    while not (steps.exists() and steps.read_text().count("\n") >= 3):
        assert time.monotonic() < deadline and proc.poll() is None, "training did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR2)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err  # the trainer's status: checkpointed and stopped
    assert "run this script again to resume" in err
    ckpts = list((tmp_path / "runs/local/trainer").glob("checkpoint-*"))
    assert len(ckpts) == 1
    stopped_at = int(ckpts[0].name.split("-")[1])
    # the second run is attempt 1 and resumes after the checkpoint
    res = _run(tmp_path, script, FAKE_TRAINER_STEP_S="0.01")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs/local/logs/attempt-1/trainer-local.log").is_file()
    done = [json.loads(line)["step"] for line in steps.read_text().splitlines()]
    assert done == list(range(1, stopped_at + 1)) + list(range(stopped_at + 1, 41))


def test_usr2_before_the_trainer_has_a_pid_file_stops_it_after_half_the_grace(tmp_path: Path) -> None:
    text = _spec().replace("max_restarts: 2", "max_restarts: 2\n  signal_grace: 4")
    script = _write_script(tmp_path, text)
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=_env(FAKE_TRAINER_LOAD_S="60"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "runs/local/logs/attempt-0/trainer-local.log"
    deadline = time.monotonic() + 20
    while not (log.exists() and "fake trainer" not in log.read_text() and "machine rank" in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    start = time.monotonic()
    proc.send_signal(signal.SIGUSR2)
    _out, err = proc.communicate(timeout=30)
    assert 2 <= time.monotonic() - start < 15
    assert "still runs 2 s after USR2" in err
    assert proc.returncode == 143
    assert "sent USR2 to 0 trainer process(es)" in (tmp_path / "runs/local/logs/attempt-0/signal.log").read_text()


def test_sigterm_to_the_script_stops_both_sides(tmp_path: Path) -> None:
    script = _write_script(tmp_path, _spec(max_steps=100000))
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=_env(FAKE_VLLM_PIDFILE=str(tmp_path / "server.pid")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = tmp_path / "runs/local/trainer/steps.jsonl"
    deadline = time.monotonic() + 20
    while not steps.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    pid_file = next((tmp_path / "runs/local/run/attempt-0/pids/local").glob("rank*.pid"))
    trainer_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    time.sleep(0.2)
    assert not _alive(trainer_pid) and not _alive(_server_pid(tmp_path))


@pytest.mark.parametrize("offset", ["none", "job_id"])
def test_port_offset_applies_under_bash(tmp_path: Path, offset: str) -> None:
    text = _spec(max_steps=1).replace("output_dir: runs/%j", f"output_dir: runs/%j\n  port_offset: {offset}")
    plan = build_plan(load_spec_text(text, "life.yaml"))
    assert plan.port_offset is (offset == "job_id")
    script = tmp_path / "job.sh"
    script.write_text(render_script(plan, "bash"))
    res = _run(tmp_path, script)
    assert res.returncode == 0, res.stderr
    saved = json.loads((tmp_path / "runs/local/launchgen-plan.json").read_text())
    http = next(p for p in saved["ports"] if p["name"] == "server_http")
    assert http["value"] == ports.shift(http["base"], saved["port_offset_value"])
    if offset == "none":
        assert saved["port_offset_value"] == 0
    else:  # the script's PID stands in for the job id under --bash
        assert saved["port_offset_value"] % 10 == 0 and 0 <= saved["port_offset_value"] <= MAX_PORT_OFFSET


@pytest.mark.slow
def test_local_cpu_quickstart_runs_the_real_trainer(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The README's quickstart, end to end: the example's --bash script runs the bundled GRPO trainer on CPU."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "examples" / "data").mkdir(parents=True)
    (tmp_path / "examples" / "tiny-model").symlink_to(tiny_model_dir)
    data = root / "examples" / "data" / "tiny-math.jsonl"
    (tmp_path / "examples" / "data" / "tiny-math.jsonl").write_text(data.read_text())
    text = (root / "examples" / "local-cpu-quickstart.yaml").read_text()
    script = tmp_path / "quickstart.sh"
    script.write_text(render_script(build_plan(load_spec_text(text, "examples/local-cpu-quickstart.yaml")),
                                    "bash"))
    env = env_with_venv()  # as in an activated venv: the script calls `accelerate`
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    job = tmp_path / "launchgen-runs" / "local"
    log = job / "logs" / "attempt-0" / "trainer-local.log"
    assert res.returncode == 0, res.stderr + (log.read_text()[-3000:] if log.exists() else "")
    assert (job / "trainer" / "launchgen-complete.json").is_file()
    # `bash job.sh` shows each step's line as it trains, on a line of its own, before the job's last line
    lines = res.stderr.splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("[launchgen] step ")]
    assert [lines[i].split()[2] for i in steps] == ["1/4", "2/4", "3/4", "4/4"], res.stderr[-3000:]
    assert steps[-1] < next(i for i, line in enumerate(lines) if "training complete" in line)
    # nothing of the follower outlives the script (tail polls for the trainer's end every 0.2 s)
    for _ in range(10):
        left = subprocess.run(["pgrep", "-f", f"tail -n \\+1 -F .*{tmp_path}"], capture_output=True, text=True)
        if left.returncode == 1:
            break
        time.sleep(0.5)
    assert left.returncode == 1, left.stdout
    assert (job / "trainer" / "metrics.jsonl").read_text().strip()
    # its picture (issue 28): `launchgen report` on the job directory, opened in headless Chromium
    from chromium import assert_figures_rendered, open_in_chromium

    rep = subprocess.run([sys.executable, "-m", "launchgen", "report", "local"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    dom = open_in_chromium(job / "launchgen-report.html", tmp_path / "chromium-profile")
    assert_figures_rendered(dom)
    assert dom.count("training step") >= 1 and "ended first: exited 0" in dom


@pytest.mark.slow
def test_quickstart_prints_a_progress_line_per_step_while_it_trains(tmp_path: Path, tiny_model_dir: Path) -> None:
    """examples/quickstart.sh itself: the trainer's plain line per logging step reaches the terminal, once each."""
    root = Path(__file__).resolve().parent.parent
    ex = tmp_path / "examples"
    (ex / "data").mkdir(parents=True)
    (ex / "tiny-model").symlink_to(tiny_model_dir)
    for name in ("quickstart.sh", "local-cpu-quickstart.yaml", "data/tiny-math.jsonl"):
        (ex / name).write_text((root / "examples" / name).read_text())
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["bash", str(ex / "quickstart.sh")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    # the job script's own follower shows them (on stderr), each on a line of its own, once each
    steps = [line.split()[2] for line in res.stderr.splitlines() if line.startswith("[launchgen] step ")]
    assert steps == ["1/4", "2/4", "3/4", "4/4"], res.stderr[-3000:]
    assert "[launchgen] step" not in res.stdout
    assert "metrics: launchgen-runs/local/trainer/metrics.jsonl" in res.stdout

    # again, into the finished job directory: it says nothing was trained, never shows the old metrics as new
    again = subprocess.run(["bash", str(ex / "quickstart.sh")], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training was already complete before this run" in again.stderr, again.stderr[-3000:]
    assert "launchgen: training complete" not in again.stderr
    assert "no step was trained in this run" in again.stdout and "metrics: " not in again.stdout, again.stdout

    # a changed trainer config into it: the trainer refuses (exit 2); the script says so and why, never "complete"
    spec = ex / "local-cpu-quickstart.yaml"
    spec.write_text(spec.read_text().replace("max_completion_length: 16", "max_completion_length: 12"))
    refused = subprocess.run(["bash", str(ex / "quickstart.sh")], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "the trainer refused this run" in refused.stderr and "the trainer says:" in refused.stderr, \
        refused.stderr[-3000:]
    assert "max_completion_length" in refused.stderr and "training complete" not in refused.stderr, \
        refused.stderr[-3000:]
    assert "max_completion_length: 12" not in (tmp_path / "launchgen-runs/local/spec.yaml").read_text()


def test_output_dir_expands_home_variables_and_job_codes_on_the_node(tmp_path: Path) -> None:
    """`~`, `$VAR`, `%x`, `%j` in job.output_dir are expanded at run time (launchgen.planning.outdir), never taken literally."""
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    text = _spec(max_steps=1).replace("output_dir: runs/%j", "output_dir: '$SCRATCH/runs/%x-%j'")
    script = _write_script(tmp_path, text)
    res = _run(tmp_path, script, HOME=str(home), SCRATCH=str(scratch))
    assert res.returncode == 0, res.stderr
    assert (scratch / "runs" / "life-local" / "trainer" / "launchgen-complete.json").is_file()
    assert not list(tmp_path.glob("$*")), "a literal $SCRATCH folder was made"
    text = _spec(max_steps=1).replace("output_dir: runs/%j", "output_dir: '~/runs/%j'")
    script = _write_script(tmp_path, text)
    res = _run(tmp_path, script, HOME=str(home))
    assert res.returncode == 0, res.stderr
    assert (home / "runs" / "local" / "trainer" / "launchgen-complete.json").is_file()
    assert not (tmp_path / "~").exists()


def test_output_dir_with_an_unset_variable_stops_the_job_naming_it(tmp_path: Path) -> None:
    text = _spec(max_steps=1).replace("output_dir: runs/%j", "output_dir: '${SCRATCH}/runs/%j'")
    script = _write_script(tmp_path, text)
    env_without = {k: v for k, v in os.environ.items() if k != "SCRATCH"}
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**env_without, "PATH": _env()["PATH"]},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "job.output_dir" in res.stderr and "$SCRATCH" in res.stderr and "not set" in res.stderr, res.stderr
    assert not list(tmp_path.glob("$*")) and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bad", ["runs/$(whoami)", "runs/${SCRATCH:-/tmp}", "runs/`id`", "~bob/runs", "runs/%a",
                                 "runs/100%"])
def test_output_dir_syntax_the_script_does_not_expand_is_refused(bad: str) -> None:
    from launchgen.checks import run_checks
    from launchgen.planning.plan import PlanInvariantError

    text = _spec(max_steps=1).replace("output_dir: runs/%j", f"output_dir: {json.dumps(bad)}")
    plan, issues = run_checks(load_spec_text(text, "life.yaml"), env={})
    [issue] = [i for i in issues if i.severity == "error"]
    assert plan is None and (issue.code, issue.path, issue.line) == ("LG911", "job.output_dir", 4), issue
    with pytest.raises(PlanInvariantError):  # and no script is ever built from it
        build_plan(load_spec_text(text, "life.yaml"))


def test_a_crashed_rank_outweighs_another_ranks_clean_stop(tmp_path: Path) -> None:
    """The trainer step exits with the trainers' own statuses (their exit files): rank 0 stopped cleanly (75),
    rank 1 crashed (3), accelerate launch said 1: the job says 3, and its last line names the trainer's log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "accelerate").write_text(
        "#!/bin/bash\nd=$LAUNCHGEN_PID_DIR/local\nmkdir -p \"$d\"\n"
        "echo 75 >\"$d/rank0.exit\"\necho 3 >\"$d/rank1.exit\"\nexit 1\n")
    (bin_dir / "accelerate").chmod(0o755)
    script = _write_script(tmp_path, _spec(max_steps=1))
    env = _env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    trainer_log = tmp_path / "runs/local/logs/attempt-0/trainer-local.log"
    assert "the trainer (rank1.exit) exited 3" in trainer_log.read_text()
    assert str(trainer_log) in res.stderr.strip().splitlines()[-1]
