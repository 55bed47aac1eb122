"""A rendered --bash script whose server and trainer run in a charliecloud image (real `ch-run`), on this machine.

The image is built by tests/chimage.py (a bare root; /usr and the interpreter come from the host through the
spec's mounts). The server is the `vllm serve` stand-in, the trainer the real bundled GRPO trainer on CPU, weights
over gloo. What it shows: each role's process runs inside the image (its root has the image's marker file),
under the step's own pid (ch-run execs in place: the trainer's pid files name the process inside), with the job
directory, the submit directory and the HF cache mounted; the run completes; and a TERM to the script mid-training
reaches the processes inside, which stop and leave nothing behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from chimage import build_image, ch_run, host_mounts
from test_render_lifecycle import _free_port
from tools import env_with_venv
from vllm_standin.harness import BIN_DIR, REPO_ROOT

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script

MARKER = "etc/launchgen-test-image"


def _spec(tmp: Path, model: Path, image: Path, mounts: list[str], max_steps: int) -> str:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                               for a in range(1, 6) for b in range(1, 4)))
    hooks = {"LAUNCHGEN_STANDIN_DEVICE": "cpu", "LAUNCHGEN_STANDIN_QUIET": "0", "LAUNCHGEN_WEIGHT_TRANSPORT": "gloo"}
    return yaml.safe_dump({
        "job": {"name": "ch", "output_dir": str(tmp / "runs" / "%j")},
        "slurm": {"gpus_per_node": 1, "max_restarts": 0, "signal_grace": 0,
                  "setup": [f"export PATH={BIN_DIR}:$PATH",
                            f"export PYTHONPATH={REPO_ROOT}:{REPO_ROOT / 'tests'}:{REPO_ROOT / 'tests' / 'fakes'}"
                            "${PYTHONPATH:+:$PYTHONPATH}",
                            f"export HF_HOME={tmp / 'hf'}",
                            *(f"export {k}={v}" for k, v in hooks.items())],
                  "env": {"all": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
                          "trainer": {"SLURMTEST_REWARD_SLEEP": "1.0"}}},
        "model": {"name_or_path": str(model)},
        "vllm": {"mode": "server", "nodes": 0, "gpus": [0], "tensor_parallel_size": 1, "port": _free_port(),
                 "group_port": _free_port(), "health_timeout": 180, "max_model_len": 256},
        "train": {"device": "cpu", "precision": "fp32", "trainer": "grpo", "main_process_port": _free_port(),
                  "args": {"data": {"path": str(prompts)}, "rewards": [{"name": "length"}], "num_generations": 2,
                           "per_device_train_batch_size": 4, "max_steps": max_steps, "learning_rate": 1e-4,
                           "generation": {"max_completion_length": 8}, "save_steps": 0, "save_final_model": False,
                           "report_to": ["jsonl"], "logging_steps": 1}},
        "container": {"runtime": "charliecloud", "image": str(image), "mounts": mounts},
    })


def _inside(pid: int) -> bool:
    """The process's root is the image (only the image has the marker)."""
    try:
        return Path(f"/proc/{pid}/root/{MARKER}").exists()
    except OSError:
        return False


def _pids_with(needle: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _start(tmp_path: Path, model: Path, max_steps: int) -> tuple[subprocess.Popen[str], Path, dict[str, object]]:
    ch_run()
    mounts = host_mounts(sys.executable)
    image = build_image(tmp_path / "image", mounts)
    assert not (Path("/") / MARKER).exists()
    spec = yaml.safe_load(_spec(tmp_path, model, image, mounts, max_steps))
    plan = build_plan(load_spec_text(yaml.safe_dump(spec), "ch.yaml"))
    assert plan.trainer.argv[0] == "ch-run" and plan.server is not None
    assert plan.server.commands[0].argv[0] == "ch-run"
    script = tmp_path / "job.sh"
    script.write_text(render_script(plan, "bash"))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("USER", None)  # ch-run refuses to start without USER: the script sets it
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, tmp_path / "runs" / "local", spec


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.communicate(timeout=90)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.communicate()[1]


def test_server_and_trainer_run_inside_the_image_and_the_run_completes(tmp_path: Path, tiny_model_dir: Path) -> None:
    max_steps = 3
    proc, job, spec = _start(tmp_path, tiny_model_dir, max_steps)
    port = str(spec["vllm"]["port"])  # type: ignore[index]
    seen: dict[str, bool] = {}
    try:
        deadline = time.monotonic() + 300
        pid_dir = job / "run" / "attempt-0" / "pids" / "local"
        while len(seen) < 2 and proc.poll() is None and time.monotonic() < deadline:
            for pid in _pids_with(f"--port {port}"):
                argv = Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
                # not ch-run itself in the instant before it execs the server in the image
                if "serve" in argv and not argv[0].endswith("ch-run"):
                    seen.setdefault("server", _inside(pid))
            for f in pid_dir.glob("rank*.pid") if pid_dir.is_dir() else ():
                text = f.read_text().strip()
                if text.isdigit():
                    seen.setdefault("trainer", _inside(int(text)))
            time.sleep(0.2)
        _, err = proc.communicate(timeout=300)
    finally:
        err_tail = _stop(proc) if proc.poll() is None else ""
    logs = job / "logs" / "attempt-0"
    trainer_log = (logs / "trainer-local.log").read_text()
    assert proc.returncode == 0, err[-3000:] + err_tail + trainer_log[-3000:]
    # the server process (pid of its step: ch-run exec'd in place) and the trainer rank its pid file names
    assert seen == {"server": True, "trainer": True}, seen
    steps = [json.loads(x)["step"] for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, max_steps + 1))
    server_log = (logs / "server-local.log").read_text()
    assert server_log.count("POST /update_weights") >= max_steps + 1, server_log[-2000:]
    assert (tmp_path / "hf").is_dir()  # the HF cache the script mounted


def test_term_reaches_the_processes_inside_and_nothing_survives(tmp_path: Path, tiny_model_dir: Path) -> None:
    proc, job, spec = _start(tmp_path, tiny_model_dir, max_steps=10000)
    port = str(spec["vllm"]["port"])  # type: ignore[index]
    metrics = job / "trainer" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "no training step"
            time.sleep(0.3)
        inside = [p for p in _pids_with(str(job)) + _pids_with(f"--port {port}") if _inside(p)]
        assert inside, "no process of the job runs inside the image"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    # the trainer checkpointed on the signal the supervisor passed through its pid file (inside the image)
    trainer_log = (job / "logs" / "attempt-0" / "trainer-local.log").read_text()
    assert "exiting 75" in trainer_log, trainer_log[-3000:]
    time.sleep(1)
    left = [p for p in inside if Path(f"/proc/{p}").exists()]
    assert left == [], f"processes inside the image survived the job: {left}"
    assert not _pids_with(str(job)) and not _pids_with(f"--port {port}"), err[-2000:]
