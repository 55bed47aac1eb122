"""The memory / weight-sync / GPU-hour estimate (`launchgen/shared/estimate.py`, issue 26): formulas against hand counts
of known models, and what `plan` and `check` make of it. The trainer's real tensors on CPU are compared in
tests/trainers/test_estimate_cpu.py; the H200 peaks in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from launchgen.trainers.declarations.peft_config import FUSED_GROUPS
from tools import unwrapped

from launchgen.cli import main
from launchgen.shared.estimate import (
    GIB,
    MARGIN,
    TrainerSetup,
    allocated_gib,
    gpu_memory_gib,
    lora_params,
    server_estimate,
    smallest_tp,
    sync_bytes,
    trainer_alternatives,
    trainer_estimate,
)
from launchgen.shared.modelshape import ModelShape

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "multi-node-70b.yaml"

# config.json excerpts of the published models (the keys the estimate reads)
QWEN25_05B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
              "max_position_embeddings": 32768}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False,
             "max_position_embeddings": 131072}
QWEN25_72B = {"model_type": "qwen2", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064, "tie_word_embeddings": False,
              "max_position_embeddings": 32768}
LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False,
              "attention_bias": False, "max_position_embeddings": 8192}

# mixture-of-experts models (config.json excerpts of the published checkpoints): every layer's MLP is routed experts
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                 "max_position_embeddings": 40960}
QWEN3_235B_A22B = {"model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
                   "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                   "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                   "max_position_embeddings": 40960}


def _hand_count(h: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int, tied: bool, bias: bool) -> int:
    """Written out term by term, independently of ModelShape."""
    hd = h // heads
    q = h * heads * hd + (heads * hd if bias else 0)
    k = h * kv_heads * hd + (kv_heads * hd if bias else 0)
    v = k
    o = heads * hd * h
    mlp = h * inter + h * inter + inter * h  # gate, up, down
    norms = 2 * h
    per_layer = q + k + v + o + mlp + norms
    return layers * per_layer + h + vocab * h + (0 if tied else vocab * h)


@pytest.mark.parametrize(("cfg", "published", "args"), [
    (QWEN25_05B, 494_032_768, (896, 24, 14, 2, 4864, 151936, True, True)),
    (QWEN25_7B, 7_615_616_512, (3584, 28, 28, 4, 18944, 152064, False, True)),
    (QWEN25_72B, 72_706_203_648, (8192, 80, 64, 8, 29568, 152064, False, True)),
    (LLAMA3_70B, 70_553_706_496, (8192, 80, 64, 8, 28672, 128256, False, False)),
], ids=["qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b", "llama-3-70b"])
def test_parameter_count_matches_hand_count_and_published_total(cfg: dict[str, Any], published: int,
                                                                 args: tuple[Any, ...]) -> None:
    shape = ModelShape.from_config(cfg)
    assert shape is not None
    assert shape.parameter_count() == _hand_count(*args) == published


@pytest.mark.parametrize(("cfg", "published", "active"), [
    # the safetensors totals of the published checkpoints; "A3B"/"A22B": the active parameters, as the model cards
    (QWEN3_30B_A3B, 30_532_122_624, (3.3e9, 3.4e9)),
    (QWEN3_235B_A22B, 235_093_634_560, (22.1e9, 22.3e9)),
], ids=["qwen3-30b-a3b", "qwen3-235b-a22b"])
def test_moe_totals_hold_every_expert_and_active_counts_the_routed_ones(
        cfg: dict[str, Any], published: int, active: tuple[float, float]) -> None:
    """Memory and weight sync hold every expert (total); a token computes with num_experts_per_tok of them."""
    shape = ModelShape.from_config(cfg)
    assert shape is not None and shape.num_experts == 128 and shape.qk_norm
    assert shape.parameter_count() == published
    assert active[0] <= shape.active_parameter_count() <= active[1]
    dense = ModelShape.from_config(QWEN25_7B)
    assert dense is not None and dense.active_parameter_count() == dense.parameter_count()


def test_server_rank_of_a_pipeline_holds_its_stage() -> None:
    """TP 8 x PP 2 (two nodes): each GPU holds 1/16 of the weights and the KV cache of its 47 of 94 layers."""
    shape = ModelShape.from_config(QWEN3_235B_A22B)
    assert shape is not None
    one = server_estimate(shape, tp=8, dtype="bfloat16", gpu_gib=80.0, max_model_len=8192)
    two = server_estimate(shape, tp=8, pp=2, dtype="bfloat16", gpu_gib=80.0, max_model_len=8192)
    assert one.parts[0].gib == pytest.approx(2 * two.parts[0].gib)
    # 470 GB of bf16 weights fit one 8 x 80 GB node with little KV cache left; the second node's stage gives each
    # GPU half the weights and half the layers' cache per token: many times the full-length sequences
    assert one.full_sequences is not None and two.full_sequences is not None
    assert two.full_sequences > 4 * one.full_sequences, (one.full_sequences, two.full_sequences)
    assert shape.kv_bytes_per_token(2, 8, 2) * 2 == shape.kv_bytes_per_token(2, 8, 1)
    assert two.setup == "TP 8 x PP 2, bfloat16"


def test_text_config_and_missing_keys() -> None:
    assert ModelShape.from_config({"text_config": QWEN25_05B}).parameter_count() == 494_032_768  # type: ignore[union-attr]
    assert ModelShape.from_config({"hidden_size": 8}) is None
    mha = ModelShape.from_config({k: v for k, v in LLAMA3_70B.items() if k != "num_key_value_heads"})
    assert mha is not None and mha.num_key_value_heads == 64  # no key: multi-head attention


def test_kv_bytes_per_token_per_rank() -> None:
    llama = ModelShape.from_config(LLAMA3_70B)
    q7 = ModelShape.from_config(QWEN25_7B)
    assert llama is not None and q7 is not None
    assert llama.kv_bytes_per_token(2, tp=1) == 2 * 80 * 8 * 128 * 2
    assert llama.kv_bytes_per_token(2, tp=8) == 2 * 80 * 1 * 128 * 2
    # 4 KV heads over TP 8: each rank holds a replica of one head
    assert q7.kv_bytes_per_token(2, tp=8) == 2 * 28 * 1 * 128 * 2


@pytest.mark.parametrize(("name", "gib"), [
    ("h100", 79.6), ("nvidia_h100_80gb_hbm3", 79.6), ("H200", 139.8), ("a100", 79.2), ("a100_40g", 39.4),
    ("a100-40gb", 39.4), ("l40s", 44.99), ("l4", 22.49), ("gh200", 94.5), ("v100", 31.74), ("tesla_t4", 14.75),
    ("mystery9000", None),
])
def test_gpu_table(name: str, gib: float | None) -> None:
    assert gpu_memory_gib(name) == gib


def test_server_kv_cache_and_full_sequences() -> None:
    shape = ModelShape.from_config(QWEN25_72B)
    assert shape is not None
    e = server_estimate(shape, tp=8, dtype="bfloat16", gpu_gib=79.6, max_model_len=8192, gpu_memory_utilization=0.9)
    weights = shape.parameter_count() * 2 / 8 / GIB
    assert e.parts[0].gib == pytest.approx(weights)
    assert e.total_gib == pytest.approx(0.9 * 79.6)  # vLLM gives the KV cache what utilization leaves
    assert e.full_sequences == int(e.kv_gib * GIB // (2 * 80 * 1 * 128 * 2 * 8192))  # type: ignore[operator]
    assert e.verdict == "fits" and e.full_sequences > 100
    # an explicit KV budget is what the cache gets
    fixed = server_estimate(shape, tp=8, dtype="bfloat16", gpu_gib=79.6, max_model_len=8192,
                            kv_cache_memory_bytes=4 * 2**30)
    assert fixed.kv_gib == 4 and fixed.full_sequences == 4 * 2**30 // (40960 * 8192)
    # TP 1: 135 GiB of weights on an 80 GiB GPU; the smallest TP that holds them and a sequence is 4
    assert server_estimate(shape, tp=1, dtype="bfloat16", gpu_gib=79.6, max_model_len=8192).verdict == "does not fit"
    assert smallest_tp(shape, dtype="bfloat16", gpu_gib=79.6, max_model_len=8192, gpu_memory_utilization=0.9,
                       kv_cache_memory_bytes=None, limit=8) == 4
    # the model's whole context at TP 4 leaves room for few sequences: the warning case
    long = server_estimate(shape, tp=4, dtype="bfloat16", gpu_gib=79.6, max_model_len=None)
    assert long.max_model_len == 32768 and long.verdict in ("tight", "fits")


def _setup(**kw: Any) -> TrainerSetup:
    base: dict[str, Any] = dict(backend="ddp", processes=8, precision="bf16", weight_dtype="bfloat16",
                                gradient_checkpointing=True, rows=4, prompt_tokens=512, completion_tokens=1024)
    return TrainerSetup(**{**base, **kw})


def _part(e: Any, name: str) -> float:
    return sum(p.gib for p in e.parts if p.name.startswith(name))


def test_trainer_states_per_backend() -> None:
    shape = ModelShape.from_config(QWEN25_7B)
    assert shape is not None
    p = shape.parameter_count()
    ddp = trainer_estimate(shape, _setup(), 79.6)
    # launchgen's DDP: weights, gradients, buckets and both moments in the loaded dtype (bf16: 2 bytes each)
    assert _part(ddp, "weights") == pytest.approx(2 * p / GIB)
    assert _part(ddp, "DDP gradient buckets") == pytest.approx(2 * p / GIB)
    assert _part(ddp, "AdamW state") == pytest.approx(4 * p / GIB)
    # DeepSpeed: ZeRO's 2 + 2 + 12 bytes per parameter; ZeRO-2 shards gradients and optimizer, ZeRO-3 everything
    z2 = trainer_estimate(shape, _setup(backend="deepspeed_zero2"), 79.6)
    z3 = trainer_estimate(shape, _setup(backend="deepspeed_zero3"), 79.6)
    assert _part(z2, "weights") == pytest.approx(2 * p / GIB)
    assert _part(z2, "AdamW state") == pytest.approx(12 * p / 8 / GIB)
    assert _part(z3, "weights") == pytest.approx(2 * p / 8 / GIB)
    assert _part(z3, "gradients") == pytest.approx(2 * p / 8 / GIB)
    assert _part(z3, "gathered layers") > 0
    assert ddp.total_gib > z2.total_gib > z3.total_gib
    # fp32 weights under FSDP2 (model.dtype auto): 4 + 4 + 8 bytes, sharded
    fsdp = trainer_estimate(shape, _setup(backend="fsdp", weight_dtype="float32"), 79.6)
    assert _part(fsdp, "weights") + _part(fsdp, "AdamW state") == pytest.approx(12 * p / 8 / GIB)
    # offload: the optimizer state leaves the GPU, then the weights
    off = trainer_estimate(shape, _setup(backend="deepspeed_zero3", offload_optimizer=True, offload_params=True), 79.6)
    assert _part(off, "AdamW state") == 0 and _part(off, "weights") == 0
    # a reference model is one more copy; LoRA has none (adapters off)
    ref = trainer_estimate(shape, _setup(reference_copy=True), 79.6)
    assert ref.total_gib - ddp.total_gib == pytest.approx(2 * p / GIB)


def test_lora_trains_only_adapters() -> None:
    # the Qwen2.5-3B shape of benchmarks/grpo_lora.py: 29.9 M adapter parameters at r 16, all-linear (RESULTS.md)
    shape = ModelShape(2048, 36, 16, 2, 11008, 32768, tie_word_embeddings=True, qkv_bias=True)
    targets = tuple(shape.layer_linears())
    n = lora_params(shape, 16, targets)
    assert n == 36 * 16 * ((2048 + 2048) * 2 + (2048 + 256) * 2 + (2048 + 11008) * 3)
    assert round(n / 1e6, 1) == 29.9
    e = trainer_estimate(shape, _setup(processes=1, lora_r=16, lora_targets=targets), 139.8)
    assert _part(e, "frozen base") == pytest.approx(2 * shape.parameter_count() / GIB)
    assert _part(e, "adapters") == pytest.approx(12 * n / GIB)  # fp32 weights + two fp32 moments
    assert _part(e, "adapter gradients") == pytest.approx(4 * n / GIB)
    full = trainer_estimate(shape, _setup(processes=1), 139.8)
    assert e.total_gib < 0.6 * full.total_gib


def test_activations_follow_checkpointing_and_passes() -> None:
    shape = ModelShape.from_config(QWEN25_7B)
    assert shape is not None
    on = trainer_estimate(shape, _setup(), 139.8)
    off = trainer_estimate(shape, _setup(gradient_checkpointing=False), 139.8)
    passes = trainer_estimate(shape, _setup(max_tokens_per_forward=2048), 139.8)
    assert off.total_gib > on.total_gib > passes.total_gib
    assert all(p.rough for p in on.parts if p.name.startswith("activations"))


def test_a_short_pass_holds_logit_tiles_of_its_own_size_not_the_chunk() -> None:
    """The tiny test model: 416 tokens x 512 vocabulary are 0.85 MB of fp32 logits, far below the 256 MiB chunk
    (the bound was 1 GiB of tiles for a 2 MB model)."""
    shape = ModelShape(64, 2, 4, 2, 128, 512, tie_word_embeddings=False, qkv_bias=True)
    s = TrainerSetup(backend="ddp", processes=1, precision="fp32", weight_dtype="float32", rows=16,
                     prompt_tokens=20, completion_tokens=6)
    acts = sum(p.gib for p in trainer_estimate(shape, s, None).parts if p.name.startswith("activations")) * GIB
    assert 4 * 416 * 512 * 4 <= acts < 8 << 20


@pytest.mark.parametrize(("name", "key", "lora", "gc", "full", "measured"), [
    # benchmarks/RESULTS.md, "Memory estimate vs measured peaks" (H200, 2026-12-04): max_memory_allocated
    ("config 1", (896, 24, 14, 2, 4864, 32768, 256), False, True, False, 3.94),
    ("config 3", (1536, 28, 12, 2, 8960, 32768, 256), False, True, False, 11.77),
    ("config 2 (151k vocab)", (896, 24, 14, 2, 4864, 151936, 1024), False, True, False, 8.98),
    ("3B full", (2048, 36, 16, 2, 11008, 32768, 256), False, True, False, 23.46),
    ("3B LoRA", (2048, 36, 16, 2, 11008, 32768, 256), True, True, False, 11.26),
    ("config 1 full steps", (896, 24, 14, 2, 4864, 32768, 256), False, True, True, 4.30),
    ("config 1 no checkpointing", (896, 24, 14, 2, 4864, 32768, 256), False, False, False, 19.72),
    ("config 3 no checkpointing", (1536, 28, 12, 2, 8960, 32768, 256), False, False, False, 43.84),
])
def test_benchmark_peaks_within_20_percent(name: str, key: tuple[int, ...], lora: bool, gc: bool, full: bool,
                                           measured: float) -> None:
    h, layers, heads, kv, inter, vocab, completion = key
    shape = ModelShape(h, layers, heads, kv, inter, vocab, tie_word_embeddings=True, qkv_bias=True)
    s = TrainerSetup(backend="ddp", processes=1, precision="bf16", weight_dtype="bfloat16",
                     gradient_checkpointing=gc, rows=64, prompt_tokens=32, completion_tokens=completion,
                     lora_r=16 if lora else None, lora_targets=tuple(shape.layer_linears()) if lora else (),
                     generation_kv_rows=64 if full else 0)
    assert allocated_gib(trainer_estimate(shape, s, None)) == pytest.approx(measured, rel=0.20)


def test_trainer_alternatives_name_what_fits() -> None:
    shape = ModelShape.from_config(QWEN25_72B)
    assert shape is not None
    s = _setup(rows=4, prompt_tokens=1024, completion_tokens=4096)
    e = trainer_estimate(shape, s, 79.6)
    assert e.verdict == "does not fit"
    alts = trainer_alternatives(shape, s, 79.6)
    assert alts and all("deepspeed_zero3" in a for a in alts)
    assert "train.backend: deepspeed_zero3" not in alts  # 16 bytes x 72.7B / 8 GPUs = 135 GiB: ZeRO-3 alone is not enough


def test_sync_bytes_full_and_lora_fused_groups() -> None:
    shape = ModelShape.from_config(QWEN25_7B)
    assert shape is not None
    full, what = sync_bytes(shape, 2, None)
    assert full == 2 * shape.parameter_count() and what == "every parameter"
    lin = shape.layer_linears()
    # q_proj alone: vLLM's fused qkv_proj goes whole
    q_only, what = sync_bytes(shape, 2, ("self_attn.q_proj",), (), FUSED_GROUPS)
    qkv = sum(lin[f"self_attn.{n}_proj"][0] * lin[f"self_attn.{n}_proj"][1] for n in "qkv")
    assert q_only == 2 * 28 * qkv and "k_proj" in what
    # at NVLink's 100 GB/s, 15.2 GB of bf16 7B weights take about 0.15 s
    assert math.isclose(full / 100e9, 0.152, rel_tol=0.01)


# --- plan and check --------------------------------------------------------------------------------------


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_plan_shows_per_gpu_memory_of_tp8_server_and_zero3_trainers() -> None:
    r = _run("plan", str(EXAMPLE))
    assert r.exit_code == 0, r.output
    out = r.output
    assert "Memory per GPU" in out and "TP 8, bfloat16" in out and "deepspeed_zero3 x 32" in out
    assert "KV cache:" in out and "8192-token seqs" in out
    assert "weight sync: 145.4 GB per optimizer step (every parameter) over infiniband" in out
    assert "rough bound" in out
    assert "server: the smallest TP that fits is 4" in " ".join(out.split())  # 72B in bf16 on 80 GB GPUs
    mine = out[out.index("Memory per GPU"):].splitlines()
    assert max(len(line.rstrip()) for line in mine if "│" in line or "┃" in line) <= 80
    js = _run("plan", str(EXAMPLE), "--format", "json")
    est = json.loads(js.output)["estimate"]
    assert est["model"]["parameters"] == 72_706_203_648
    assert est["server"]["verdict"] == "fits" and est["trainer"]["verdict"] in ("fits", "tight")
    assert est["gpu_memory_gib"] == 79.6 and est["sources"]["gpu memory"] == "slurm.gpu_type h100"


def _ddp_one_node(tmp_path: Path) -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["train"]["nodes"] = 1
    spec["train"]["backend"] = "ddp"
    spec["train"]["args"]["data"]["path"] = str(tmp_path / "d.jsonl")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    p = tmp_path / "ddp.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_check_refuses_ddp_of_the_70b_model_on_one_node_naming_the_fix(tmp_path: Path) -> None:
    r = _run("check", str(_ddp_one_node(tmp_path)))
    assert r.exit_code == 2, r.output
    line = next(x for x in unwrapped(r.output).splitlines() if "LG241" in x)
    assert "error LG241 [train.backend]" in line and "ddp x 8" in line
    assert "Fix: Fits after any of: deepspeed_zero3 + train.distributed.offload_optimizer" in line
    assert ":" in line.split(" error")[0]  # file:line


@pytest.mark.parametrize(("tp", "field", "why"), [
    (1, "vllm.tensor_parallel_size", "the weights alone take 135.4 GiB per rank at TP 1"),
    (2, "vllm.max_model_len", "less than one 8192-token sequence"),  # 67.7 GiB of weights fit, no KV room
])
def test_check_refuses_a_server_tp_too_small_and_names_the_smallest_tp(tmp_path: Path, tp: int, field: str,
                                                                        why: str) -> None:
    spec = yaml.safe_load(_ddp_one_node(tmp_path).read_text())
    spec["train"]["backend"] = "deepspeed_zero3"
    spec["train"]["distributed"] = {"offload_optimizer": True}
    spec["vllm"]["tensor_parallel_size"] = tp
    p = tmp_path / "tp.yaml"
    p.write_text(yaml.safe_dump(spec))
    r = _run("check", str(p))
    assert r.exit_code == 2
    line = next(x for x in unwrapped(r.output).splitlines() if "LG240" in x)
    assert f"error LG240 [{field}]" in line and why in line
    assert "Fix: Raise vllm.tensor_parallel_size to 4" in line


def test_warning_margin_and_unknown_gpu_stays_silent(tmp_path: Path) -> None:
    shape = ModelShape.from_config(QWEN25_7B)
    assert shape is not None
    e = trainer_estimate(shape, _setup(), None)
    assert e.verdict == "unknown"
    e = trainer_estimate(shape, _setup(processes=1, backend="deepspeed_zero3"), 79.6)
    tight_gpu = e.total_gib / (1 - MARGIN / 2)
    assert trainer_estimate(shape, _setup(processes=1, backend="deepspeed_zero3"), tight_gpu).verdict == "tight"
    spec = yaml.safe_load(_ddp_one_node(tmp_path).read_text())
    del spec["slurm"]["gpu_type"]
    p = tmp_path / "nogpu.yaml"
    p.write_text(yaml.safe_dump(spec))
    r = _run("check", str(p))
    assert "LG241" not in unwrapped(r.output)
    out = _run("plan", str(p)).output
    assert "LG241" not in out


def _job_dir(tmp_path: Path, times: list[float]) -> Path:
    job = tmp_path / "job"
    (job / "trainer").mkdir(parents=True)
    rows = [{"step": i + 1, "time/step": t, "loss": 0.1} for i, t in enumerate(times)]
    (job / "trainer" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "ti')
    return job


def test_plan_from_run_gives_gpu_hours(tmp_path: Path) -> None:
    job = _job_dir(tmp_path, [300.0, 100.0, 110.0, 120.0])  # the first (compiling) step is left out
    r = _run("plan", str(EXAMPLE), "--from-run", str(job))
    assert r.exit_code == 0, r.output
    # median 110 s x 2000 steps x 40 GPUs (5 nodes x 8)
    assert "cost: 2000 steps x 110.00 s x 40 GPUs = 2,444.4 GPU-hours" in " ".join(r.output.split())
    js = json.loads(_run("plan", str(EXAMPLE), "--from-run", str(job), "--format", "json").output)
    assert js["estimate"]["cost"]["gpu_hours"] == pytest.approx(110 * 2000 * 40 / 3600, abs=0.01)
    # an older run without time/step: the phases summed
    old = tmp_path / "old"
    (old / "trainer").mkdir(parents=True)
    (old / "trainer" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i, "time/generate": 2.0, "time/train": 1.0}) + "\n" for i in (1, 2, 3)))
    js = json.loads(_run("plan", str(EXAMPLE), "--from-run", str(old), "--format", "json").output)
    assert js["estimate"]["cost"]["step_seconds"] == 3.0
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run("plan", str(EXAMPLE), "--from-run", str(empty))
    assert r.exit_code == 2 and "no metrics.jsonl" in unwrapped(r.output)


def test_check_live_judges_with_nvidia_smi_memory(tmp_path: Path) -> None:
    from launchgen.checks.live.command import Result
    from launchgen.checks.live.probes import live_checks
    from launchgen.input.loader import load_spec

    spec = yaml.safe_load(_ddp_one_node(tmp_path).read_text())
    spec["train"]["backend"] = "deepspeed_zero3"
    spec["train"]["nodes"] = 4
    del spec["slurm"]["gpu_type"]  # the spec says nothing: only the live probe knows the GPU
    p = tmp_path / "live.yaml"
    p.write_text(yaml.safe_dump(spec))
    asked: list[list[str]] = []

    def runner(mib: str) -> Any:
        def run(argv: list[str], timeout: float) -> Result:
            asked.append(argv)
            ok = argv[:2] == ["nvidia-smi", "--query-gpu=memory.total"]
            return Result(0, mib) if ok else Result(1, "")
        return run

    issues = live_checks(load_spec(str(p)), runner=runner("24576\n24576\n"), env={}, versions={},
                         is_free=lambda port: True)
    [err] = [i for i in issues if i.code == "LG241"]
    assert "24.0 GiB GPUs (nvidia-smi)" in err.message and err.line is not None
    assert any(a[0] == "nvidia-smi" for a in asked)
    # H100s: the ZeRO-3 layout of the example fits, nothing to say
    issues = live_checks(load_spec(str(p)), runner=runner("81559\n"), env={}, versions={}, is_free=lambda port: True)
    assert not [i for i in issues if i.code in ("LG240", "LG241")]


def _estimate_of(path: Path, **extra: Any) -> Any:
    from launchgen.checks.context import Ctx
    from launchgen.input.loader import load_spec_text
    from launchgen.planning.estimate_spec import estimate

    spec = yaml.safe_load(path.read_text())
    for section, values in extra.items():
        spec.setdefault(section, {}).update(values)
    spec["estimate"] = {"model": {k: v for k, v in QWEN25_7B.items() if k not in ("model_type",)},
                        "gpu_memory_gib": 79.6, **extra.get("estimate", {})}
    ctx = Ctx(load_spec_text(yaml.safe_dump(spec), "s.yaml"), env={})
    return estimate(ctx.spec, ctx.model_config, ctx.trainer_cfg, ctx.layout)


def test_colocate_gives_vllm_its_share_unless_it_sleeps() -> None:
    sleeping = _estimate_of(REPO / "examples" / "colocate.yaml")
    assert sleeping.server.role == "vLLM (colocated)" and sleeping.sync is None  # weights shared in-process
    assert sleeping.trainer.budget_gib == pytest.approx(79.6)  # sleep mode frees vLLM's memory to train
    awake = _estimate_of(REPO / "examples" / "colocate.yaml", vllm={"enable_sleep_mode": False})
    assert awake.trainer.budget_gib == pytest.approx(79.6 * (1 - 0.3))
    # RLOO's KL (beta 0.05) without LoRA keeps a reference copy
    assert any(p.name == "reference model" for p in awake.trainer.parts)


def test_sft_estimates_max_length_rows_and_no_server() -> None:
    e = _estimate_of(REPO / "examples" / "sft-no-vllm.yaml")
    assert e.server is None and e.sync is None
    assert e.trainer_setup.prompt_tokens + e.trainer_setup.completion_tokens == 1024  # sft's max_length default
    assert e.trainer_setup.tokens_per_pass == 4 * 1024


def test_a_trl_trainer_is_said_to_be_not_estimated() -> None:
    e = _estimate_of(REPO / "examples" / "trl-grpo-split.yaml")
    assert e.trainer is None and e.server is not None
    assert any("TRL's own trainers" in m for m in e.missing)


def test_a_users_deepspeed_file_turns_the_refusal_into_a_warning(tmp_path: Path) -> None:
    spec = yaml.safe_load(_ddp_one_node(tmp_path).read_text())
    spec["train"]["backend"] = "deepspeed_zero3"
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    spec["train"]["distributed"] = {"deepspeed_config": str(ds)}
    p = tmp_path / "ds.yaml"
    p.write_text(yaml.safe_dump(spec))
    r = _run("check", str(p))
    line = next(x for x in unwrapped(r.output).splitlines() if "LG241" in x)
    assert "warning LG241" in line and "estimated without the offload" in line
    assert r.exit_code == 0, r.output


def test_the_generation_kv_cache_counts_only_when_kept_through_training(tmp_path: Path) -> None:
    """keep_kv_cache's default, lend, hands the static-cache engine's KV cache back before training; true holds it."""
    spec = yaml.safe_load((REPO / "examples" / "sft-no-vllm.yaml").read_text())  # GPUs and no server: hf backend
    spec["train"]["trainer"] = "grpo"
    spec["train"]["args"].pop("max_length", None)
    rows = []
    for keep in (None, True):
        if keep is not None:
            spec["train"]["args"].setdefault("generation", {})["keep_kv_cache"] = keep
        path = tmp_path / f"{keep}.yaml"
        path.write_text(yaml.safe_dump(spec))
        setup = _estimate_of(path).trainer_setup
        assert setup is not None
        rows.append(setup.generation_kv_rows)
    assert rows[0] == 0 and rows[1] > 0, rows


def test_auto_checkpointing_follows_the_estimate_and_plan_prints_it(tmp_path: Path) -> None:
    """`gradient_checkpointing: auto` (the default): on when the trainer's peak without it is over 90 % of the GPU,
    off below; the trainer's rows and checks are estimated with the choice, and `plan` prints it."""
    path = REPO / "examples" / "sft-no-vllm.yaml"  # ZeRO-2 over 16 processes, 4 x 1024 tokens per pass
    peak = _estimate_of(path, estimate={"gpu_memory_gib": 1000.0}).checkpointing.peak_off_gib
    edge = peak / (1 - MARGIN)
    on = _estimate_of(path, estimate={"gpu_memory_gib": edge * 0.98})
    off = _estimate_of(path, estimate={"gpu_memory_gib": edge * 1.02})
    assert on.checkpointing.on and on.trainer_setup.gradient_checkpointing
    assert not off.checkpointing.on and not off.trainer_setup.gradient_checkpointing
    assert on.trainer.total_gib < off.trainer.total_gib  # the rows are the chosen setting's
    assert any(p.name.endswith("checkpointed)") for p in on.trainer.parts)
    fixed = _estimate_of(path, train={"gradient_checkpointing": False}, estimate={"gpu_memory_gib": edge * 0.98})
    assert fixed.checkpointing is None and not fixed.trainer_setup.gradient_checkpointing  # as written
    spec = yaml.safe_load(path.read_text())
    spec["estimate"] = {"model": {k: v for k, v in QWEN25_7B.items() if k != "model_type"},
                        "gpu_memory_gib": round(edge * 0.98, 1)}
    p = tmp_path / "auto.yaml"
    p.write_text(yaml.safe_dump(spec))
    out = " ".join(_run("plan", str(p)).output.split())
    assert "trainer: gradient checkpointing on (auto):" in out and f"~{peak:.1f} GiB without it" in out
    js = json.loads(_run("plan", str(p), "--format", "json").output)["estimate"]
    assert js["gradient_checkpointing"]["on"] is True
