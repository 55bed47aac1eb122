"""FastGenerateBackend on CPU: the same tokens as eager `generate`, and log-probs the trainer would recompute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from launchgen.trainers.generation.fast_generate import FastGenerateBackend  # noqa: E402
from launchgen.trainers.generation.protocol import GenerationBackend, SamplingParams  # noqa: E402

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
    from launchgen.trainers.generation.fast_generate import _gqa_sdpa

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
    modeling = pytest.importorskip("launchgen.trainers.modeling")
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
    from launchgen.trainers.config import TrainerConfig

    model, tok = qwen
    cfg = TrainerConfig.model_validate(
        {"trainer": "grpo", "output_dir": "unused", "model": {"name_or_path": str(tiny_model_dir)},
         "data": {"path": "unused.jsonl"}}
    )
    backend = FastGenerateBackend.from_config(cfg, None, model, tok)
    prompts = _prompts(tok)
    out = backend.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    assert out.completion_ids == _hf_greedy(model, tok, prompts, 6, [tok.eos_token_id])
    backend.close()
    backend.close()  # the protocol allows a second close


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
    backend = FastGenerateBackend(model, tok, _Acc())
    assert backend.amp_dtype == torch.bfloat16
    out = backend.generate(_prompts(tok), SamplingParams(max_tokens=8, temperature=0.0))
    assert backend.cache.keys[0] is not None and backend.cache.keys[0].dtype == torch.bfloat16
    assert [len(c) for c in out.completion_ids] == [8] * len(TEXTS) or any(out.finished or [])
    # bf16 decoding of an fp32 model: the first greedy token agrees with fp32 generate on most rows.
    ref = _hf_greedy(model, tok, _prompts(tok), 1, [tok.eos_token_id])
    assert sum(o[0] == r[0] for o, r in zip(out.completion_ids, ref, strict=True)) >= len(TEXTS) - 1
