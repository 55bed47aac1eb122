"""FastGenerateBackend on CPU: the same tokens as eager `generate`, and log-probs the trainer would recompute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from launchgen.trainers.generation.fast_generate import FastGenerateBackend
from launchgen.trainers.generation.protocol import GenerationBackend, SamplingParams

TEXTS = ["What is 2 + 3?", "hello", "The quick brown fox jumps over", "Compute 7 * 6."]


def _load(model_dir: Path) -> tuple[Any, Any]:
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="sdpa", dtype=torch.float32
    )
    return model, tok


def _prompts(tok: Any) -> list[list[int]]:
    return [tok(t)["input_ids"] for t in TEXTS]


def _left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    plen = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), plen), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), plen, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, plen - len(p):] = torch.tensor(p)
        mask[i, plen - len(p):] = 1
    return ids, mask


def _hf_greedy(model: Any, tok: Any, prompts: list[list[int]], max_new: int, eos: list[int],
               repetition_penalty: float = 1.0) -> list[list[int]]:
    ids, mask = _left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
            pad_token_id=tok.pad_token_id, eos_token_id=eos, repetition_penalty=repetition_penalty,
        )
    rows = []
    for r in out[:, ids.shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(r) if t in eos), len(r))
        rows.append(r[:end])
    return rows


@pytest.fixture(scope="module")
def qwen(tiny_model_dir: Path) -> tuple[Any, Any]:
    return _load(tiny_model_dir)


def test_is_a_generation_backend(qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    assert isinstance(FastGenerateBackend(model, tok), GenerationBackend)


def test_grouped_query_attention_matches_repeated_kv() -> None:
    """The decode attention reads each K/V head once; it must equal SDPA over repeated K/V (HF's path)."""
    from launchgen.trainers.generation.fast_generate.attention import _gqa_sdpa

    g = torch.Generator().manual_seed(0)
    for q_len in (1, 5):
        q = torch.randn(3, 8, q_len, 16, generator=g)
        k = torch.randn(3, 2, 9, 16, generator=g)
        v = torch.randn(3, 2, 9, 16, generator=g)
        allowed = torch.rand(3, 1, q_len, 9, generator=g) > 0.3
        allowed[..., 0] = True
        mask = torch.zeros(3, 1, q_len, 9).masked_fill(~allowed, torch.finfo(torch.float32).min)
        got, _ = _gqa_sdpa(torch.nn.Module(), q, k, v, mask, scaling=0.25)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask, scale=0.25
        ).transpose(1, 2)
        torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("arch", ["qwen", "llama"])
def test_greedy_matches_eager_generate_with_eos_stop(
    arch: str, qwen: tuple[Any, Any], tiny_llama_dir: Path
) -> None:
    model, tok = qwen if arch == "qwen" else _load(tiny_llama_dir)
    prompts = _prompts(tok)
    free = _hf_greedy(model, tok, prompts, 24, [tok.eos_token_id])
    # The tiny random model rarely emits its EOS; make a token that row 1 emits mid-way a stop token, so rows
    # end at different steps and the padding-after-EOS path is exercised.
    stop = free[1][6]
    assert any(stop not in r for r in free), "need one row that runs to max_tokens"
    ref = _hf_greedy(model, tok, prompts, 24, [tok.eos_token_id, stop])

    backend = FastGenerateBackend(model, tok)
    out = backend.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, extra={"stop_token_ids": [stop]}))
    assert out.completion_ids == ref
    assert out.prompt_ids == prompts
    assert out.finished == [stop in r or tok.eos_token_id in r for r in ref]
    assert out.logprobs is not None and [len(x) for x in out.logprobs] == [len(r) for r in ref]
    assert len(ref[1]) <= 7


