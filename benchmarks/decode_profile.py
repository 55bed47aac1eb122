"""Issue 27 item 3: where a decode step of the fast engine goes at the Qwen2.5-3B shape, and engine variants side by
side in one process (same model, same prompts, same device).

    PART=decode bash benchmarks/perf_session.sh        # on the device (the old engine carried in out/perf_old)
    python benchmarks/decode_profile.py --config 0 --new-tokens 8 --variants new,unstacked   # CPU smoke

What it prints, per run:
  * the weights-read floor of one decode step (bf16 weight bytes / device copy bandwidth measured here);
  * every GEMM shape of one step at batch `rows` alone (cuBLAS, in a CUDA graph, weights rotated past the L2):
    microseconds, GB/s, and the step's GEMM time if every GEMM ran like that;
  * per engine variant: ms per decode step (call time / decode steps, median of `--calls` after a first call that
    compiles and captures), graph captures, greedy agreement with the first variant, sampled log-probs against the
    trainer's recomputation; then a torch.profiler pass over one call: kernels per step, kernel time per step
    (the rest of the step is the gaps between kernels) and the kernels that take the most time.

Variants: `old` = the engine as it was before this change (a copy of it importable as
`launchgen.trainers.generation.fast_generate_old`, where the session script puts it), `unstacked` = this engine
with `stack_projections=False`, `new` = this engine's default, `autotune` = the default with inductor's GEMM
autotuning (`max_autotune_gemm`) for the compiled layer, to see whether cuBLAS's choices for the skinny GEMMs are
what limits the step, `flex` = the default with `decode_attention="flex"` (issue 39: FlexAttention's split-KV
decoding kernel instead of SDPA with a mask).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_vs_trl import (
    CONFIGS,
    Clock,
    build_tokenizer,
    copy_bandwidth_tb_s,
    kv_floor_bytes,
    logprob_diff,
    make_prompts,
    prefix_agreement,
)


def build_model(ci: int, cuda: bool) -> tuple[Any, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = CONFIGS[ci]
    tok = build_tokenizer(shape.vocab)
    cfg = Qwen2Config(  # as grpo_vs_trl.build_model_dir, without the round trip through the disk
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model: Any = Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16 if cuda else torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def gemm_table(cfg: Any, rows: int, copy_tb_s: float) -> list[dict[str, Any]]:
    """Each GEMM of one decode step alone: (rows x K) @ W.T for W (N, K), in a CUDA graph, weights rotated."""
    import torch

    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = [("q", q, h, 1), ("k or v", kv, h, 2), ("qkv stacked", q + 2 * kv, h, 0), ("o", h, q, 1),
              ("gate or up", i, h, 2), ("gate/up stacked", 2 * i, h, 0), ("down", h, i, 1), ("lm head", v, h, 0)]
    out = []
    for name, n, k, per_layer in shapes:
        nbytes = n * k * 2
        copies = max(2, -(-300 * 2**20 // nbytes))
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
        for w in ws[:2]:
            torch.nn.functional.linear(x, w)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for w in ws:
                torch.nn.functional.linear(x, w)
        g.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        reps = 5
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
        us = 1e6 * (time.perf_counter() - t) / reps / copies
        out.append({"gemm": name, "N": n, "K": k, "MB": nbytes / 1e6, "us": us, "GB_s": nbytes / us / 1e3,
                    "floor_us": nbytes / (copy_tb_s * 1e6), "per_layer_unstacked": per_layer})
        del ws, g
        torch.cuda.empty_cache()
    return out


def engine(variant: str) -> Any:
    if variant == "old":
        return importlib.import_module("launchgen.trainers.generation.fast_generate_old").FastGenerateBackend
    from launchgen.trainers.generation.fast_generate import FastGenerateBackend

    return FastGenerateBackend


def profile_call(be: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    """Kernels of one generate call (graph replays included) from torch.profiler's CUDA activity."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        be.generate(prompts, params)
        torch.cuda.synchronize()
    steps = max(1, be.last_num_steps)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    n, total = 0, 0.0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        dur = float(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)  # us
        if "Memcpy" in ev.name or "Memset" in ev.name:
            continue
        n += 1
        total += dur
        per_name[ev.name][0] += 1
        per_name[ev.name][1] += dur
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:14]
    return {"kernels_per_step": n / steps, "kernel_ms_per_step": total / steps / 1e3,
            "top": [(name[:90], c / steps, t / steps) for name, (c, t) in top]}


