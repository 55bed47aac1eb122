"""GRPO with LoRA (r=16, all linear layers) against full fine-tuning, and against TRL 1.16 with the same peft_config.

    python benchmarks/grpo_lora.py --shapes 1.5b,3b --modes train --out OUT      # the H200 run (issue 14)
    python benchmarks/grpo_lora.py --shapes cpu --steps 2 --warmup 1           # CPU smoke test of the harness

Shapes, tokenizer, prompts, reward, the fixed completions of the training-phase-alone mode and the per-step clock
(device-synchronised; peak memory = torch.cuda.max_memory_allocated reset at each step start) are
`grpo_vs_trl.py`'s, so the numbers line up with that benchmark's. Per shape and mode it runs:

  * `launchgen-full`: launchgen's GRPO, full fine-tuning (pure bf16 weights and AdamW state, as grpo_vs_trl);
  * `launchgen-lora`: the same with `peft: {r: 16, lora_alpha: 32, lora_dropout: 0.05, target_modules: all-linear}`
    (frozen bf16 base, fp32 adapters);
  * `trl-lora`: TRL 1.16's GRPOTrainer on the same bf16 model with `peft_config=LoraConfig(same fields)`.
    grpo_vs_trl's GRPOConfig has `disable_dropout=True`, which TRL applies after the PEFT wrap: its LoRA dropout
    is then 0 whatever `--lora-dropout` says, so `--lora-dropout 0` is the like-for-like comparison.

Modes: `train` (every trainer gets the same fixed completions: scoring, log-probs, backward and the optimizer
step on identical tokens) and `full` (generate -> score -> train; launchgen generates with the engine its config
picks, on CUDA the static-cache engine, which decodes LoRA's adapted projections with their merged weights; TRL
with transformers' generate through the adapters).
For launchgen-lora it also measures what a weight sync would move: bytes of the merged adapted modules
(`lora.iter_sync_params`) against all weights, and the time to compute them (the merge) on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_vs_trl, and the reward `grpo_vs_trl:digit_reward`
import grpo_vs_trl as gvt
import memory_peak

LORA: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}
SHAPES: dict[str, gvt.Shape] = {
    "cpu": gvt.CONFIGS[0],
    "1.5b": gvt.CONFIGS[3],
    "3b": gvt.Shape("Qwen2.5-3B shape, 32k vocab", 2048, 36, 16, 2, 11008, 32768, 256, False),
}
TRAINERS = ("launchgen-full", "launchgen-lora", "trl-lora")


def run_trl_lora(model_dir: Path, shape: gvt.Shape, prompts: list[str], a: argparse.Namespace, workdir: Path,
                 fixed: list[list[int]] | None) -> dict[str, Any]:
    """grpo_vs_trl's TRL run, with `peft_config` given to GRPOTrainer (everything else identical)."""
    import trl
    from peft import LoraConfig

    orig = trl.GRPOTrainer

    def with_peft(*args: Any, **kw: Any) -> Any:
        return orig(*args, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA), **kw)

    trl.GRPOTrainer = with_peft  # run_trl imports it from the module at call time
    try:
        return gvt.run_trl(model_dir, shape, prompts, a, workdir, fixed)
    finally:
        trl.GRPOTrainer = orig


def _sync_cost(trainer: Any) -> dict[str, Any]:
    """Bytes of the merged adapted modules against all weights, and the time to compute the merged tensors."""
    import torch
    from launchgen.trainers import lora
    from launchgen.trainers.weights import iter_full_named_params

    clock = gvt.Clock(torch.cuda.is_available())
    t = clock.now()
    sent = sum(v.numel() * v.element_size() for _, v in lora.iter_sync_params(trainer.model, trainer.accelerator))
    merge_s = clock.now() - t
    full = sum(v.numel() * v.element_size() for _, v in
               lora.iter_sync_params(trainer.model, trainer.accelerator, full=True))
    # what full fine-tuning's sync would walk for the same model (all parameters, adapters included here)
    walked = sum(v.numel() for _, v in iter_full_named_params(trainer.model, trainer.accelerator))
    trainable, total = lora.trainable_counts(trainer.model)
    return {"sync_gb": sent / 1e9, "all_weights_gb": full / 1e9, "merge_s": merge_s, "params_walked": walked,
            "trainable_params": trainable, "total_params": total}


def run_launchgen(model_dir: Path, shape: gvt.Shape, data_path: Path, a: argparse.Namespace, workdir: Path,
                  fixed: list[list[int]] | None, overrides: list[str]) -> dict[str, Any]:
    """launchgen's own loop with the backend its config chooses, or the fixed-completion stub; the step boundary is
    the scheduler step, as in grpo_vs_trl."""
    import torch
    from launchgen.trainers import core
    from launchgen.trainers.generation import backends

    cuda = torch.cuda.is_available()
    clock = gvt.Clock(cuda)
    times = gvt.StepTimes()
    cfg = gvt.launchgen_config(model_dir, shape, data_path, a, workdir, overrides)
    orig_factory = backends.make_backend

    def count(r: Any) -> tuple[int, int]:
        return sum(len(c) for c in r.completion_ids), max((len(c) for c in r.completion_ids), default=0)

    def make_backend(cfg_: Any, accelerator: Any, model: Any, tokenizer: Any) -> Any:
        be: Any = gvt.FixedBackend(fixed) if fixed is not None else orig_factory(cfg_, accelerator, model, tokenizer)
        be.generate = clock.wrap(be.generate, "gen", count)
        return be

    backends.make_backend = make_backend
    trainer = core.Trainer(cfg)
    try:
        trainer.setup()
    finally:
        backends.make_backend = orig_factory
    trainer.save = lambda: None  # the end-of-run checkpoint is not part of a step
    trainer.generate_batch = clock.wrap(trainer.generate_batch, "gen_and_score")
    sched_step = trainer.scheduler.step

    def step_boundary(*args: Any, **kw: Any) -> Any:
        r = sched_step(*args, **kw)
        clock.end_step(times)
        clock.begin_step()
        return r

    trainer.scheduler.step = step_boundary
    try:
        clock.begin_step()
        rc = trainer.train()
        if rc != 0:
            raise RuntimeError(f"launchgen trainer exited {rc}")
        res = gvt.summarize(times, a.warmup)
        res["backend"] = type(trainer.backend).__name__
        for k in ("decode_path", "graph_captures"):
            if hasattr(trainer.backend, k):
                res[k] = getattr(trainer.backend, k)
        if cfg.peft is not None:
            res.update(_sync_cost(trainer))
    finally:
        trainer.close()
    del trainer
    return res