def test_greedy_with_repetition_penalty_matches_eager_generate(qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    prompts = _prompts(tok)
    ref = _hf_greedy(model, tok, prompts, 20, [tok.eos_token_id], repetition_penalty=1.5)
    assert ref != _hf_greedy(model, tok, prompts, 20, [tok.eos_token_id]), "the penalty must change the output"
    out = FastGenerateBackend(model, tok).generate(
        prompts, SamplingParams(max_tokens=20, temperature=0.0, repetition_penalty=1.5)
    )
    assert out.completion_ids == ref


def test_stops_early_when_every_row_has_ended(qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    prompts = _prompts(tok)
    first = _hf_greedy(model, tok, prompts, 1, [tok.eos_token_id])
    backend = FastGenerateBackend(model, tok, stop_check_interval=4)
    stops = sorted({r[0] for r in first})
    out = backend.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0, extra={"stop_token_ids": stops}))
    assert out.completion_ids == first
    assert out.finished == [True] * len(prompts)
    assert backend.last_num_steps == 4  # the first look at the flag, not all 63 decode steps

    # The buffers are reused across calls; a later call without the stop tokens must run to max_tokens.
    again = backend.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0))
    assert again.completion_ids == _hf_greedy(model, tok, prompts, 12, [tok.eos_token_id])
    assert backend.last_num_steps == 11


def _recompute_logprobs(model: Any, tok: Any, prompts: list[list[int]], comps: list[list[int]], temperature: float
                        ) -> list[list[float]]:
    """The trainer's side: one full forward over prompt + completion, logits / T, log_softmax, gather."""
    ids, pmask = _left_pad(prompts, tok.pad_token_id)
    clen = max(len(c) for c in comps)
    cids = torch.full((len(comps), clen), tok.pad_token_id, dtype=torch.long)
    cmask = torch.zeros(len(comps), clen, dtype=torch.long)
    for i, c in enumerate(comps):
        cids[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
    full = torch.cat([ids, cids], 1)
    mask = torch.cat([pmask, cmask], 1)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=mask).logits[:, ids.shape[1] - 1 : -1].float()
    lp = torch.log_softmax(logits * (1.0 / temperature), -1).gather(-1, cids[..., None]).squeeze(-1)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(comps)]


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0),
        dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
        dict(temperature=0.9, repetition_penalty=1.3),
    ],
    ids=["plain", "filtered", "repetition-penalty"],
)
def test_sampled_logprobs_match_trainer_recomputation(qwen: tuple[Any, Any], params: dict[str, float]) -> None:
    model, tok = qwen
    prompts = [p for p in _prompts(tok) for _ in range(2)]
    backend = FastGenerateBackend(model, tok)
    out = backend.generate(prompts, SamplingParams(max_tokens=20, extra={"seed": 1}, **params))  # type: ignore[arg-type]
    assert out.logprobs is not None
    ref = _recompute_logprobs(model, tok, prompts, out.completion_ids, float(params["temperature"]))
    for got, want in zip(out.logprobs, ref, strict=True):
        assert got == pytest.approx(want, abs=2e-5)
    # Sampling, not argmax: two generations of one prompt differ somewhere.
    assert any(out.completion_ids[2 * i] != out.completion_ids[2 * i + 1] for i in range(len(prompts) // 2))


def test_filters_restrict_the_sampled_tokens(qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    prompts = _prompts(tok) * 4
    backend = FastGenerateBackend(model, tok)
    greedy = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0))
    top1 = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=1.5, top_k=1, extra={"seed": 3}))
    assert top1.completion_ids == greedy.completion_ids

    top5 = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=2.0, top_k=5, extra={"seed": 4}))
    for i, comp in enumerate(top5.completion_ids):
        seq = torch.tensor(prompts[i] + comp)[None]
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0, len(prompts[i]) - 1 : -1]
        allowed = torch.topk(logits, 5, -1).indices
        assert all(t in allowed[j].tolist() for j, t in enumerate(comp))


def test_training_mode_and_checkpointing_are_restored(tiny_model_dir: Path) -> None:
    model, tok = _load(tiny_model_dir)
    model.gradient_checkpointing_enable()
    model.train()
    prompts = _prompts(tok)
    out = FastGenerateBackend(model, tok).generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    assert model.training
    assert model.config._attn_implementation == "sdpa"  # the generation-only attention kernel is swapped back
    model.eval()
    assert out.completion_ids == _hf_greedy(model, tok, prompts, 8, [tok.eos_token_id])


