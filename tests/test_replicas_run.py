"""A rendered --bash script with two server replicas, run on this machine: two `vllm serve` stand-ins
(tests/vllm_standin/bin/vllm) beside the real bundled GRPO trainer on CPU, weights over gloo.

One run checks the whole chain: each replica's step starts on its own GPUs and port, the supervisor waits for
both to be healthy, the trainer reads every replica's address from the script and spreads its prompt groups over
both, every weight update reaches every replica that is up; and the supervision of a replica that hangs
(`vllm.restart_replicas`): stopped after failed /health probes, its step started again by the bash launcher (the
SLURM test covers a killed step under srun), set aside by the trainer and taken back with the current weights.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml
from test_render_lifecycle import _free_port
from tools import env_with_venv
from vllm_standin.harness import BIN_DIR, REPO_ROOT

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script


def _spec(tmp: Path, model: Path, max_steps: int, restart: bool = False, reward: str = "length") -> str:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                               for a in range(1, 6) for b in range(1, 4)))
    port = _free_port()
    hooks = {"LAUNCHGEN_STANDIN_DEVICE": "cpu", "LAUNCHGEN_STANDIN_QUIET": "0", "LAUNCHGEN_WEIGHT_TRANSPORT": "gloo"}
    return yaml.safe_dump({
        "job": {"name": "two", "output_dir": str(tmp / "runs" / "%j")},
        "slurm": {"gpus_per_node": 2, "max_restarts": 0, "signal_grace": 0,
                  "setup": [f"export PATH={BIN_DIR}:$PATH",
                            f"export PYTHONPATH={REPO_ROOT}:{REPO_ROOT / 'tests'}:{REPO_ROOT / 'tests' / 'fakes'}"
                            "${PYTHONPATH:+:$PYTHONPATH}",
                            *(f"export {k}={v}" for k, v in hooks.items())],
                  "env": {"all": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
                          "trainer": {"SLURMTEST_REWARD_SLEEP": "1.0"}}},
        "model": {"name_or_path": str(model)},
        "vllm": {"mode": "server", "nodes": 0, "gpus": [0, 1], "tensor_parallel_size": 1, "replicas": 2,
                 "restart_replicas": restart,
                 "port": port, "group_port": _free_port(), "health_timeout": 180, "max_model_len": 256},
        "train": {"device": "cpu", "precision": "fp32", "trainer": "grpo", "main_process_port": _free_port(),
                  "args": {"data": {"path": str(prompts)}, "rewards": [{"name": reward}], "num_generations": 2,
                           "per_device_train_batch_size": 4, "max_steps": max_steps, "learning_rate": 1e-4,
                           "generation": {"max_completion_length": 8}, "save_steps": 0, "save_final_model": False,
                           "report_to": ["jsonl"], "logging_steps": 1}},
    })


def test_a_replica_that_stops_answering_health_is_restarted_and_the_run_completes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Replica 1 stays alive but stops answering /health after its first completion: the supervisor stops it
    after `unhealthy_probes` failed probes in a row and starts its step again (the same restart path as a replica
    that died), the trainer sets it aside, takes it back with the current weights and every step runs. The run is
    held at one step while this happens (not paced over many steps), so it needs few."""
    hold = tmp_path / "hold"
    max_steps = 6
    text = _spec(tmp_path, tiny_model_dir, max_steps=max_steps, restart=True, reward="slurm_rewards:hold")
    spec = yaml.safe_load(text)
    port1 = spec["vllm"]["port"] + 1
    spec["slurm"]["setup"] += [f"export LAUNCHGEN_STANDIN_FAULT_PORT={port1}",
                               "export LAUNCHGEN_STANDIN_HEALTH_HANG_AFTER=1",
                               f"export LAUNCHGEN_STANDIN_FAULT_ONCE={tmp_path / 'fault-fired'}"]
    spec["slurm"]["env"]["trainer"] = {"SLURMTEST_HOLD_AT_CALL": "2", "SLURMTEST_HOLD_FILE": str(hold)}
    plan = build_plan(load_spec_text(yaml.safe_dump(spec), "two.yaml"))
    assert next(p.base for p in plan.ports if p.name == "server_http" and p.replica == 1) == port1
    script = tmp_path / "job.sh"
    script.write_text(render_script(plan, "bash"))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    job = tmp_path / "runs" / "local"
    logs = job / "logs" / "attempt-0"
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        events = logs / "events.log"
        # held at step 2 until replica 1 was stopped, restarted and found healthy again (3 healthy events)
        while not (events.exists() and events.read_text().count("server_healthy") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "replica 1 was not restarted"
            time.sleep(0.5)
        hold.touch()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()  # the script's TERM trap stops its servers and trainer; a KILL would orphan them
            try:
                proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
    trainer_log = (logs / "trainer-local.log").read_text()
    assert proc.returncode == 0, err[-3000:] + trainer_log[-3000:]
    steps = [json.loads(x)["step"] for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, max_steps + 1))
    assert "did not answer" in err and "3 times in a row: stopping it for a restart" in err, err[-3000:]
    ev = (logs / "events.log").read_text()
    assert "replica_restart replica=1 restart=1" in ev, ev
    assert "server_healthy" in ev and "replica=0" in ev
    r0_log = (logs / "server-local.log").read_text()
    # replica 0 took every weight update (the initial push, in chunks, then one per step)
    assert "CUDA_VISIBLE_DEVICES=0" in r0_log and r0_log.count("POST /update_weights") >= max_steps + 1
    assert r0_log.count("POST /v1/completions") >= 1
    assert "vLLM replica 1 failed" in trainer_log and "vLLM replica 1 is back" in trainer_log
    # the new process received the weights (the sync that took it back) and then generated again
    r1_log = (logs / "server-r1-local.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=1" in r1_log
    assert "/health stops answering" in r1_log and r1_log.count("stand-in serving") == 2, r1_log[-2000:]
    first, after = r1_log.split("stand-in serving")[1:]
    assert "POST /update_weights" in first and "POST /v1/completions" in first  # its share before it hung
    assert "POST /update_weights" in after and "POST /v1/completions" in after
