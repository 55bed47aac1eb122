"""The memory estimate (`launchgen/shared/estimate.py`) against the peaks the benchmark harnesses measure (issue 26).

Reads the `results.jsonl` rows of `grpo_vs_trl.py` (configs 1-3, `--modes train`) and `grpo_lora.py` (`--modes
train`, launchgen-full / launchgen-lora) and prints, per row, the estimator's prediction of
`torch.cuda.max_memory_allocated` (the estimate less the CUDA context, which the allocator does not count) next to
the measured peak. Torch-free: the prediction runs anywhere; the measurement comes from the device run
(`benchmarks/estimate_session.sh`).

    python benchmarks/estimate_vs_measured.py OUT/gvt/results.jsonl OUT/lora/results.jsonl
    cd benchmarks/results/estimate-h200 && python ../../estimate_vs_measured.py gvt-results.jsonl \
        lora-results.jsonl off:nogc-results.jsonl full-results.jsonl        # the table in RESULTS.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from launchgen.shared.estimate import TrainerSetup, allocated_gib, trainer_estimate
from launchgen.shared.modelshape import ModelShape

#: The harnesses' shapes (grpo_vs_trl.CONFIGS, grpo_lora.SHAPES), repeated so this runs without torch:
#: hidden, layers, heads, KV heads, intermediate, vocab, completion tokens, Liger layers.
SHAPES: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "cfg1": (896, 24, 14, 2, 4864, 32768, 256),
    "cfg2": (896, 24, 14, 2, 4864, 151936, 1024),
    "cfg3": (1536, 28, 12, 2, 8960, 32768, 256),
    "1.5b": (1536, 28, 12, 2, 8960, 32768, 256),
    "3b": (2048, 36, 16, 2, 11008, 32768, 256),
}
#: Harness defaults: 8 prompts x 8 generations in one micro-batch, 32-token prompts, bf16 weights, checkpointing.
ROWS, PROMPT = 64, 32


def predict(key: str, lora: bool, overrides: list[str], checkpointing: bool = True, full: bool = False) -> float:
    h, layers, heads, kv, inter, vocab, completion = SHAPES[key]
    shape = ModelShape(h, layers, heads, kv, inter, vocab, tie_word_embeddings=True, qkv_bias=True)
    sets = dict(o.split("=", 1) for o in overrides)
    mtpf = int(sets["max_tokens_per_forward"]) if "max_tokens_per_forward" in sets else None
    setup = TrainerSetup(
        backend="ddp", processes=1, precision=sets.get("precision", "bf16"),
        weight_dtype=sets.get("model.dtype", "bfloat16"), gradient_checkpointing=checkpointing,
        rows=ROWS, prompt_tokens=PROMPT, completion_tokens=completion, max_tokens_per_forward=mtpf,
        lora_r=16 if lora else None, lora_targets=tuple(shape.layer_linears()) if lora else (),
        generation_kv_rows=ROWS if full else 0,  # full steps: the hf engine's static KV cache stays allocated
    )
    return allocated_gib(trainer_estimate(shape, setup, None))


def label(row: dict[str, Any]) -> tuple[str, str, bool] | None:
    if row.get("mode") not in ("train", "full") or "peak_mem_gib" not in row:
        return None
    mode = "" if row["mode"] == "train" else ", full GRPO steps (generation too)"
    if "config" in row and (row.get("trainer") == "launchgen" or str(row.get("trainer")).startswith("launchgen[")):
        # a variant (`--lg-variant`, e.g. an fp32 run) names its overrides, which `predict` reads too
        extra = f", {';'.join(row['overrides'])}" if row.get("overrides") else ""
        return f"cfg{row['config']}", f"config {row['config']} ({row['shape']}), full FT{mode}{extra}", False
    if row.get("trainer") in ("launchgen-full", "launchgen-lora") and row["mode"] == "train":
        lora = row["trainer"] == "launchgen-lora"
        extra = f", {';'.join(row['set'])}" if row.get("set") else ""
        return row["shape"], f"{row['shape']} shape, {'LoRA r=16 all-linear' if lora else 'full FT'}{extra}", lora
    return None


def main(paths: list[str]) -> int:
    lines = ["| run | measured peak GiB | predicted GiB | predicted / measured |", "|---|---|---|---|"]
    worst = 0.0
    for arg in paths:
        # `off:PATH`: rows measured without gradient checkpointing (else versions.json beside them says)
        off, _, p = arg.rpartition(":") if arg.startswith("off:") else ("", "", arg)
        versions = Path(p).parent / "versions.json"
        gc = "off" if off else (json.loads(versions.read_text()).get("gradient_checkpointing", "on")
                                if versions.is_file() else "on")
        for text in Path(p).read_text().splitlines():
            row = json.loads(text)
            got = label(row)
            if got is None:
                continue
            key, name, lora = got
            if gc == "off":
                name += ", no gradient checkpointing"
            pred = predict(key, lora, row.get("set") or row.get("overrides") or [], gc != "off", row["mode"] == "full")
            meas = float(row["peak_mem_gib"])
            worst = max(worst, abs(pred / meas - 1))
            lines.append(f"| {name} | {meas:.2f} | {pred:.2f} | {pred / meas:.2f} ({(pred / meas - 1) * 100:+.0f} %) |")
    lines.append(f"\nlargest deviation: {worst * 100:.1f} %")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