def test_logprobs_match_the_trainers_own_per_token_logps(qwen: tuple[Any, Any]) -> None:
    from launchgen.trainers import modeling
    model, tok = qwen
    prompts = [p for p in _prompts(tok) for _ in range(2)]
    out = FastGenerateBackend(model, tok).generate(
        prompts, SamplingParams(max_tokens=16, temperature=0.8, extra={"seed": 7})
    )
    assert out.logprobs is not None
    ids, pmask = _left_pad(prompts, tok.pad_token_id)
    clen = max(len(c) for c in out.completion_ids)
    cids = torch.full((len(prompts), clen), tok.pad_token_id, dtype=torch.long)
    cmask = torch.zeros(len(prompts), clen, dtype=torch.long)
    for i, c in enumerate(out.completion_ids):
        cids[i, : len(c)] = torch.tensor(c)
        cmask[i, : len(c)] = 1
    with torch.no_grad():
        want, _ = modeling.per_token_logps(model, ids, pmask, cids, cmask, 0.8)
    for i, c in enumerate(out.completion_ids):
        assert out.logprobs[i] == pytest.approx(want[i, : len(c)].tolist(), abs=2e-5)


def test_refuses_sharded_weights(tiny_model_dir: Path) -> None:
    model, tok = _load(tiny_model_dir)
    # What ZeRO-3 leaves on a rank between gathers: an empty placeholder in place of the weight.
    model.lm_head.weight = torch.nn.Parameter(torch.empty(0))
    with pytest.raises(ValueError, match=r"lm_head\.weight is sharded"):
        FastGenerateBackend(model, tok)


def test_from_config_builds_a_working_backend(qwen: tuple[Any, Any], tiny_model_dir: Path) -> None:
    from launchgen.trainers.declarations.config import TrainerConfig

    model, tok = qwen
    cfg = TrainerConfig.model_validate(
        {"trainer": "grpo", "output_dir": "unused", "model": {"name_or_path": str(tiny_model_dir)},
         "data": {"path": "unused.jsonl"}}
    )
    backend = FastGenerateBackend.from_config(cfg, None, model, tok)
    prompts = _prompts(tok)
    out = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    assert out.completion_ids == _hf_greedy(model, tok, prompts, 6, [tok.eos_token_id])
    assert backend.keep_cache == "lend"
    backend.close()
    backend.close()  # the protocol allows a second close
    cfg.generation.keep_kv_cache = False
    lean = FastGenerateBackend.from_config(cfg, None, model, tok)
    assert lean.keep_cache is False
    assert lean.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0)).completion_ids == out.completion_ids
    assert lean.state is None  # released after the call


def test_seed_reproduces_without_touching_the_global_stream(qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok)
    params = SamplingParams(max_tokens=12, temperature=1.0, extra={"seed": 11})
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    a = backend.generate(prompts, params)
    after = torch.rand(1)
    assert torch.equal(before, after)  # the trainer's stream continues as if nothing had been drawn
    assert backend.generate(prompts, params).completion_ids == a.completion_ids


def test_fp32_weights_generate_under_the_trainers_autocast(tiny_model_dir: Path) -> None:
    class _Acc:  # what the backend reads from an accelerate.Accelerator
        mixed_precision = "bf16"

        @staticmethod
        def unwrap_model(m: Any) -> Any:
            return m

    model, tok = _load(tiny_model_dir)
    backend = FastGenerateBackend(model, tok, _Acc(), keep_cache=True)
    assert backend.amp_dtype == torch.bfloat16
    out = backend.generate(_prompts(tok), SamplingParams(max_tokens=8, temperature=0.0))
    assert backend.cache.keys[0] is not None and backend.cache.keys[0].dtype == torch.bfloat16
    assert [len(c) for c in out.completion_ids] == [8] * len(TEXTS) or any(out.finished or [])
    # bf16 decoding of an fp32 model: the first greedy token agrees with fp32 generate on most rows.
    ref = _hf_greedy(model, tok, _prompts(tok), 1, [tok.eos_token_id])
    assert sum(o[0] == r[0] for o, r in zip(out.completion_ids, ref, strict=True)) >= len(TEXTS) - 1


