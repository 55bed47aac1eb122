"""launchgen's GRPO trainer against TRL 1.16's GRPOTrainer: same model, tokenizer, data, reward and knobs.

    python benchmarks/grpo_vs_trl.py --configs 1,3,2 --out OUT_DIR          # the H200 run (issue 5)
    python benchmarks/grpo_vs_trl.py --configs 0 --steps 2 --warmup 1      # CPU smoke test of the harness

Per configuration it runs, alternating which trainer goes first so clock/thermal drift hits both:
  * a full GRPO step (generate -> score -> train) for each trainer, `--warmup` untimed steps then `--steps` timed;
  * the training phase alone: the same fixed completions for both (generation replaced by a stub that returns
    them), so the step is scoring + the optimizer step on identical tokens;
  * a micro-benchmark of launchgen's FastGenerateBackend against the weights-read floor of one decode step.
Every row (issue 39) also gives decode against two floors (the weights, and the weights plus the KV cache read
at the batch's mean context, over the copy bandwidth measured here) and the training phase's model FLOPs
utilisation (forward + backward + the checkpointed layers' recomputed forward, `train_flops`, over the training
phase's time, against the card's dense bf16 datasheet peak; the measured matmul rate is in versions.json).
launchgen runs at its default `gradient_checkpointing: auto` (the row's `ckpt` says what it chose; forced values
as `--lg-variant`), TRL at its own default (on); `--budget-of-trl F` adds a launchgen row under
`memory_budget_gib = F x` TRL's peak of the shape; `--train-trainers` picks the training-phase runs.
All three configurations take ~11 minutes on an H200 (TRL's config-2 steps are ~25 s each), more than one device
call allows: benchmarks/RESULTS.md gives the two invocations used. Every step is bracketed by device
synchronisation; generate / score / train are split by wrapping each trainer's own functions. Peak memory is
`torch.cuda.max_memory_allocated` reset at the start of each step.

Model: random-init Qwen2 with Qwen2.5 shapes, built in code and saved once; tokenizer: a byte-level BPE built in
code whose merges make each " <letters>" word one token, so every prompt is exactly `--prompt-len` tokens for both
trainers and nothing is downloaded. Results: one JSON line per run in OUT/results.jsonl and the final table in OUT/table.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PAD, EOS = "<|endoftext|>", "<|im_end|>"


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    completion: int
    liger: bool
    prompts: int | None = None  # per step, instead of --prompts
    prompt_len: int | None = None  # instead of --prompt-len


CONFIGS: dict[int, Shape] = {
    0: Shape("cpu-smoke", 64, 2, 4, 2, 128, 1000, 16, False),
    1: Shape("Qwen2.5-0.5B shape, 32k vocab", 896, 24, 14, 2, 4864, 32768, 256, False),
    2: Shape("0.5B, 151,936 vocab, 1024 tok, Liger", 896, 24, 14, 2, 4864, 151936, 1024, True),
    3: Shape("Qwen2.5-1.5B shape, 32k vocab", 1536, 28, 12, 2, 8960, 32768, 256, False),
    # c1big: config 1's model with 16 x 8 completions of 512-token prompts (a longer KV cache, a larger batch)
    4: Shape("0.5B shape, 16x8 prompts of 512 tokens", 896, 24, 14, 2, 4864, 32768, 256, False, 16, 512),
    # c5-like: the Qwen2.5-3B shape (as benchmarks/grpo_lora.py's 3b)
    5: Shape("Qwen2.5-3B shape, 32k vocab", 2048, 36, 16, 2, 11008, 32768, 256, False),
}


def for_shape(a: argparse.Namespace, shape: Shape) -> argparse.Namespace:
    """The arguments with the shape's own prompt count and length where it has them."""
    out = argparse.Namespace(**vars(a))
    if shape.prompts is not None:
        out.prompts = shape.prompts
    if shape.prompt_len is not None:
        out.prompt_len = shape.prompt_len
    return out


def weight_bytes(model_dir: Path) -> int:
    """Bytes of the saved (bf16) weights: what one decode step must read at least once."""
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


# ----------------------------------------------------------------------------------------------- reward


def digit_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Share of the digits 0 and 7 in the completion text: cheap, deterministic, varies within a group."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else str(c)
        out.append((text.count("0") + text.count("7")) / max(1, len(text)))
    return out


