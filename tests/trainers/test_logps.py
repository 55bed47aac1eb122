"""Per-token log-probs (TRL semantics, chunked head) and the plain-generate backend's sampled log-probs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from launchgen.trainers import modeling
from launchgen.trainers.generation.hf_generate import HFGenerateBackend
from launchgen.trainers.generation.protocol import SamplingParams


@pytest.fixture()
def model_and_tok(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    modeling.install_logp_head(model)
    return model, tok


def _batch():
    pid = torch.tensor([[0, 0, 11, 12], [21, 22, 23, 24]])
    pmask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    cid = torch.tensor([[31, 32, 3], [41, 42, 43]])
    cmask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return pid, pmask, cid, cmask


def _reference(model, pid, pmask, cid, cmask, T):
    # Independent formulation: full logits, no position_ids, logits * (1/T), fp32 log-softmax, masked -> 0.
    ids = torch.cat([pid, cid], 1)
    am = torch.cat([pmask, cmask], 1)
    logits = model(input_ids=ids, attention_mask=am).logits  # head in normal mode outside logp_mode
    p = pid.size(1)
    z = logits[:, p - 1 : -1].float() * (1.0 / T)
    lp = torch.log_softmax(z, -1).gather(-1, cid.unsqueeze(-1)).squeeze(-1)
    return lp * cmask


@pytest.mark.parametrize("fused,compiled", [(True, True), (True, False), (False, True)],
                         ids=["own-backward", "checkpointed", "checkpointed-compiled"])
@pytest.mark.parametrize("chunk_elements", [modeling.LOGITS_CHUNK_ELEMENTS, 1])
def test_logps_match_full_logits_and_grads(model_and_tok, monkeypatch, chunk_elements: int, fused: bool,
                                           compiled: bool) -> None:
    model, _ = model_and_tok
    # 1 -> one position per chunk
    monkeypatch.setattr(modeling.get_logp_head(model), "chunk_elements", chunk_elements)
    # The own-backward head runs with compiled tiles only (uncompiled, or with `fused` off for sharded weights, the
    # checkpointed chunks run); dynamo's "eager" backend traces without code generation.
    monkeypatch.setattr(modeling.get_logp_head(model), "fused", fused)
    monkeypatch.setattr(modeling.get_logp_head(model), "compiled", compiled)
    monkeypatch.setattr(modeling, "COMPILE_BACKEND", "eager")
    pid, pmask, cid, cmask = _batch()
    lp, ent = modeling.per_token_logps(model, pid, pmask, cid, cmask, temperature=0.7)
    ref = _reference(model, pid, pmask, cid, cmask, 0.7)
    assert torch.allclose(lp, ref, atol=1e-5)
    assert lp[0, 2].item() == 0.0 and ent[0, 2].item() == 0.0
    assert (ent[cmask.bool()] > 0).all()
    # gradients through the chunked, checkpointed head equal those of the plain computation
    model.zero_grad()
    lp.sum().backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _reference(model, pid, pmask, cid, cmask, 0.7).sum().backward()
    for a, p in zip(g1, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-5)


def test_no_position_ids_and_only_completion_logits(model_and_tok) -> None:
    # TRL passes only input_ids/attention_mask (RoPE positions 0..P+C-1 even with left padding) and keeps C+1
    # positions of hidden states for the head.
    model, _ = model_and_tok
    seen: dict[str, object] = {}

    def pre(mod, args, kwargs):
        seen.update(kwargs)

    def head_pre(mod, args):
        seen["head_width"] = args[0].shape[1]

    h1 = model.model.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = model.lm_head.register_forward_pre_hook(head_pre)
    try:
        pid, pmask, cid, cmask = _batch()
        modeling.per_token_logps(model, pid, pmask, cid, cmask, 1.0)
    finally:
        h1.remove()
        h2.remove()
    assert seen.get("position_ids") is None
    assert seen["head_width"] == cid.size(1) + 1


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=5, temperature=0.7), SamplingParams(max_tokens=5, top_k=7, top_p=0.9)])
def test_hf_backend_logprobs_are_processed_sampling_logprobs(model_and_tok, params: SamplingParams) -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    model, tok = model_and_tok
    be = HFGenerateBackend(model, tok.pad_token_id, [tok.eos_token_id])
    prompts = [tok("What is 2 + 3?")["input_ids"], tok("hi")["input_ids"]]
    torch.manual_seed(0)
    out = be.generate(prompts, params)
    assert len(out.completion_ids) == 2 and out.finished is not None and out.logprobs is not None
    for p, c, lps, fin in zip(prompts, out.completion_ids, out.logprobs, out.finished, strict=True):
        assert len(c) == len(lps) and 1 <= len(c) <= 5
        assert fin == (c[-1] == tok.eos_token_id)
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float()
        for t in range(len(c)):
            z = logits[t : t + 1]
            z = TemperatureLogitsWarper(params.temperature)(ids, z) if params.temperature != 1.0 else z
            z = TopKLogitsWarper(params.top_k)(ids, z) if params.top_k else z
            z = TopPLogitsWarper(params.top_p)(ids, z) if params.top_p < 1 else z
            expected = torch.log_softmax(z, -1)[0, c[t]].item()
            assert lps[t] == pytest.approx(expected, abs=1e-4)


def test_precision_and_liger_errors(monkeypatch) -> None:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.errors import TrainerSetupError

    cfg = TrainerConfig.model_validate(
        {"trainer": "grpo", "output_dir": "/tmp/x", "model": {"name_or_path": "m", "use_liger_kernel": True}, "data": {"path": "d.jsonl"}}
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(TrainerSetupError, match="bf16 needs an Ampere"):
        modeling.check_precision(cfg)
    # absent whether or not the [liger] extra is installed here: None in sys.modules makes the import fail
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    with pytest.raises(TrainerSetupError, match="liger-kernel is not installed"):
        modeling.make_liger_grpo_loss(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TrainerSetupError, match="needs a CUDA GPU"):
        modeling.check_liger_compatible(cfg)


def test_hub_kernel_offline_missing_is_a_clear_error(monkeypatch, tmp_path: Path) -> None:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.errors import TrainerSetupError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path / "k"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    cfg = TrainerConfig.model_validate(
        {"trainer": "grpo", "output_dir": "/tmp/x", "model": {"name_or_path": "m", "attn_implementation": "kernels-community/flash-attn2@v2"}, "data": {"path": "d.jsonl"}}
    )
    with pytest.raises(TrainerSetupError) as ei:
        modeling.prepare_attention(cfg)
    msg = str(ei.value)
    assert "kernels-community/flash-attn2@v2" in msg and "HF_HUB_OFFLINE" in msg and "sdpa" in msg


def test_flash_attention_without_package_is_explicit_error() -> None:
    import transformers  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.errors import TrainerSetupError
    from transformers.utils import import_utils

    if import_utils.is_flash_attn_2_available():
        pytest.skip("flash-attn is installed here")
    cfg = TrainerConfig.model_validate(
        {"trainer": "grpo", "output_dir": "/tmp/x", "data": {"path": "d.jsonl"},
         "model": {"name_or_path": "m", "attn_implementation": "flash_attention_2"}}
    )
    with pytest.raises(TrainerSetupError, match="kernels-community/flash-attn2@<rev>"):
        modeling.prepare_attention(cfg)