# ------------------------------------------------------------------------------------------ fused decode path
#
# Llama-family decoders decode through `_fused_decoder_layer` (one pure function of tensors per layer) instead of
# the HF modules. These tests hold it to the HF layer, to HF generate and to the trainer's recomputation, and check
# that it compiles as one graph for all layers.

def _tiny_lm(arch: str, tok: Any, attn: str = "sdpa", **over: Any) -> Any:
    """An in-memory tiny causal LM of `arch`, with random (not unit / zero) norm weights and biases so a wrong
    norm weight, a dropped bias or a swapped q/k norm changes the output."""
    common: dict[str, Any] = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=False, initializer_range=0.1,
    )
    common.update(over)
    if arch == "qwen2":
        cfg: Any = transformers.Qwen2Config(**common)
    elif arch == "llama3-rope":
        # original_max_position_embeddings=16 puts most of the 8 rotary frequencies in the rescaled band.
        cfg = transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=16)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**{"sliding_window": None, **common})
    elif arch == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif arch == "gemma":
        cfg = transformers.GemmaConfig(**common, head_dim=16)
    else:
        raise ValueError(arch)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "norm" in name:
                prm.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                prm.normal_(0.0, 0.5)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


FUSED_ARCHS = ["qwen2", "llama3-rope", "qwen3", "mistral"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_fused_path_is_selected_for_the_llama_family(arch: str, tok: Any) -> None:
    backend = FastGenerateBackend(_tiny_lm(arch, tok), tok)
    assert backend.decode_path == "fused"  # CPU: compiling is off by default
    assert backend.fused_unsupported_reason is None
    assert FastGenerateBackend(_tiny_lm(arch, tok), tok, decode_impl="modules").decode_path == "modules"


@pytest.mark.parametrize(("arch", "over", "why"), [
    ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("llama", {"attention_bias": True}, "o_proj"),
    ("llama", {"mlp_bias": True}, "MLP projections"),
    ("mistral", {"sliding_window": 4096}, "sliding window"),
    ("gemma", {}, "model_type 'gemma'"),
])
def test_unsupported_models_keep_the_modules_path(arch: str, over: dict[str, Any], why: str, tok: Any) -> None:
    model = _tiny_lm(arch, tok, **over)
    backend = FastGenerateBackend(model, tok)
    assert backend.decode_path == "modules"
    assert backend.fused_unsupported_reason is not None and why in backend.fused_unsupported_reason
    with pytest.raises(ValueError, match="decode_impl='fused' cannot run this model"):
        FastGenerateBackend(model, tok, decode_impl="fused")


def test_wrapped_projections_keep_the_modules_path(tok: Any) -> None:
    """A LoRA-style wrapper (or a quantized nn.Linear subclass) computes more than F.linear of its weight."""

    class Scaled(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = _tiny_lm("qwen2", tok)
    attn = model.model.layers[1].self_attn
    wrapped = Scaled(attn.v_proj.in_features, attn.v_proj.out_features)
    wrapped.load_state_dict(attn.v_proj.state_dict())
    attn.v_proj = wrapped
    backend = FastGenerateBackend(model, tok)
    assert backend.decode_path == "modules"
    assert "v_proj" in (backend.fused_unsupported_reason or "")


class _CatCache:
    """The simplest cache an HF attention layer accepts: concatenate and return everything."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *a: Any, **kw: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
        return self.k, self.v


def _decode_inputs(model: Any, seed: int = 0) -> dict[str, Any]:
    """A left-padded decode step: 3 rows with 0, 2 and 4 padding columns before 5 cached columns."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    b, past, cap = 3, 5, 8
    head_dim = model.model.layers[0].self_attn.head_dim
    kv = cfg.num_key_value_heads
    pads = torch.tensor([0, 2, 4])
    valid = torch.arange(past + 1)[None, :] >= pads[:, None]  # (b, past + 1); the last column is this step
    mask = torch.zeros(b, 1, 1, past + 1).masked_fill(~valid[:, None, None, :], torch.finfo(torch.float32).min)
    pos = (past - pads)[:, None]  # real tokens before this one
    hidden = torch.randn(b, 1, cfg.hidden_size, generator=g)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(hidden, pos)
    return dict(hidden=hidden, mask=mask, pos=pos, cos=cos, sin=sin, past=past, cap=cap,
                past_k=torch.randn(b, kv, past, head_dim, generator=g),
                past_v=torch.randn(b, kv, past, head_dim, generator=g))


def _fused_layer_call(model: Any, layer_idx: int, x: dict[str, Any], fn: Any = None,
                      cos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from launchgen.trainers.generation.fast_generate.fused import (
        _fused_decoder_layer,
        _fused_spec,
        _layer_weights,
    )

    spec = _fused_spec(model.model, model.lm_head, model.config, torch.device("cpu"))
    assert not isinstance(spec, str), spec
    b, kv, past, d = x["past_k"].shape
    k_cache = torch.zeros(b, kv, x["cap"], d)
    v_cache = torch.zeros(b, kv, x["cap"], d)
    k_cache[:, :, :past] = x["past_k"]
    v_cache[:, :, :past] = x["past_v"]
    with torch.no_grad():
        out = (fn or _fused_decoder_layer)(
            x["hidden"], _layer_weights(model.model.layers[layer_idx]), k_cache, v_cache, torch.tensor([past]),
            x["mask"], x["cos"] if cos is None else cos, x["sin"], spec.eps, spec.scaling)
    return out, k_cache, v_cache


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_fused_layer_matches_the_hf_decoder_layer(arch: str, tok: Any) -> None:
    """One left-padded decode step through layer 1, against HF's own layer with eager (repeat_kv) attention."""
    model = _tiny_lm(arch, tok, attn="eager")
    x = _decode_inputs(model)
    cache = _CatCache(x["past_k"], x["past_v"])
    with torch.no_grad():
        ref = model.model.layers[1](x["hidden"], attention_mask=x["mask"], position_ids=x["pos"],
                                    past_key_values=cache, use_cache=True, position_embeddings=(x["cos"], x["sin"]))
    ref = ref[0] if isinstance(ref, tuple) else ref
    out, k_cache, v_cache = _fused_layer_call(model, 1, x)
    past = x["past"]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_cache[:, :, : past + 1], cache.k, atol=1e-5, rtol=1e-5)  # rotated K written
    torch.testing.assert_close(v_cache[:, :, : past + 1], cache.v, atol=1e-5, rtol=1e-5)
    assert not k_cache[:, :, past + 1 :].any()  # nothing beyond this step's column
    # The comparison is sharp enough to see RoPE one position off.
    shifted, _ = model.model.rotary_emb(x["hidden"], x["pos"] + 1)
    off, _, _ = _fused_layer_call(model, 1, x, cos=shifted)
    assert (off - ref).abs().max() > 1e-4


def test_llama3_rope_scaling_is_in_effect(tok: Any) -> None:
    """The llama3 case above only tests scaling if the model's rotary frequencies differ from the default ones."""
    scaled = _tiny_lm("llama3-rope", tok).model.rotary_emb.inv_freq
    plain = _tiny_lm("llama", tok).model.rotary_emb.inv_freq
    assert scaled.shape == plain.shape and not torch.allclose(scaled, plain)


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_fused_greedy_matches_generate_and_logprobs_match_recomputation(arch: str, tok: Any) -> None:
    model = _tiny_lm(arch, tok)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok)
    assert backend.decode_path == "fused"
    out = backend.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0))
    want = _hf_greedy(model, tok, prompts, 16, [tok.eos_token_id])
    assert out.completion_ids == want
    assert len({tuple(c) for c in want}) > 1, "degenerate model: every row generated the same tokens"

    rows = [p for p in prompts for _ in range(2)]
    sampled = backend.generate(rows, SamplingParams(max_tokens=12, temperature=0.8, extra={"seed": 5}))
    assert sampled.logprobs is not None
    ref = _recompute_logprobs(model, tok, rows, sampled.completion_ids, 0.8)
    for got, exp in zip(sampled.logprobs, ref, strict=True):
        assert got == pytest.approx(exp, abs=2e-5)