def _lora_override() -> list[str]:
    fields = ", ".join(f"{k}: {v}" for k, v in LORA.items())
    return [f"peft={{{fields}}}"]


def fmt_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | mode | trainer | step s (median, min-max) | train s | generate s | ms/decode | peak GiB | "
             "peak vs full | step vs full | sync GB (of all) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    full_peak = {(r["shape"], r["mode"]): r.get("peak_mem_gib") for r in rows if r["trainer"] == "launchgen-full"}
    full_step = {(r["shape"], r["mode"]): r.get("step_s") for r in rows if r["trainer"] == "launchgen-full"}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['mode']} | {r['trainer']} | ERROR: {r['error'][:100]} |")
            continue
        ref = full_peak.get((r["shape"], r["mode"]))
        ratio = f"{r['peak_mem_gib'] / ref:.2f}x" if ref else "-"
        step_ref = full_step.get((r["shape"], r["mode"]))
        step_ratio = f"{r['step_s'] / step_ref:.2f}x" if step_ref else "-"
        sync = f"{r['sync_gb']:.2f} ({r['all_weights_gb']:.2f})" if "sync_gb" in r else "-"
        lines.append(
            f"| {r['shape']} | {r['mode']} | {r['trainer']} | {r['step_s']:.3f} ({r['step_min_s']:.3f}-"
            f"{r['step_max_s']:.3f}) | {r['train_s']:.3f} | {r['generate_s']:.3f} | "
            f"{r.get('ms_per_decode_step', float('nan')):.2f} | {r['peak_mem_gib']:.2f} | {ratio} | {step_ratio} | {sync} |")
    return "\n".join(lines)


@contextlib.contextmanager
def _maybe_recording(on: bool) -> Iterator[memory_peak.Recording | None]:
    if not on:
        yield None
        return
    with memory_peak.recording() as rec:
        yield rec


def _trainer_order(trainers: list[str], flip: bool) -> Iterator[str]:
    yield from (trainers[::-1] if flip else trainers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1.5b,3b", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--modes", default="train", help="train (fixed completions), full (with generation)")
    p.add_argument("--trainers", default=",".join(TRAINERS))
    p.add_argument("--steps", type=int, default=4, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on")
    p.add_argument("--lora-dropout", type=float, default=LORA["lora_dropout"],
                   help="lora_dropout of both trainers' peft config (0 makes PEFT skip the dropout copy of x)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a launchgen config override for both launchgen trainers (e.g. max_tokens_per_forward=4608)")
    p.add_argument("--memory-breakdown", action="store_true",
                   help="record the allocator's history per run and print what the peak is made of (slow)")
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench-lora"))
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    LORA["lora_dropout"] = a.lora_dropout

    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="grpo-lora-"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vers = gvt.versions()
    from importlib import metadata

    vers["peft"] = metadata.version("peft")
    print(json.dumps(vers), flush=True)
    (out / "versions.json").write_text(json.dumps(vers, indent=1))
    rows: list[dict[str, Any]] = []
    trainers = [t for t in a.trainers.split(",") if t]
    flip = False
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        model_dir = gvt.build_model_dir(shape, work, device)
        prompts = gvt.make_prompts(a.prompts * (a.warmup + a.steps + 2), a.prompt_len, shape.vocab)
        data_path = work / f"prompts-{name}.jsonl"
        data_path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in prompts))
        fixed = gvt.fixed_completions(a.prompts * a.generations, shape.completion, shape.vocab)
        for mode in a.modes.split(","):
            for trainer in _trainer_order(trainers, flip):
                t0 = time.perf_counter()
                row: dict[str, Any] = {"shape": name, "mode": mode, "trainer": trainer}
                if a.set and trainer != "trl-lora":
                    row["set"] = a.set
                try:
                    with gvt.fresh_device(), _maybe_recording(a.memory_breakdown and device == "cuda") as rec:
                        torch.manual_seed(a.seed)
                        fx = fixed if mode == "train" else None
                        wd = work / f"{name}-{mode}-{trainer}"
                        if trainer == "trl-lora":
                            row.update(run_trl_lora(model_dir, shape, prompts, a, wd, fx))
                        else:
                            over = (_lora_override() if trainer == "launchgen-lora" else []) + a.set
                            row.update(run_launchgen(model_dir, shape, data_path, a, wd, fx, over))
                    if rec is not None:
                        text = f"== {name} {mode} {trainer}\n{memory_peak.breakdown(rec)}\n"
                        (out / f"peak-{name}-{mode}-{trainer}.txt").write_text(text)
                        print(text, flush=True)
                except Exception as e:  # one failing run must not lose the others' numbers
                    row["error"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                row["wall_s"] = time.perf_counter() - t0
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "all_steps_s"}), flush=True)
                with (out / "results.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
            flip = not flip
    text = f"{json.dumps(vers)}\n\n{fmt_table(rows)}\n"
    (out / "table.md").write_text(text)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