# ------------------------------------------------------------------------------------------- model/data


def word_list(vocab: int) -> list[str]:
    """`vocab - 3 - 256` lowercase words, closed under prefixes (a trie, shortest first)."""
    import itertools
    import string

    need = vocab - 3 - 256
    words: list[str] = []
    for n in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=n):
            if len(words) == need:
                return words
            words.append("".join(letters))
    return words


def build_tokenizer(vocab: int) -> Any:
    """A byte-level BPE whose merges spell each word of `word_list` letter by letter after a space.

    So " abc" is always exactly one token: its pre-token is "Gabc" and the only merges that apply are
    (G,a), (Ga,b), (Gab,c). transformers maps a Qwen2 model directory to Qwen2Tokenizer, which rebuilds a
    byte-level BPE from these vocab/merges, so the tokenizer must be of that kind (a word-level one would not load).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    space = "\u0120"
    specials = [PAD, EOS, "<|im_start|>"]
    vocab_map: dict[str, int] = {t: i for i, t in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab_map[ch] = len(vocab_map)
    merges: list[tuple[str, str]] = []
    for w in word_list(vocab + 0):
        vocab_map[space + w] = len(vocab_map)
        merges.append((space + w[:-1], w[-1]))
    assert len(vocab_map) == vocab, (len(vocab_map), vocab)
    tok = Tokenizer(models.BPE(vocab=vocab_map, merges=merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, unk_token=None)
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.padding_side = "left"
    return fast


def build_model_dir(shape: Shape, root: Path, device: str) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = root / f"model-{shape.hidden}x{shape.layers}-v{shape.vocab}"
    if (out / "config.json").exists():
        return out
    tok = build_tokenizer(shape.vocab)
    cfg = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = Qwen2ForCausalLM(cfg)
        model = model.to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    del model
    return out


def make_prompts(n: int, prompt_len: int, vocab: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = word_list(vocab)
    return ["".join(" " + rng.choice(words) for _ in range(prompt_len)) for _ in range(n)]


def fixed_completions(n: int, length: int, vocab: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


# ----------------------------------------------------------------------------------------------- timing


@dataclass
class StepTimes:
    total: list[float] = field(default_factory=list)
    generate: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    train: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # completion tokens generated in the step
    decode_steps: list[int] = field(default_factory=list)
    peak_mem: list[int] = field(default_factory=list)


class Clock:
    """Device-synchronised wall clock with per-step accumulators that wrapped functions add to."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.gen = 0.0
        self.gen_and_score = 0.0
        self.tokens = 0
        self.decode_steps = 0
        self.t0 = 0.0

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def begin_step(self) -> None:
        import torch

        self.gen = self.gen_and_score = 0.0
        self.tokens = self.decode_steps = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.t0 = self.now()

    def end_step(self, times: StepTimes) -> None:
        import torch

        total = self.now() - self.t0
        times.total.append(total)
        times.generate.append(self.gen)
        times.score.append(max(0.0, self.gen_and_score - self.gen))
        times.train.append(max(0.0, total - self.gen_and_score))
        times.tokens.append(self.tokens)
        times.decode_steps.append(self.decode_steps)
        times.peak_mem.append(torch.cuda.max_memory_allocated() if self.cuda else 0)

    def wrap(self, fn: Callable[..., Any], slot: str, count: Callable[[Any], tuple[int, int]] | None = None
             ) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            t = self.now()
            r = fn(*a, **k)
            dt = self.now() - t
            setattr(self, slot, getattr(self, slot) + dt)
            if count is not None:
                n, steps = count(r)
                self.tokens += n
                self.decode_steps = max(self.decode_steps, steps)
            return r

        return wrapped