def test_fused_and_modules_paths_agree_bitwise_on_cpu(qwen: tuple[Any, Any]) -> None:
    """Uncompiled, the fused layer issues the modules' ops in the modules' order: the same bits come out."""
    model, tok = qwen
    rows = [p for p in _prompts(tok) for _ in range(2)]
    params = SamplingParams(max_tokens=12, temperature=1.0, extra={"seed": 2})
    fused = FastGenerateBackend(model, tok, decode_impl="fused").generate(rows, params)
    modules = FastGenerateBackend(model, tok, decode_impl="modules").generate(rows, params)
    assert fused.completion_ids == modules.completion_ids
    assert fused.logprobs == modules.logprobs


def test_fused_layer_compiles_to_one_graph_for_every_layer(tok: Any) -> None:
    """fullgraph=True fails on any graph break; the counter shows that layer 1 reuses layer 0's graph (no guard
    on a layer index or module) and that a new mask length is the only thing that recompiles."""
    from launchgen.trainers.generation.fast_generate.fused import _fused_decoder_layer
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = _tiny_lm("qwen3", tok)  # q_norm/k_norm and GQA: the richest variant
    x = _decode_inputs(model)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_fused_decoder_layer, backend=counter, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        for layer in (0, 1):
            got = _fused_layer_call(model, layer, x, fn=compiled)
            want = _fused_layer_call(model, layer, x)
            for g, w in zip(got, want, strict=True):  # output and both caches, written in place
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
        assert counter.frame_count == 1
        longer = dict(x, mask=torch.cat([x["mask"], x["mask"][..., -1:]], -1))  # attend to one more column
        _fused_layer_call(model, 0, longer, fn=compiled)
    assert counter.frame_count == 2


