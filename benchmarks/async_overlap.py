"""Bounded staleness on a 2-core CPU machine: step time with generation.max_staleness 1 against 0, and what a
weight push costs when generation is in flight (`in_flight_at_push: finish` vs `pause`).

A real CPU `vllm serve` (the vllm_real tier's venv, tests/vllm_real/install.sh) is pinned to one core with taskset,
this process (the GRPO trainer, in-process so each step is timed exactly) to another, one thread each. The tiny
model and batch are sized so that generation and training take similar time: synchronous steps cost
generate + train, overlapped ones max(generate, train), so the limit of the speed-up is 2x.

    python benchmarks/async_overlap.py [--steps 10] [--rounds 2] [--out benchmarks/results/async-overlap-cpu.md]

Runs alternate (sync, k=1 finish, k=1 pause, sync, ...) against the same server, so load from other processes on
the machine falls on all of them; each run starts from the model file's weights, pushed to the server first.
Reported per run: the median step time over the steps after the first two (the first async step cannot overlap),
and the median `time/sync_weights` (the push, including finishing or pausing generation in flight).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from vllm_real.harness import RealServer, free_port, serve_argv, server_env, server_venv, venv_problem  # noqa: E402

TRAINER_CORE, SERVER_CORE = 1, 0


def _model(root: Path, hidden: int, layers: int) -> Path:
    from launchgen.trainers.tiny import build_tiny_model

    # head size 32: vLLM's CPU attention has no kernel for 16
    return Path(build_tiny_model(root / "model", hidden_size=hidden, num_heads=hidden // 32, num_kv_heads=2,
                                 num_layers=layers))


def _data(root: Path) -> Path:
    p = root / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Say {i} and 7", "answer": "7"}) + "\n" for i in range(64)))
    return p


def _cfg(root: Path, model: Path, port: int, name: str, a: argparse.Namespace, **gen: Any) -> dict[str, Any]:
    return {
        "trainer": "grpo", "output_dir": str(root / name), "precision": "fp32",
        "model": {"name_or_path": str(model), "compile": False},
        "data": {"path": str(_data(root))},
        "rewards": [{"name": "length"}],
        "generation": {"backend": "vllm_server", "max_completion_length": a.completion, **gen,
                       "generation_kwargs": {"ignore_eos": True},  # every completion full length: steady timings
                       "vllm_server": {"port": port, "group_port": free_port(), "health_timeout": 120,
                                       "weight_sync_timeout": 300, "control_timeout": 120}},
        "num_generations": 4, "per_device_train_batch_size": a.batch, "learning_rate": 1e-4,
        "lr_scheduler_type": "constant", "max_steps": a.steps, "save_steps": 0, "report_to": ["jsonl"],
        "save_final_model": False, "logging_steps": 1,
    }  # fmt: skip


def _restore(port: int, model: Path) -> None:
    """Every run starts from the model file's weights on the server, as a fresh server would hold."""
    import torch
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation.vllm_server import VLLMServerBackend
    from transformers import AutoModelForCausalLM

    class Acc:
        is_main_process, process_index, num_processes, device = True, 0, 1, torch.device("cpu")

    cfg = TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": "unused", "model": {"name_or_path": str(model)},
        "data": {"path": "unused.jsonl"}, "num_generations": 4,
        "generation": {"backend": "vllm_server", "vllm_server": {"port": port, "group_port": free_port()}}})  # fmt: skip
    backend = VLLMServerBackend.from_config(cfg, Acc())
    backend.sync_weights(iter(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).named_parameters()))
    backend.close()