def summarize(times: StepTimes, warmup: int) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    t = {k: v[warmup:] for k, v in asdict(times).items()}
    total = t["total"]
    out: dict[str, Any] = {
        "steps_timed": len(total),
        "step_s": med(total),
        "step_min_s": min(total) if total else float("nan"),
        "step_max_s": max(total) if total else float("nan"),
        "step_iqr_s": (statistics.quantiles(total, n=4)[2] - statistics.quantiles(total, n=4)[0]) if len(total) >= 2
        else 0.0,
        "generate_s": med(t["generate"]),
        "score_s": med(t["score"]),
        "train_s": med(t["train"]),
        "tokens": med([float(x) for x in t["tokens"]]),
        "decode_steps": med([float(x) for x in t["decode_steps"]]),
        "peak_mem_gib": max(t["peak_mem"]) / 2**30 if t["peak_mem"] else 0.0,
        "all_steps_s": times.total,
    }
    out["tokens_per_s"] = out["tokens"] / out["step_s"] if out["step_s"] > 0 else float("nan")
    out["ms_per_decode_step"] = (1e3 * out["generate_s"] / out["decode_steps"]) if out["decode_steps"] and \
        out["generate_s"] > 1e-3 else float("nan")
    return out


@contextlib.contextmanager
def fresh_device() -> Iterator[None]:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        yield
    finally:
        _reset_accelerate()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _reset_accelerate() -> None:
    # Both trainers build an Accelerator; its state is a process-wide singleton that must not leak between runs.
    with contextlib.suppress(Exception):
        from accelerate.state import AcceleratorState, GradientState, PartialState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()


# ------------------------------------------------------------------------------------------------- TRL


def run_trl(model_dir: Path, shape: Shape, prompts: list[str], a: argparse.Namespace, workdir: Path,
            fixed: list[list[int]] | None) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    clock = Clock(cuda)
    times = StepTimes()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if cuda else torch.float32, attn_implementation="sdpa"
    )
    model = model.to("cuda" if cuda else "cpu")
    args = GRPOConfig(
        output_dir=str(workdir / "trl"),
        per_device_train_batch_size=a.prompts * a.generations,
        gradient_accumulation_steps=1,
        num_generations=a.generations,
        max_completion_length=shape.completion,
        max_steps=a.warmup + a.steps,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        bf16=cuda,
        use_cpu=not cuda,
        use_liger_kernel=shape.liger,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=a.seed,
        disable_dropout=True,
        dataloader_num_workers=0,
        gradient_checkpointing=a.gradient_checkpointing == "on",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
    )

    def count(r: Any) -> tuple[int, int]:
        comp = r[0]
        return sum(len(c) for c in comp), max((len(c) for c in comp), default=0)

    if fixed is not None:
        def stub(prompt_ids: list[list[int]], *rest: Any, **kw: Any) -> tuple[list[list[int]], None]:
            return [list(fixed[i % len(fixed)]) for i in range(len(prompt_ids))], None

        trainer._generate_single_turn = clock.wrap(stub, "gen", count)
    else:
        trainer._generate_single_turn = clock.wrap(trainer._generate_single_turn, "gen", count)
    trainer._generate_and_score_completions = clock.wrap(trainer._generate_and_score_completions, "gen_and_score")

    class Timer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            clock.begin_step()

        def on_step_end(self, *args: Any, **kw: Any) -> None:
            clock.end_step(times)

    trainer.add_callback(Timer())
    trainer.train()
    res = summarize(times, a.warmup)
    del trainer, model
    return res


# -------------------------------------------------------------------------------------------- launchgen


def launchgen_config(model_dir: Path, shape: Shape, data_path: Path, a: argparse.Namespace, workdir: Path,
                     overrides: list[str] | None = None) -> Any:
    """The launchgen equivalent of `run_trl`'s GRPOConfig; `overrides` (`dotted.key=value`, as `--set` in the
    rendered scripts) are launchgen-only knobs of a variant (compile, passes, chunk sizes), never the algorithm's."""
    import torch
    from launchgen.trainers.declarations.config import TrainerConfig, apply_override

    cuda = torch.cuda.is_available()
    data: dict[str, Any] = {
        "trainer": "grpo",
        "output_dir": str(workdir / "launchgen"),
        "seed": a.seed,
        "precision": "bf16" if cuda else "fp32",
        "model": {
            "name_or_path": str(model_dir),
            "dtype": "bfloat16" if cuda else "float32",
            "attn_implementation": "sdpa",
            "use_liger_kernel": shape.liger,
            "gradient_checkpointing": {"auto": "auto", "on": True, "off": False}[a.lg_checkpointing],
        },
        # every prompt is exactly this long: the memory estimate behind `auto` then sees the real length
        "data": {"path": str(data_path), "prompt_column": "prompt", "max_prompt_length": a.prompt_len},
        "rewards": [{"name": "grpo_vs_trl:digit_reward"}],
        "generation": {"backend": "hf", "max_completion_length": shape.completion, "temperature": 1.0},
        "num_generations": a.generations,
        "beta": 0.0,
        "learning_rate": 1e-6,
        "lr_scheduler_type": "constant",
        "per_device_train_batch_size": a.prompts * a.generations,
        "gradient_accumulation_steps": 1,
        "max_steps": a.warmup + a.steps,
        "save_steps": 0,
        "save_final_model": False,
        "report_to": ["jsonl"],
        "resume": "never",
        "logging_steps": 1,
    }
    for item in overrides or []:
        apply_override(data, item)
    return TrainerConfig.model_validate(data)