def test_compiled_backend_matches_and_falls_back_on_compile_errors(qwen: tuple[Any, Any],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    model, tok = qwen
    prompts = _prompts(tok)
    want = _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = FastGenerateBackend(model, tok, compile=True, compile_backend=counter, length_bucket=8)
    assert compiled.decode_path == "fused+compiled"
    assert compiled.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0)).completion_ids == want
    assert compiled.decode_path == "fused+compiled"
    # Without graphs too, a compiled decode reads whole buckets: one layer graph per bucket plus the LM-head graph,
    # not one per step.
    plen = max(len(p) for p in prompts)
    buckets = {(col // 8 + 1) * 8 for col in range(plen, plen + 9)}
    assert counter.frame_count == len(buckets) + 1

    def broken(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("inductor exploded")

    failing = FastGenerateBackend(model, tok, compile=True, compile_backend=broken)
    assert failing.decode_path == "fused+compiled"
    with caplog.at_level("WARNING", logger="launchgen.trainers.generation.fast_generate"):
        out = failing.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0))
    assert out.completion_ids == want
    assert failing.decode_path == "fused"
    assert sum("torch.compile of the fused decode failed" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("keep", [True, False, "lend"])
def test_keep_cache_false_releases_everything_between_calls(keep: Any, qwen: tuple[Any, Any]) -> None:
    model, tok = qwen
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok, keep_cache=keep)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    first = backend.generate(prompts, params)
    cache_held = any(k is not None for k in backend.cache.keys + backend.cache.values)
    assert cache_held is (keep is True)
    assert (backend.held_bytes() > 0) is (keep is True)
    assert (backend.state is not None) is (keep is not False)  # "lend" keeps the state and its graphs
    assert backend.generate(prompts, params).completion_ids == first.completion_ids
    assert first.completion_ids == _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])


def test_a_lent_cache_comes_back_zeroed() -> None:
    """Lent memory is reused by training: whatever it holds then (NaN included) must not reach the next call,
    whose unwritten cache columns are read under the mask."""
    from launchgen.trainers.generation.fast_generate.state import _Arena

    arena = _Arena([(2, 3), (5,)], torch.float32, torch.device("cpu"))
    for t in arena.take():
        t.fill_(float("nan"))
    assert arena.buf is not None and bool(arena.buf.isnan().any())
    arena.give_back()
    assert arena.buf is None and arena.ptr == 0
    again = arena.take()
    assert [tuple(t.shape) for t in again] == [(2, 3), (5,)]
    assert all(int(t.count_nonzero()) == 0 for t in again)


