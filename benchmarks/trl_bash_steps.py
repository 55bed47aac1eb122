"""Seconds per GRPO step of `grpo` and `trl.grpo` under the rendered `--bash` script: one spec, the trainer line
the only difference (plain generation: no vllm section), a small Qwen2 built in code, one process.

A step's time is (wall of a 1+N-step job - wall of a 1-step job) / N, so start-up, model loading and the first
step's warm-up cancel out. Each job is `launchgen render --bash` output run with bash; the script's exit status
and the job directory's metrics.jsonl (one record per step) are checked. Prints one line per trainer and writes
JSON to --out.

    python benchmarks/trl_bash_steps.py --device cuda --steps 6 --out trl_bash_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REWARD = '''
def target_fraction(prompts, completions, **kwargs):
    return [c.count("7") / max(1, len(c)) for c in completions]
'''


def spec(work: Path, model: Path, trainer: str, steps: int, device: str, shape: dict[str, int]) -> str:
    gpu = device == "cuda"
    return yaml.safe_dump({
        "version": 1,
        "job": {"name": f"bench-{trainer.replace('.', '-')}", "output_dir": f"runs/{trainer}-{steps}"},
        "slurm": {"time": "00:30:00", "max_restarts": 0, **({"gpus_per_node": 1} if gpu else {})},
        "model": {"name_or_path": str(model), "dtype": "bfloat16" if gpu else "float32"},
        "train": {"device": device, "nodes": 1, "trainer": trainer, "precision": "bf16" if gpu else "fp32",
                  **({"gpus": [0]} if gpu else {}),
                  "args": {"data": {"path": str(work / "prompts.jsonl")},
                           "rewards": [{"name": "bench_reward:target_fraction"}],
                           "per_device_train_batch_size": shape["batch"], "num_generations": shape["generations"],
                           "generation": {"max_completion_length": shape["completion"]},
                           "max_steps": steps, "learning_rate": 1e-5, "logging_steps": 1, "seed": 0,
                           "save_final_model": False}},
    }, sort_keys=False)


def job(work: Path, model: Path, trainer: str, steps: int, device: str, shape: dict[str, int]) -> float:
    from launchgen.input.loader import load_spec_text
    from launchgen.planning.plan import build_plan
    from launchgen.script.render import render_script

    d = work / f"{trainer}-{steps}"
    shutil.rmtree(d, ignore_errors=True)  # the benchmark's own job directory: a rerun starts fresh, never resumes
    d.mkdir(parents=True)
    text = spec(work, model, trainer, steps, device, shape)
    script = d / "job.sh"
    script.write_text(render_script(build_plan(load_spec_text(text, str(d / "spec.yaml"))), "bash"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    res = subprocess.run(["bash", str(script)], cwd=d, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    jobdir = d / "runs" / f"{trainer}-{steps}"
    log = jobdir / "logs" / "attempt-0" / "trainer-local.log"
    if res.returncode != 0:
        sys.stderr.write(res.stderr[-3000:] + (log.read_text()[-6000:] if log.exists() else "(no trainer log)"))
        raise SystemExit(f"{trainer} {steps} steps: the rendered script exited {res.returncode}")
    records = [json.loads(x) for x in (jobdir / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1)), [r["step"] for r in records]
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--work", default="/tmp/trl-bash-steps")
    p.add_argument("--out", default="trl_bash_steps.json")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--completion", type=int, default=64)
    p.add_argument("--trainers", default="grpo,trl.grpo", help="comma-separated: which of the two to time")
    a = p.parse_args()
    from launchgen.trainers.tiny import build_tiny_model

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "bench_reward.py").write_text(REWARD)
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i} and 7"}) + "\n" for i in range(256)))
    model = build_tiny_model(work / "model", hidden_size=a.hidden, num_layers=a.layers, num_heads=8, num_kv_heads=4)
    shape = {"batch": a.batch, "generations": a.generations, "completion": a.completion}
    results: dict[str, Any] = {"shape": {"hidden": a.hidden, "layers": a.layers, **shape}, "steps": a.steps,
                               "device": a.device}
    for trainer in a.trainers.split(","):
        w1 = job(work, model, trainer, 1, a.device, shape)
        wn = job(work, model, trainer, 1 + a.steps, a.device, shape)
        results[trainer] = {"s_per_step": (wn - w1) / a.steps, "wall_1": w1, f"wall_{1 + a.steps}": wn}
        print(f"{trainer}: {(wn - w1) / a.steps:.3f} s/step (1-step job {w1:.1f} s, {1 + a.steps}-step job "
              f"{wn:.1f} s)", flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