def _train(cfg: dict[str, Any]) -> dict[str, Any]:
    """One in-process run; the wall time of every optimizer step (from one `_record` call to the next)."""
    from launchgen.trainers import core
    from launchgen.trainers.declarations.config import TrainerConfig

    stamps: list[float] = []
    original = core.Trainer._record

    def record(self: core.Trainer, *args: Any, **kwargs: Any) -> None:  # called once per optimizer step
        stamps.append(time.perf_counter())
        original(self, *args, **kwargs)

    trainer = core.Trainer(TrainerConfig.model_validate(cfg))
    core.Trainer._record = record  # type: ignore[method-assign]
    try:
        trainer.signals.install()
        trainer.setup()
        t0 = time.perf_counter()
        assert trainer.train() == 0
    finally:
        core.Trainer._record = original  # type: ignore[method-assign]
        trainer.signals.uninstall()
        trainer.close()
    steps = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    metrics = [json.loads(x) for x in (Path(cfg["output_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return {"steps": steps, "metrics": metrics}


def _summary(run: dict[str, Any]) -> dict[str, float]:
    tail = run["metrics"][2:]
    med = statistics.median
    return {
        "step": med(run["steps"][2:]),
        "generate": med(m["time/generate"] for m in tail),
        "train": med(m["time/train"] for m in tail),
        "score": med(m["time/score"] for m in tail),
        "sync": med(m["time/sync_weights"] for m in tail),
        "staleness": max((m.get("async/staleness", 0.0) for m in run["metrics"]), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="completions per step (num_generations 4)")
    p.add_argument("--completion", type=int, default=48, help="tokens per completion (ignore_eos)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    venv = server_venv()
    problem = venv_problem(venv)
    if problem:
        print(f"error: {problem}; build it with: bash tests/vllm_real/install.sh", file=sys.stderr)
        return 2
    os.environ.setdefault("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch

    os.sched_setaffinity(0, {TRAINER_CORE})
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="lg-async-bench-"))
    model = _model(root, a.hidden, a.layers)
    port = free_port()
    log = root / "vllm.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(["taskset", "-c", str(SERVER_CORE), *serve_argv(venv, model, port)], env=server_env(),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server = RealServer(proc, port, log)
    results: dict[str, list[dict[str, float]]] = {}
    load: list[str] = []
    try:
        print(f"vLLM healthy after {server.wait_healthy(300):.0f} s", flush=True)
        plan = [("sync", {}), ("k1-finish", {"max_staleness": 1}),
                ("k1-pause", {"max_staleness": 1, "in_flight_at_push": "pause"})]
        for r in range(a.rounds):
            for name, gen in plan:
                _restore(port, model)
                load.append(Path("/proc/loadavg").read_text().split()[0])
                res = _summary(_train(_cfg(root, model, port, f"{name}-{r}", a, **gen)))
                results.setdefault(name, []).append(res)
                print(name, r, {k: round(v, 4) for k, v in res.items()}, flush=True)
    finally:
        server.stop()
    report = _report(a, results, load)
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


def _report(a: argparse.Namespace, results: dict[str, list[dict[str, float]]], load: list[str]) -> str:
    med = statistics.median
    rows = ["| run | step s | generate wait s | train s | score s | push s | max staleness |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        for i, r in enumerate(runs):
            rows.append(f"| {name} #{i} | {r['step']:.3f} | {r['generate']:.3f} | {r['train']:.3f} | {r['score']:.3f} "
                        f"| {r['sync']:.4f} | {r['staleness']:.0f} |")
    sync = med(r["step"] for r in results["sync"])
    lines = [
        f"# async_overlap (CPU, vLLM {server_venv().name} on core {SERVER_CORE}, trainer on core {TRAINER_CORE})", "",
        f"model: tiny qwen2 hidden {a.hidden}, {a.layers} layers; {a.batch} completions x {a.completion} tokens per "
        f"step; {a.steps} steps per run, {a.rounds} rounds; 1-minute load average at each run's start: "
        f"{', '.join(load)}", "", *rows, "",
    ]
    for name in results:
        if name != "sync":
            lines.append(f"- {name}: step {med(r['step'] for r in results[name]):.3f} s vs sync {sync:.3f} s = "
                         f"{sync / med(r['step'] for r in results[name]):.2f}x; push "
                         f"{med(r['sync'] for r in results[name]) * 1e3:.1f} ms "
                         f"(sync runs' push {med(r['sync'] for r in results['sync']) * 1e3:.1f} ms)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