def test_fused_path_reads_the_live_weights(tok: Any) -> None:
    """An in-place optimizer-style update between calls must show up in the next call's tokens."""
    model = _tiny_lm("qwen2", tok)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    before = backend.generate(prompts, params).completion_ids
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(-3.0)
            layer.self_attn.k_proj.bias.add_(1.0)
    after = backend.generate(prompts, params).completion_ids
    assert after != before
    assert after == _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_stacked_projections_decode_like_separate_ones_and_follow_weight_updates(arch: str, tok: Any) -> None:
    """q/k/v and gate/up as one GEMM each over stacked copies (the default): the same tokens and log-probs as the
    separate projections, and the copies are refreshed from the live weights at every call."""
    model = _tiny_lm(arch, tok)
    prompts = _prompts(tok)
    stacked = FastGenerateBackend(model, tok, keep_cache=True)
    separate = FastGenerateBackend(model, tok, keep_cache=True, stack_projections=False)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    rows = [p for p in prompts for _ in range(2)]
    sampled = SamplingParams(max_tokens=12, temperature=1.0, extra={"seed": 4})
    for _ in range(2):
        got = stacked.generate(rows, sampled)
        want = separate.generate(rows, sampled)
        assert got.completion_ids == want.completion_ids
        assert got.logprobs is not None and want.logprobs is not None
        for g, w in zip(got.logprobs, want.logprobs, strict=True):
            assert g == pytest.approx(w, abs=1e-5)
        assert stacked.generate(prompts, greedy).completion_ids == _hf_greedy(model, tok, prompts, 12,
                                                                             [tok.eos_token_id])
        # The copies hold the live weights, stacked in q, k, v (gate, up) order, biases alike.
        w0 = stacked._weights[1]
        attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
        assert w0.qkv_weight is not None and w0.gate_up_weight is not None
        assert torch.equal(w0.qkv_weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert torch.equal(w0.gate_up_weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        if arch == "qwen2":
            assert w0.qkv_bias is not None
            assert torch.equal(w0.qkv_bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        before = stacked.generate(prompts, greedy).completion_ids
        with torch.no_grad():  # an optimizer-style in-place update of stacked projections only
            for layer in model.model.layers:
                layer.self_attn.v_proj.weight.mul_(-2.0)
                layer.mlp.up_proj.weight.mul_(1.5)
        assert stacked.generate(prompts, greedy).completion_ids != before
    assert separate._weights[0].qkv_weight is None


@pytest.mark.parametrize("compiled", [False, True])
def test_flex_decode_attention_decodes_like_sdpa(qwen: tuple[Any, Any], compiled: bool) -> None:
    """`decode_attention="flex"` (FlexAttention over the cache, the additive padding mask as a score
    modification): the same greedy tokens as the default and as eager `generate`, sampled log-probs within fp32
    rounding, with prompts of different lengths (left padding masked), eagerly and compiled."""
    model, tok = qwen
    prompts = _prompts(tok)
    kw: dict[str, Any] = {"compile": True, "compile_backend": "aot_eager"} if compiled else {"compile": False}
    torch._dynamo.reset()
    flex = FastGenerateBackend(model, tok, decode_attention="flex", length_bucket=8, **kw)
    sdpa = FastGenerateBackend(model, tok, length_bucket=8, **kw)
    assert flex.decode_path == sdpa.decode_path == ("fused+compiled" if compiled else "fused")
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    assert flex.generate(prompts, greedy).completion_ids == _hf_greedy(model, tok, prompts, 12, [tok.eos_token_id])
    sampled = SamplingParams(max_tokens=12, temperature=1.0, extra={"seed": 3})
    got, want = flex.generate(prompts, sampled), sdpa.generate(prompts, sampled)
    assert got.completion_ids == want.completion_ids
    assert got.logprobs is not None and want.logprobs is not None
    for g, w in zip(got.logprobs, want.logprobs, strict=True):
        assert g == pytest.approx(w, abs=1e-4)
    assert flex.decode_path == sdpa.decode_path  # no fallback from a failed compile
