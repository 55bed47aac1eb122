"""Run rendered *sbatch* scripts on this host with stand-in `srun`/`scontrol` (tests/fakes/slurm_bin) and the
lifecycle stand-ins for `vllm`/`accelerate`: the multi-node code paths (node lists by position, per-node machine
rank, server on its own node binding that node's address, USR2 forwarded by pid file on every trainer node,
`scontrol requeue` under the restart cap) without a cluster. Node names are loopback addresses (127.0.0.x), so
they resolve with `getent ahostsv4` and each "node" has its own address. The real-SLURM scenarios are in
tests/slurm/.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tools import path_with_venv

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script

FAKES = Path(__file__).parent / "fakes"
NODES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SPEC = """
job: {{name: local-sbatch, output_dir: runs/%j}}
slurm: {{gpus_per_node: 2, max_restarts: 2, signal_grace: 60}}
model: {{name_or_path: fake-model}}
vllm:
  mode: server
  nodes: 1
  tensor_parallel_size: 2
  port: {port}
  group_port: {group}
  health_timeout: 60
train:
  nodes: 2
  main_process_port: {main}
  args:
    data: {{path: unused.jsonl}}
    max_steps: {steps}
"""


def _script(tmp: Path, steps: int) -> Path:
    text = SPEC.format(port=_free_port(), group=_free_port(), main=_free_port(), steps=steps)
    script = tmp / "job.sbatch"
    script.write_text(render_script(build_plan(load_spec_text(text, "local.yaml")), "sbatch"))
    (tmp / "rec").mkdir()
    return script


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = path_with_venv(env["PATH"], FAKES / "slurm_bin", FAKES / "lifecycle_bin")
    for k in list(env):
        if k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES", "VLLM_")):
            del env[k]
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST=",".join(NODES), SLURM_SUBMIT_DIR=str(tmp),
               FAKE_SLURM_GPUS="5,7", FAKE_SLURM_RECORD=str(tmp / "rec"))
    env.update(extra)
    return env


def test_multi_node_happy_path(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=10)
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=_env(tmp_path, FAKE_TRAINER_STEP_S="0.2"),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = tmp_path / "runs" / "4242"
    logs = job / "logs" / "attempt-0"
    server = (logs / "server-127.0.0.4.log").read_text()
    # the server binds its own node's address; its GPUs are mapped through the step's CUDA_VISIBLE_DEVICES
    assert "host=127.0.0.4" in server and "CUDA_VISIBLE_DEVICES=5,7" in server
    for rank, node in enumerate(NODES[:2]):
        log = (logs / f"trainer-{node}.log").read_text()
        assert f"trainer machine rank {rank} on {node}" in log  # evaluated on the node, not in the batch shell
        assert "generation.vllm_server.host='127.0.0.4'" in log
    assert (job / "trainer" / "launchgen-complete.json").is_file()
    assert (job / "job.sbatch").read_text() == script.read_text()  # the cp "$0" fallback
    saved = json.loads((job / "launchgen-plan.json").read_text())
    assert [n["name"] for n in saved["nodes"]] == NODES
    assert saved["logs"]["batch"] == str(tmp_path / "local-sbatch-4242.out")
    assert "server_healthy" in (logs / "events.log").read_text()


def test_server_crash_names_the_server_nodes_log(tmp_path: Path) -> None:
    script = _script(tmp_path, steps=10)
    start = time.monotonic()
    res = subprocess.run(["bash", str(script)], cwd=tmp_path,
                         env=_env(tmp_path, LAUNCHGEN_STANDIN_CRASH_AT_START="1"),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and time.monotonic() - start < 20
    assert str(tmp_path / "runs/4242/logs/attempt-0/server-127.0.0.4.log") in res.stderr


def _usr2_run(tmp: Path, restart_count: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = _script(tmp, steps=200)
    env = _env(tmp, FAKE_TRAINER_STEP_S="0.05", SLURM_RESTART_COUNT=restart_count)
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    steps = tmp / "runs/4242/trainer/steps.jsonl"
    deadline = time.monotonic() + 20
    while not (steps.exists() and steps.read_text().count("\n") >= 4):
        assert time.monotonic() < deadline and proc.poll() is None, "training did not start"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=40)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), tmp / "rec" / "requeue.log"


def test_usr2_reaches_every_trainer_node_then_requeues(tmp_path: Path) -> None:
    res, requeue = _usr2_run(tmp_path, "0")
    # the trainer step's status: 75 (checkpointed, stopped), or 143 when --kill-on-bad-exit stopped the second
    # node's task after the first one exited 75
    assert res.returncode in (75, 143), res.stderr
    signal_log = (tmp_path / "runs/4242/logs/attempt-0/signal.log").read_text()
    for node in NODES[:2]:
        assert f"{node}: sent USR2 to 1 trainer process(es)" in signal_log
    assert any("USR2, checkpoint-" in (tmp_path / f"runs/4242/logs/attempt-0/trainer-{n}.log").read_text()
               for n in NODES[:2])
    assert requeue.read_text() == "4242\n"
    assert "requeueing (restart 1 of 2)" in res.stderr


def test_usr2_at_the_restart_cap_does_not_requeue(tmp_path: Path) -> None:
    res, requeue = _usr2_run(tmp_path, "2")
    assert res.returncode in (75, 143)
    assert not requeue.exists()
    assert "slurm.max_restarts (2) is reached" in res.stderr
