"""LoRA (peft) through the static-cache engine: the fused decode reads each adapted projection's merged weight,
so the tokens and log-probs are the adapted model's (its own `generate` and the trainer's recomputation), before
and after optimizer steps move the adapters; variants that do not merge keep PEFT's modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft  # a [train] dependency: missing is a failure, not a skip
import pytest
import torch
import transformers
from launchgen.trainers.generation.fast_generate import FastGenerateBackend
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.lora import compute_in_input_dtype
from test_fast_generate import _hf_greedy, _prompts, _recompute_logprobs, _tiny_lm


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


def _adapted(tok: Any, arch: str = "qwen2", **lora: Any) -> Any:
    """A tiny LM with LoRA on every linear, as the trainer wraps it, and adapters far from their zero start so
    they change the tokens."""
    model = _tiny_lm(arch, tok)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM",
                          **lora)
    torch.manual_seed(3)
    wrapped = peft.get_peft_model(model, cfg)
    compute_in_input_dtype(wrapped.get_base_model())
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.3)
    return wrapped.eval()


def _adapter_steps(model: Any, tok: Any, steps: int = 3) -> None:
    """AdamW steps on the adapters (in place, as the trainer's optimizer does) towards some other tokens."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.05)
    ids = torch.tensor([_prompts(tok)[2]])
    model.train()
    for _ in range(steps):
        loss = -torch.log_softmax(model(input_ids=ids).logits, -1)[..., 7].mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.mark.parametrize("keep", [True, "lend", False])
def test_greedy_and_logprobs_are_the_adapted_models_before_and_after_optimizer_steps(tok: Any, keep: Any) -> None:
    model = _adapted(tok)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok, keep_cache=keep)
    assert backend.decode_path == "fused", backend.fused_unsupported_reason
    assert len(backend._adapted) == 2 * 7  # q k v o gate up down of both layers decode with merged weights
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    first = backend.generate(prompts, greedy).completion_ids
    assert first == _hf_greedy(model, tok, prompts, 12, [tok.eos_token_id])
    with model.disable_adapter():
        assert first != _hf_greedy(model, tok, prompts, 12, [tok.eos_token_id])  # the adapters matter here

    _adapter_steps(model, tok)
    after = backend.generate(prompts, greedy).completion_ids
    assert after != first
    assert after == _hf_greedy(model, tok, prompts, 12, [tok.eos_token_id])
    sampled = [p for p in prompts for _ in range(2)]
    out = backend.generate(sampled, SamplingParams(max_tokens=16, temperature=0.8, logprobs=True, extra={"seed": 2}))
    assert out.logprobs is not None
    ref = _recompute_logprobs(model, tok, sampled, out.completion_ids, 0.8)
    for got, want in zip(out.logprobs, ref, strict=True):
        assert got == pytest.approx(want, abs=5e-5)
    # The trainer's own weights are untouched: the merge is a copy.
    base = model.get_base_model().model.layers[0].self_attn.q_proj
    assert not torch.equal(base.get_base_layer().weight, backend._merged[id(base)]) if keep is True else True


def test_merged_weights_are_peft_merge_bit_for_bit(tok: Any) -> None:
    import copy

    model = _adapted(tok)
    backend = FastGenerateBackend(model, tok, keep_cache=True)
    backend.generate(_prompts(tok), SamplingParams(max_tokens=2, temperature=0.0))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    layers = model.get_base_model().model.layers
    for i, layer in enumerate(layers):
        for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
            m = layer.get_submodule(name)
            assert torch.equal(backend._merged[id(m)], want[f"model.layers.{i}.{name}.weight"])


def test_disabled_adapters_decode_the_base_model(tok: Any) -> None:
    model = _adapted(tok)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok)
    with model.disable_adapter():
        got = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0)).completion_ids
        assert got == _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])


def test_dora_keeps_peft_modules_and_stays_exact(tok: Any) -> None:
    model = _adapted(tok, use_dora=True)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok)
    assert backend.decode_path == "modules"
    assert "not a plain nn.Linear" in (backend.fused_unsupported_reason or "")
    got = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0)).completion_ids
    assert got == _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])


def test_compiled_fused_decode_with_merged_weights(tok: Any) -> None:
    model = _adapted(tok)
    prompts = _prompts(tok)
    backend = FastGenerateBackend(model, tok, compile=True, compile_backend="aot_eager")
    assert backend.decode_path == "fused+compiled"
    got = backend.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0)).completion_ids
    assert got == _hf_greedy(model, tok, prompts, 10, [tok.eos_token_id])
    assert backend.decode_path == "fused+compiled"  # no compile error fell back to the eager fused function
