"""FastGenerateBackend's decode paths side by side: HF modules, fused, fused + torch.compile.

    python benchmarks/decode_gpu_check.py --configs 1,3 --out OUT_DIR        # the H200 check (< 4 min)
    python benchmarks/decode_gpu_check.py --configs 0 --new-tokens 8         # CPU smoke test (seconds)

Per configuration (shapes from grpo_vs_trl.CONFIGS; put 2 last, its Liger patch is module-wide) it builds the
random-init model once (bf16 + sdpa on CUDA, fp32 on CPU) and, for each decode path, measures
FastGenerateBackend.generate on `--prompts` x `--prompt-len`-token prompts x the shape's completion length
(`--new-tokens` overrides) at temperature 1:

  * first call (includes graph captures and, for fused+compiled, torch.compile), then the median of
    `--calls` further calls; ms per decode step = call time / backend.last_num_steps;
  * the weights-read floor: bf16 weight bytes / the device-to-device copy bandwidth measured in this run;
  * checks: greedy tokens with CUDA-graph replay == the same backend kind decoding eagerly (bitwise), greedy
    agreement with the modules path (mean prefix length; rows identical), sampled log-probs against the
    trainer's own recomputation (`modeling.per_token_logps`, as grpo_vs_trl.bench_generation does);
  * a keep_cache=False run of the fastest fused kind: device memory the backend still holds after a call.

Every variant runs in its own try/except, so one failure still reports the others. Output: a markdown table on
stdout and in OUT/decode.md, one JSON line per row in OUT/decode.jsonl.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_vs_trl import (
    CONFIGS,
    Clock,
    Shape,
    build_model_dir,
    copy_bandwidth_tb_s,
    logprob_diff,
    make_prompts,
    prefix_agreement,
    versions,
)

# (row label, decode_impl, compile)
VARIANTS: list[tuple[str, str, bool]] = [
    ("modules", "modules", False),
    ("fused", "fused", False),
    ("fused+compiled", "fused", True),
]


def load_model(model_dir: Path, shape: Shape, cuda: bool) -> tuple[Any, Any, bool]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if cuda else torch.float32, attn_implementation="sdpa"
    )
    model = model.to("cuda" if cuda else "cpu").eval()
    liger = False
    if shape.liger and cuda:
        try:  # what `model.use_liger_kernel: true` does in the trainer (modeling.apply_liger)
            from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

            _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=False, cross_entropy=False)
            liger = True
        except Exception as e:  # reported in the table; the paths are still compared without it
            print(f"Liger not applied ({type(e).__name__}: {e})", flush=True)
    return model, tok, liger


def free_device() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_variant(label: str, impl: str, compile_: bool, model: Any, tok: Any, prompts: list[list[int]],
                new_tokens: int, a: argparse.Namespace, clock: Clock, ref_greedy: list[list[int]] | None
                ) -> tuple[dict[str, Any], list[list[int]] | None]:
    import torch
    from launchgen.trainers.generation.fast_generate import FastGenerateBackend
    from launchgen.trainers.generation.protocol import SamplingParams

    cuda = clock.cuda
    row: dict[str, Any] = {"variant": label}
    kw: dict[str, Any] = {"decode_impl": impl, "compile": compile_, "compile_backend": a.compile_backend}
    be = FastGenerateBackend(model, tok, **kw)
    greedy_tokens: list[list[int]] | None = None
    try:
        row["decode_path"] = be.decode_path
        sampled = SamplingParams(max_tokens=new_tokens, temperature=1.0)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t = clock.now()
        out = be.generate(prompts, sampled)
        row["first_call_s"] = clock.now() - t
        ts = []
        for _ in range(a.calls):
            t = clock.now()
            out = be.generate(prompts, sampled)
            ts.append(clock.now() - t)
        row["median_s"] = statistics.median(ts)
        row["steps"] = be.last_num_steps
        row["ms_per_step"] = 1e3 * row["median_s"] / max(1, be.last_num_steps)
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
        row["graphs"] = be.graph_captures if be.use_cuda_graphs else 0
        row["decode_path_after"] = be.decode_path  # differs from decode_path if compiling fell back
        try:
            row["logp_diff_mean"], row["logp_diff_max"] = logprob_diff(model, tok, prompts, out)
        except Exception as e:  # informative; the timing stands on its own
            row["logp_error"] = f"{type(e).__name__}: {e}"

        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0)
        greedy_tokens = be.generate(prompts, greedy).completion_ids
        if ref_greedy is not None:
            row["agree_prefix"], row["agree_rows"] = prefix_agreement(greedy_tokens, ref_greedy)
        if cuda and compile_:
            # The same backend kind without graphs: a compiled decode still reads whole buckets, so both run the
            # same kernels on the same shapes and must agree bit for bit. (Uncompiled eager steps read exactly
            # the written columns instead, which may round differently from the bucketed graphs.)
            eager = FastGenerateBackend(model, tok, use_cuda_graphs=False, **kw)
            try:
                row["graph_eq_eager"] = eager.generate(prompts, greedy).completion_ids == greedy_tokens
            finally:
                eager.close()
    finally:
        be.close()
        del be
        free_device()
    return row, greedy_tokens


def run_no_keep(impl: str, compile_: bool, model: Any, tok: Any, prompts: list[list[int]], new_tokens: int,
                a: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """keep_cache=False: the backend must hold (almost) nothing after a call, and recapture every call."""
    import torch
    from launchgen.trainers.generation.fast_generate import FastGenerateBackend
    from launchgen.trainers.generation.protocol import SamplingParams

    row: dict[str, Any] = {"variant": f"{'fused+compiled' if compile_ else impl} keep_cache=False"}
    free_device()
    base = torch.cuda.memory_allocated() if clock.cuda else 0
    kw: dict[str, Any] = {"decode_impl": impl, "compile": compile_, "compile_backend": a.compile_backend}
    be = FastGenerateBackend(model, tok, keep_cache=False, **kw)
    try:
        row["decode_path"] = be.decode_path
        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0)
        first = be.generate(prompts, greedy).completion_ids
        ts = []
        for _ in range(a.calls):
            t = clock.now()
            again = be.generate(prompts, greedy).completion_ids
            ts.append(clock.now() - t)
        row["median_s"] = statistics.median(ts)
        row["steps"] = be.last_num_steps
        row["ms_per_step"] = 1e3 * row["median_s"] / max(1, be.last_num_steps)
        row["graphs"] = be.graph_captures
        row["repeat_identical"] = again == first
        if clock.cuda:
            torch.cuda.synchronize()
            row["held_mib_after_call"] = (torch.cuda.memory_allocated() - base) / 2**20
        row["state_freed"] = be.state is None and all(k is None for k in be.cache.keys)
        row["decode_path_after"] = be.decode_path
    finally:
        be.close()
        del be
        free_device()
    return row


def fmt(x: Any, spec: str) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def table(rows: list[dict[str, Any]]) -> str:
    hdr = ["cfg", "variant", "path (after)", "first call s", "median s", "steps", "ms/step", "floor ms", "x floor",
           "graphs", "graph==eager greedy", "greedy vs modules: prefix / rows same", "logp abs diff mean/max",
           "peak GiB", "notes"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        path = r.get("decode_path", "-")
        if r.get("decode_path_after") not in (None, path):
            path = f"{path} -> {r['decode_path_after']}"
        floor = r.get("floor_ms")
        x_floor = r["ms_per_step"] / floor if floor and "ms_per_step" in r else None
        agree = (f"{r['agree_prefix']:.1f} / {r['agree_rows']:.2f}" if "agree_prefix" in r else "-")
        logp = (f"{r['logp_diff_mean']:.2g} / {r['logp_diff_max']:.2g}" if "logp_diff_mean" in r
                else r.get("logp_error", "-")[:40])
        notes = []
        if "error" in r:
            notes.append("ERROR: " + r["error"][:160].replace("|", "/").replace("\n", " "))
        if "held_mib_after_call" in r:
            notes.append(f"held after call {r['held_mib_after_call']:.0f} MiB")
        if "state_freed" in r:
            notes.append(f"state freed: {fmt(r['state_freed'], '')}; repeat identical: {fmt(r.get('repeat_identical'), '')}")
        cells = [str(r["config"]), r["variant"], path, fmt(r.get("first_call_s"), ".2f"), fmt(r.get("median_s"), ".3f"),
                 fmt(r.get("steps"), "d"), fmt(r.get("ms_per_step"), ".3f"), fmt(floor, ".3f"),
                 fmt(x_floor, ".1f"), fmt(r.get("graphs"), "d"), fmt(r.get("graph_eq_eager"), ""), agree, logp,
                 fmt(r.get("peak_gib"), ".2f"), "; ".join(notes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="1,3", help="comma list of grpo_vs_trl.CONFIGS keys: 0 (CPU smoke), 1, 2, 3")
    p.add_argument("--prompts", type=int, default=64, help="batch: this many distinct prompts")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=None, help="default: the shape's completion length")
    p.add_argument("--calls", type=int, default=3, help="timed calls after the first")
    p.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    p.add_argument("--no-keep-check", action="store_true", help="skip the keep_cache=False row")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend (default inductor on CUDA, aot_eager on CPU: no C++ compile)")
    p.add_argument("--out", default=os.environ.get("OUT", "out/decode"))
    p.add_argument("--workdir", default=None, help="where models are built (default: a temp dir)")
    a = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if a.compile_backend is None:
        a.compile_backend = "inductor" if cuda else "aot_eager"
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="decode-check-"))
    work.mkdir(parents=True, exist_ok=True)
    vers = versions()
    vers["compile_backend"] = a.compile_backend
    print(json.dumps(vers), flush=True)
    clock = Clock(cuda)
    wanted = set(a.variants.split(","))
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()

    def write_table(final: bool) -> str:
        status = (f"total {time.perf_counter() - t_all:.0f} s" if final
                  else "partial: the run was still going when this was written")
        text = (f"{json.dumps(vers)}\n\n{table(rows)}\n\nfloor = bf16 weight bytes / measured copy bandwidth; "
                f"ms/step = median call time / decode steps; {status}\n")
        (out_dir / "decode.md").write_text(text)
        return text

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        with (out_dir / "decode.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        write_table(final=False)  # an outer timeout still leaves every finished row in decode.md

    for ci in [int(x) for x in a.configs.split(",")]:
        t_cfg = time.perf_counter()
        shape = CONFIGS[ci]
        new_tokens = a.new_tokens or shape.completion
        try:
            model_dir = build_model_dir(shape, work, "cuda" if cuda else "cpu")
            model, tok, liger = load_model(model_dir, shape, cuda)
        except Exception as e:
            traceback.print_exc()
            emit({"config": ci, "variant": "(model)", "error": f"{type(e).__name__}: {e}"})
            continue
        prompts = [tok(t)["input_ids"] for t in make_prompts(a.prompts, a.prompt_len, shape.vocab, seed=5)]
        assert all(len(x) == a.prompt_len for x in prompts), "the benchmark tokenizer makes one token per word"
        weight_bytes = sum(q.numel() * q.element_size() for q in model.parameters())
        floor_ms = None
        if cuda:
            bw = copy_bandwidth_tb_s(clock)
            floor_ms = 1e3 * weight_bytes / (bw * 1e12)
            print(f"config {ci}: weights {weight_bytes / 1e9:.2f} GB, copy {bw:.2f} TB/s, floor {floor_ms:.3f} ms"
                  f"{', Liger' if liger else ''}", flush=True)
        common = {"config": ci, "floor_ms": floor_ms, "weight_gb": weight_bytes / 1e9, "new_tokens": new_tokens,
                  "liger": liger}
        ref_greedy: list[list[int]] | None = None
        for label, impl, compile_ in VARIANTS:
            if label not in wanted:
                continue
            row: dict[str, Any] = dict(common)
            t0 = time.perf_counter()
            try:
                res, greedy = run_variant(label, impl, compile_, model, tok, prompts, new_tokens, a, clock, ref_greedy)
                row.update(res)
                if label == "modules":
                    ref_greedy = greedy
            except Exception as e:  # one failing path must not lose the others' numbers
                traceback.print_exc()
                row.update(variant=label, error=f"{type(e).__name__}: {e}")
                free_device()
            row["wall_s"] = time.perf_counter() - t0
            emit(row)
        if not a.no_keep_check:
            row = dict(common)
            t0 = time.perf_counter()
            try:
                row.update(run_no_keep("fused", "fused+compiled" in wanted, model, tok, prompts, new_tokens, a, clock))
            except Exception as e:
                traceback.print_exc()
                row.update(variant="keep_cache=False", error=f"{type(e).__name__}: {e}")
                free_device()
            row["wall_s"] = time.perf_counter() - t0
            emit(row)
        del model
        free_device()
        print(f"config {ci} done in {time.perf_counter() - t_cfg:.0f} s", flush=True)

    print("\n" + write_table(final=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