class FixedBackend:
    """GenerationBackend stub for the training-phase-alone runs: the same completions every call, instantly."""

    def __init__(self, fixed: list[list[int]]) -> None:
        self.fixed = fixed

    def generate(self, prompt_ids: list[list[int]], params: Any) -> Any:
        from launchgen.trainers.generation.protocol import GenerationOutput

        comps = [list(self.fixed[i % len(self.fixed)]) for i in range(len(prompt_ids))]
        return GenerationOutput(prompt_ids=[list(p) for p in prompt_ids], completion_ids=comps, logprobs=None,
                                finished=[False] * len(comps))

    def sync_weights(self, named_params: Iterator[tuple[str, Any]]) -> None:
        for _ in named_params:
            pass

    def close(self) -> None:
        return None


def run_launchgen(model_dir: Path, shape: Shape, data_path: Path, a: argparse.Namespace, workdir: Path,
                  fixed: list[list[int]] | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Drive launchgen's own loop (`core.Trainer.setup()` + `.train()`), with FastGenerateBackend as the
    generation backend (or the fixed-completion stub), through the loop's backend factory."""
    import torch
    from launchgen.trainers import core
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.fast_generate import FastGenerateBackend

    cuda = torch.cuda.is_available()
    clock = Clock(cuda)
    times = StepTimes()
    cfg = launchgen_config(model_dir, shape, data_path, a, workdir, overrides)

    def count(r: Any) -> tuple[int, int]:
        return sum(len(c) for c in r.completion_ids), max((len(c) for c in r.completion_ids), default=0)

    def make_backend(cfg_: Any, accelerator: Any, model: Any, tokenizer: Any) -> Any:
        be: Any = FixedBackend(fixed) if fixed is not None else FastGenerateBackend.from_config(
            cfg_, accelerator, model, tokenizer)
        be.generate = clock.wrap(be.generate, "gen", count)
        return be

    orig_factory = backends.make_backend
    backends.make_backend = make_backend
    trainer = core.Trainer(cfg)
    try:
        trainer.setup()
    finally:
        backends.make_backend = orig_factory
    backend = trainer.backend
    trainer.save = lambda: None  # the end-of-run checkpoint is not part of a step
    trainer.generate_batch = clock.wrap(trainer.generate_batch, "gen_and_score")
    # The scheduler steps once per optimizer step, right after optimizer.step(): the step boundary.
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
    finally:
        trainer.close()
    res = summarize(times, a.warmup)
    res["compiled_layers"] = bool(getattr(trainer, "compiled", False))
    c = trainer.checkpointing
    res["checkpointing"] = ("on" if c.on else "off") + (" (auto)" if c.auto else "") + (
        ", after an OOM retry" if c.retried else "")
    res["checkpointing_on"] = c.on
    res["overrides"] = list(overrides or [])
    if isinstance(backend, FastGenerateBackend):
        res["cuda_graphs"] = backend.use_cuda_graphs
        res["graph_captures"] = backend.graph_captures
        res["decode_path"] = getattr(backend, "decode_path", "modules")
    del trainer, backend
    return res


# ------------------------------------------------------------------------------------- generation micro


#: Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by the vendor's datasheet: H100 SXM and H200 alike.
DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}


def datasheet_tflops(gpu_name: str) -> float:
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in gpu_name), float("nan"))


def matmul_tflops(clock: Clock, n: int = 8192) -> float:
    """The bf16 matrix rate on random data (the measured ceiling beside the datasheet's)."""
    import torch

    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    t = clock.now()
    for _ in range(10):
        x @ y
    dt = (clock.now() - t) / 10
    del x, y
    return 2 * n**3 / dt / 1e12