def run_variant(variant: str, model: Any, tok: Any, prompts: list[list[int]], new_tokens: int,
                a: argparse.Namespace, clock: Clock, ref: list[list[int]] | None) -> tuple[dict[str, Any], Any]:
    import torch
    from launchgen.trainers.generation.protocol import SamplingParams

    torch._dynamo.reset()
    kw: dict[str, Any] = {"compile_backend": a.compile_backend} if not clock.cuda else {}
    if variant == "unstacked":
        kw["stack_projections"] = False
    if variant == "flex":
        kw["decode_attention"] = "flex"
    if variant == "autotune":
        import torch._inductor.config as ic

        ic.max_autotune_gemm = True
    row: dict[str, Any] = {"variant": variant}
    be = engine(variant)(model, tok, **kw)
    greedy_tokens = None
    try:
        row["decode_path"] = be.decode_path
        sampled = SamplingParams(max_tokens=new_tokens, temperature=1.0)
        t = clock.now()
        out = be.generate(prompts, sampled)
        row["first_call_s"] = clock.now() - t
        ts = []
        for _ in range(a.calls):
            t = clock.now()
            out = be.generate(prompts, sampled)
            ts.append(clock.now() - t)
        row["steps"] = be.last_num_steps
        row["ms_per_step"] = 1e3 * statistics.median(ts) / max(1, be.last_num_steps)
        row["ms_per_step_min"] = 1e3 * min(ts) / max(1, be.last_num_steps)
        row["graphs"] = be.graph_captures
        row["arena_gib"] = be._arena.nbytes / 2**30 if getattr(be, "_arena", None) is not None else 0.0
        try:
            row["logp_diff_mean"], row["logp_diff_max"] = logprob_diff(model, tok, prompts, out)
        except Exception as e:
            row["logp_error"] = f"{type(e).__name__}: {e}"
        greedy_tokens = be.generate(prompts, SamplingParams(max_tokens=min(64, new_tokens), temperature=0.0)
                                    ).completion_ids
        if ref is not None:
            row["greedy_agree_prefix"], row["greedy_agree_rows"] = prefix_agreement(greedy_tokens, ref)
        if clock.cuda:
            row.update(profile_call(be, prompts, sampled))
        row["decode_path_after"] = be.decode_path
    finally:
        if variant == "autotune":
            import torch._inductor.config as ic

            ic.max_autotune_gemm = False
        be.close()
        del be
        gc.collect()
        if clock.cuda:
            torch.cuda.empty_cache()
    return row, greedy_tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=int, default=5, help="grpo_vs_trl.CONFIGS key (5 = the Qwen2.5-3B shape)")
    p.add_argument("--variants", default="old,unstacked,new,autotune")
    p.add_argument("--prompts", type=int, default=64, help="rows per call (grpo_vs_trl: 8 prompts x 8)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--compile-backend", default="aot_eager", help="CPU only (no C++ compiler needed)")
    p.add_argument("--out", default="out/decode_profile")
    a = p.parse_args(argv)

    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    clock = Clock(cuda)
    shape = CONFIGS[a.config]
    new_tokens = a.new_tokens or shape.completion
    model, tok = build_model(a.config, cuda)
    texts = make_prompts(a.prompts, a.prompt_len, shape.vocab, seed=5)
    prompts = [tok(t)["input_ids"] for t in texts]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head: dict[str, Any] = {"config": a.config, "shape": shape.name, "rows": a.prompts, "new_tokens": new_tokens,
                            "weight_gb": weight_bytes / 1e9, "torch": torch.__version__}
    if cuda:
        head["device"] = torch.cuda.get_device_name()
        head["copy_tb_s"] = copy_bandwidth_tb_s(clock)
        head["floor_ms"] = 1e3 * weight_bytes / (head["copy_tb_s"] * 1e12)
    print(json.dumps(head), flush=True)
    lines = [json.dumps(head)]
    if cuda:
        gemms = gemm_table(model.config, a.prompts, head["copy_tb_s"])
        lines.append("| GEMM (rows x K) @ (K x N) | N | K | MB | us | GB/s | bytes floor us |")
        lines.append("|---|---|---|---|---|---|---|")
        for g in gemms:
            lines.append(f"| {g['gemm']} | {g['N']} | {g['K']} | {g['MB']:.1f} | {g['us']:.1f} | {g['GB_s']:.0f} | "
                         f"{g['floor_us']:.1f} |")
        by = {g["gemm"]: g["us"] for g in gemms}
        layers = model.config.num_hidden_layers
        unstacked = layers * (by["q"] + 2 * by["k or v"] + by["o"] + 2 * by["gate or up"] + by["down"]) + by["lm head"]
        stacked = layers * (by["qkv stacked"] + by["o"] + by["gate/up stacked"] + by["down"]) + by["lm head"]
        lines.append(f"GEMM time of one step, each GEMM as alone: unstacked {unstacked / 1e3:.3f} ms, stacked "
                     f"{stacked / 1e3:.3f} ms (floor {head['floor_ms']:.3f} ms)")
        print("\n".join(lines[1:]), flush=True)
    rows: list[dict[str, Any]] = []
    ref = None
    for variant in [v for v in a.variants.split(",") if v]:
        try:
            row, greedy = run_variant(variant, model, tok, prompts, new_tokens, a, clock, ref)
            if ref is None:
                ref = greedy
        except Exception as e:
            row = {"variant": variant, "error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
        for name, c, t in row.get("top", []):
            print(f"    {t:8.1f} us/step {c:6.1f} x  {name}", flush=True)
    lines.append("")
    lines.append("| variant | ms/step (median) | min | x floor W | floor W+KV ms | x W+KV | kernels/step | "
                 "kernel ms/step | graphs | first call s | greedy agree (prefix) | logp |diff| mean/max |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    floor = head.get("floor_ms", float("nan"))
    copy = head.get("copy_tb_s", float("nan"))
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | ERROR {r['error'][:100]} |")
            continue
        # the weights and the KV cache at the call's mean context (grpo_vs_trl.kv_floor_bytes)
        kv_floor = floor + 1e3 * kv_floor_bytes(shape, a.prompts, a.prompt_len, r["steps"]) / (copy * 1e12)
        lines.append(
            f"| {r['variant']} ({r['decode_path_after']}) | {r['ms_per_step']:.3f} | {r['ms_per_step_min']:.3f} | "
            f"{r['ms_per_step'] / floor:.2f} | {kv_floor:.3f} | {r['ms_per_step'] / kv_floor:.2f} | "
            f"{r.get('kernels_per_step', float('nan')):.0f} | "
            f"{r.get('kernel_ms_per_step', float('nan')):.3f} | {r['graphs']} | {r['first_call_s']:.1f} | "
            f"{r.get('greedy_agree_prefix', float('nan')):.1f} | {r.get('logp_diff_mean', float('nan')):.3g}/"
            f"{r.get('logp_diff_max', float('nan')):.3g} |")
    text = "\n".join(lines) + "\n"
    (out / "decode_profile.md").write_text(text)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