def kv_bytes_per_token(shape: Shape) -> int:
    """bf16 K and V of one token over all layers."""
    return 2 * shape.layers * shape.kv_heads * (shape.hidden // shape.heads) * 2


def kv_floor_bytes(shape: Shape, rows: int, prompt_len: int, decode_steps: float) -> float:
    """KV-cache bytes one decode step must read at the batch's mean context: rows x (prompt + (steps + 1) / 2)."""
    return rows * (prompt_len + (decode_steps + 1) / 2) * kv_bytes_per_token(shape)


def train_flops(shape: Shape, rows: int, seq: int, checkpointing: bool) -> float:
    """Model FLOPs of one training phase over `rows` sequences of `seq` tokens: forward (linear layers, the LM
    head, causal attention) + backward (2x) + with checkpointing the decoder layers' recomputed forward."""
    h, hd = shape.hidden, shape.hidden // shape.heads
    q, kv = shape.heads * hd, shape.kv_heads * hd
    linear = 2 * h * q + 2 * h * kv + 3 * h * shape.intermediate  # q, o, k, v; gate, up, down
    layers = rows * shape.layers * (2 * seq * linear + 2 * seq * seq * q)  # causal QK^T and AV: S^2/2 each x 2 x 2
    head = rows * 2 * seq * shape.vocab * h
    return 3 * (layers + head) + (layers if checkpointing else 0)


def copy_bandwidth_tb_s(clock: Clock) -> float:
    """Device-to-device copy bandwidth (bytes read + written), measured rather than taken from a datasheet."""
    import torch

    buf = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(buf)
    for _ in range(3):
        dst.copy_(buf)
    t = clock.now()
    for _ in range(10):
        dst.copy_(buf)
    dt = (clock.now() - t) / 10
    del buf, dst
    torch.cuda.empty_cache()
    return 2 * 2 * 2**30 / dt / 1e12


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """Mean length of the common prefix per row, and the share of rows that are identical."""
    pref = [next((i for i, (x, y) in enumerate(zip(r, s, strict=False)) if x != y), min(len(r), len(s)))
            for r, s in zip(a, b, strict=True)]
    same = [r == s for r, s in zip(a, b, strict=True)]
    return statistics.mean(pref), sum(same) / len(same)


def logprob_diff(model: Any, tok: Any, prompts: list[list[int]], out: Any, rows: int = 16) -> tuple[float, float]:
    """|sampled log-prob - trainer recompute| over the first `rows` completions (prompts of equal length)."""
    import torch
    from launchgen.trainers.modeling import per_token_logps

    dev = next(model.parameters()).device
    comp = out.completion_ids[:rows]
    width = max(1, max(len(c) for c in comp))
    cids = torch.full((len(comp), width), tok.pad_token_id, dtype=torch.long, device=dev)
    cmask = torch.zeros_like(cids)
    for i, c in enumerate(comp):
        if c:
            cids[i, : len(c)] = torch.tensor(c, device=dev)
            cmask[i, : len(c)] = 1
    pids = torch.tensor(prompts[:rows], device=dev)  # equal lengths: no padding
    with torch.no_grad():
        want, _ = per_token_logps(model, pids, torch.ones_like(pids), cids, cmask, 1.0)
    got = torch.zeros_like(want)
    for i, row in enumerate(out.logprobs[:rows]):
        if row:
            got[i, : len(row)] = torch.tensor([float(x or 0.0) for x in row], device=dev)
    diff = (got - want).abs()[cmask.bool()]
    return float(diff.mean()), float(diff.max())


def bench_generation(model_dir: Path, shape: Shape, a: argparse.Namespace) -> dict[str, Any]:
    """FastGenerateBackend alone on the full batch, against the weights-read floor of one decode step."""
    import torch
    from launchgen.trainers.generation.fast_generate import FastGenerateBackend
    from launchgen.trainers.generation.protocol import SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if cuda else torch.float32, attn_implementation="sdpa"
    )
    model = model.to("cuda" if cuda else "cpu")
    prompts = [tok(t)["input_ids"] for t in make_prompts(a.prompts, a.prompt_len, shape.vocab, seed=5)]
    batch = [p for p in prompts for _ in range(a.generations)]
    be = FastGenerateBackend(model, tok)
    params = SamplingParams(max_tokens=shape.completion, temperature=1.0)
    clock = Clock(cuda)
    ts = []
    for _ in range(4):
        t = clock.now()
        out = be.generate(batch, params)
        ts.append(clock.now() - t)
    n_steps = be.last_num_steps
    res: dict[str, Any] = {
        "gen_s": statistics.median(ts[1:]),
        "first_call_s": ts[0],
        "decode_steps": n_steps,
        "tokens": sum(len(c) for c in out.completion_ids),
        "cuda_graphs": be.use_cuda_graphs,
    }
    res["ms_per_decode_step"] = 1e3 * res["gen_s"] / max(1, n_steps)

    # Checks on the device: graph replay == eager decoding (greedy, bitwise), agreement with HF generate's greedy
    # tokens (bf16 kernels differ, so a prefix agreement is reported, not asserted), and the sampled log-probs
    # against the trainer's own recomputation.
    greedy = SamplingParams(max_tokens=32, temperature=0.0)
    g_graph = be.generate(batch, greedy).completion_ids
    eager = FastGenerateBackend(model, tok, use_cuda_graphs=False)
    g_eager = eager.generate(batch, greedy).completion_ids
    eager.close()
    res["graph_eq_eager_greedy"] = g_graph == g_eager
    ids = torch.tensor([p for p in prompts], device=model.device)  # equal lengths: no padding
    with torch.no_grad():
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[:, ids.shape[1]:].tolist()
    res["hf_greedy_prefix_agreement"], _ = prefix_agreement(g_graph[:: a.generations], hf)
    try:
        res["logprob_absdiff_mean"], res["logprob_absdiff_max"] = logprob_diff(model, tok, batch, out)
    except Exception as e:  # the check is informative; the timing above stands on its own
        res["logprob_check_error"] = f"{type(e).__name__}: {e}"
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    res["weight_gb"] = weight_bytes / 1e9
    if cuda:
        res["copy_tb_s"] = copy_bandwidth_tb_s(clock)
        res["floor_ms"] = 1e3 * weight_bytes / (res["copy_tb_s"] * 1e12)
        res["x_floor"] = res["ms_per_decode_step"] / res["floor_ms"]
        # A graph-replayed decode step with the sampler alone (no forward) isolates fixed per-step cost.
    be.close()
    del model, be
    return res


# ------------------------------------------------------------------------------------------------- main


def derive(row: dict[str, Any], shape: Shape, a: argparse.Namespace, copy_tb_s: float, peak_tflops: float
           ) -> None:
    """The row's distance to the hardware: decode against the weights and the weights+KV floors, training-phase
    MFU against the dense bf16 peak."""
    if "error" in row:
        return
    n = a.prompts * a.generations
    width = row["decode_steps"] or shape.completion
    if copy_tb_s:
        row["kv_floor_ms"] = row["floor_ms"] + 1e3 * kv_floor_bytes(shape, n, a.prompt_len, width) / (copy_tb_s * 1e12)
    ckpt = row.get("checkpointing_on", a.gradient_checkpointing == "on")
    row["train_tflop"] = train_flops(shape, n, a.prompt_len + int(width), ckpt) / 1e12
    if row["train_s"] > 0:
        row["train_tflops"] = row["train_tflop"] / row["train_s"]
        row["mfu"] = row["train_tflops"] / peak_tflops


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "accelerate", "liger-kernel", "datasets", "launchgen"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # a missing optional package is reported, not fatal
            out[name] = "missing"
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
    except Exception:
        pass
    return out


def fmt_table(rows: list[dict[str, Any]]) -> str:
    """One line per run: the step, its phases, decode against both floors, training-phase MFU, peak memory."""
    hdr = ("| cfg | run | trainer | ckpt | step s (median) | min-max | gen s | score s | train s | MFU | tok/s | "
           "ms/decode | floor W ms | x W | floor W+KV ms | x W+KV | graph captures | peak GiB | LG/TRL speed | "
           "LG/TRL mem |")
    lines = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    by = {(r["config"], r["mode"], r["trainer"]): r for r in rows if "error" not in r}
    nan = float("nan")
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['mode']} | {r['trainer']} | ERROR: {' '.join(r['error'][:200].split())} |")
            continue
        other = by.get((r["config"], r["mode"], "trl"))
        speed = mem = ""
        if r["trainer"].startswith("launchgen") and other:
            speed = f"{other['step_s'] / r['step_s']:.2f}x"
            if other["peak_mem_gib"] > 0:
                mem = f"{r['peak_mem_gib'] / other['peak_mem_gib']:.2f}"
        ckpt = r.get("checkpointing", "on" if r["trainer"] == "trl" else "-")
        ms = r["ms_per_decode_step"]
        lines.append(
            f"| {r['config']} | {r['mode']} | {r['trainer']} | {ckpt} | {r['step_s']:.3f} | "
            f"{r['step_min_s']:.3f}-{r['step_max_s']:.3f} | {r['generate_s']:.3f} | {r['score_s']:.3f} | "
            f"{r['train_s']:.3f} | {r.get('mfu', nan):.1%} | {r['tokens_per_s']:.0f} | {ms:.2f} | "
            f"{r['floor_ms']:.3f} | {ms / r['floor_ms']:.2f} | {r.get('kv_floor_ms', nan):.3f} | "
            f"{ms / r.get('kv_floor_ms', nan):.2f} | {r.get('graph_captures', '-')} | "
            f"{r['peak_mem_gib']:.2f} | {speed} | {mem} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 2 goes last: Liger patches transformers' Qwen2 RoPE function module-wide, which would leak into later configs.
    p.add_argument("--configs", default="1,3,2",
                   help="comma list of 0 (CPU smoke), 1, 2, 3, 4 (c1big), 5 (3B); 2 last (Liger patches Qwen2 globally)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="full,train,gen", help="full GRPO steps, training phase alone, generation micro")
    p.add_argument("--trainers", default="launchgen,trl")
    p.add_argument("--lg-variant", action="append", default=[], metavar="LABEL:KEY=VALUE[;KEY=VALUE]",
                   help="run launchgen once more per variant with these config overrides (repeatable), e.g. "
                        "'lean:max_tokens_per_forward=4096;model.logits_chunk_mib=64'; shown as launchgen[LABEL]")
    p.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on",
                   help="TRL's (on is TRL 1.16's GRPOConfig default)")
    p.add_argument("--lg-checkpointing", choices=["auto", "on", "off"], default="auto",
                   help="launchgen's model.gradient_checkpointing (auto: the product's default; forced values are "
                        "also a variant away: --lg-variant 'gc-on:model.gradient_checkpointing=true')")
    p.add_argument("--budget-of-trl", type=float, default=None, metavar="F",
                   help="after TRL's full row of a shape, one launchgen row with memory_budget_gib = F x TRL's peak")
    p.add_argument("--train-trainers", default=None,
                   help="trainers (and variants) of the training-phase-alone mode (default: as --trainers)")
    p.add_argument("--gen-configs", default=None, help="configs that get the generation micro-benchmark (default: all)")
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench"))
    p.add_argument("--workdir", default=None, help="models and trainer outputs (default: a temp dir)")
    a = p.parse_args(argv)

    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="grpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vers = versions()
    vers["gradient_checkpointing"] = a.gradient_checkpointing
    print(json.dumps(vers), flush=True)
    (out / "versions.json").write_text(json.dumps(vers, indent=1))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # rewards resolve `grpo_vs_trl:digit_reward`

    rows: list[dict[str, Any]] = []
    gen_rows: list[dict[str, Any]] = []
    modes = a.modes.split(",")
    trainers = [t for t in a.trainers.split(",") if t]
    variants: dict[str, list[str]] = {}
    for v in a.lg_variant:
        label, _, spec = v.partition(":")
        variants[f"launchgen[{label}]"] = [x for x in spec.split(";") if x]
    trainers += [v for v in variants if a.train_trainers is None]
    if a.train_trainers is not None:
        a.train_trainers = ",".join(t if t in ("launchgen", "trl") else f"launchgen[{t}]"
                                    for t in a.train_trainers.split(",") if t)
    flip = False
    copy_tb_s = copy_bandwidth_tb_s(Clock(True)) if device == "cuda" else 0.0
    vers["copy_tb_s"] = copy_tb_s
    peak_tflops = datasheet_tflops(vers.get("gpu", ""))
    vers["dense_bf16_tflops"] = peak_tflops
    vers["matmul_tflops"] = matmul_tflops(Clock(True)) if device == "cuda" else float("nan")
    base_args = a
    for ci in [int(x) for x in base_args.configs.split(",")]:
        shape = CONFIGS[ci]
        a = for_shape(base_args, shape)
        model_dir = build_model_dir(shape, work, device)
        floor_ms = 1e3 * weight_bytes(model_dir) / (copy_tb_s * 1e12) if copy_tb_s else float("nan")
        n_prompts = a.prompts * (a.warmup + a.steps + 2)
        prompts = make_prompts(n_prompts, a.prompt_len, shape.vocab)
        data_path = work / f"prompts-{ci}.jsonl"
        data_path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in prompts))
        fixed = fixed_completions(a.prompts * a.generations, shape.completion, shape.vocab)
        for mode in [m for m in modes if m in ("full", "train")]:
            these = trainers if mode == "full" or a.train_trainers is None else \
                [t for t in a.train_trainers.split(",") if t]
            order = these[::-1] if flip else these
            flip = not flip
            if mode == "full" and a.budget_of_trl is not None and "trl" in order:
                order = [t for t in order if t != "trl"]
                order = ["trl", *order, "budget"]  # the budget row needs TRL's peak of this shape
            for trainer in order:
                if trainer == "budget":
                    trl_row = next((r for r in rows if r["config"] == ci and r["mode"] == mode
                                    and r["trainer"] == "trl" and "error" not in r), None)
                    if trl_row is None:
                        continue
                    gib = round(a.budget_of_trl * trl_row["peak_mem_gib"], 2)
                    trainer = f"launchgen[budget {gib:g} GiB = {a.budget_of_trl:g}x TRL]"
                    variants[trainer] = [f"memory_budget_gib={gib}"]
                t0 = time.perf_counter()
                row: dict[str, Any] = {"config": ci, "shape": shape.name, "mode": mode, "trainer": trainer,
                                       "floor_ms": floor_ms}
                try:
                    with fresh_device():
                        torch.manual_seed(a.seed)
                        fx = fixed if mode == "train" else None
                        if trainer == "trl":
                            row.update(run_trl(model_dir, shape, prompts, a, work / f"c{ci}-{mode}", fx))
                        else:
                            row.update(run_launchgen(model_dir, shape, data_path, a, work / f"c{ci}-{mode}", fx,
                                                     variants.get(trainer)))
                except Exception as e:  # one failing run must not lose the others' numbers
                    row["error"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                row["wall_s"] = time.perf_counter() - t0
                derive(row, shape, a, copy_tb_s, peak_tflops)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "all_steps_s"}), flush=True)
                with (out / "results.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
        if "gen" in modes and (a.gen_configs is None or str(ci) in a.gen_configs.split(",")):
            g: dict[str, Any] = {"config": ci}
            try:
                with fresh_device():
                    g.update(bench_generation(model_dir, shape, a))
            except Exception as e:
                g["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            gen_rows.append(g)
            print(json.dumps(g), flush=True)
            with (out / "results.jsonl").open("a") as f:
                f.write(json.dumps({"generation_micro": g}) + "\n")

    table = fmt_table(rows)
    gl = ["| cfg | FastGenerate ms/decode step | weights GB | copy TB/s | floor ms | x floor | graphs | first call s "
          "| graph==eager | HF greedy agree (of 32) | logp |diff| mean/max |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in gen_rows:
        if "error" in g:
            gl.append(f"| {g['config']} | ERROR: {g['error'][:80]} |")
        else:
            gl.append(
                f"| {g['config']} | {g['ms_per_decode_step']:.3f} | {g['weight_gb']:.2f} | {g.get('copy_tb_s', 0):.2f} | "
                f"{g.get('floor_ms', 0):.3f} | {g.get('x_floor', 0):.1f} | {g['cuda_graphs']} | {g['first_call_s']:.2f} | "
                f"{g.get('graph_eq_eager_greedy')} | {g.get('hf_greedy_prefix_agreement', float('nan')):.1f} | "
                f"{g.get('logprob_absdiff_mean', float('nan')):.2g}/{g.get('logprob_absdiff_max', float('nan')):.2g} |"
            )
    text = f"{json.dumps(vers)}\n\n{table}\n\n" + "\n".join(gl) + "\n"
    (out / "table.md").write_text(text)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
