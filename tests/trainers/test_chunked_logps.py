"""`chunked_logps`: the LM-head log-prob function with its own backward, against full-logits autograd."""

from __future__ import annotations

import pytest
import torch
from launchgen.trainers import chunked_logps as cl


def _reference(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor, temp: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.nn.functional.linear(h, w, b).float() / temp
    logp_all = torch.log_softmax(z, -1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1), ent.detach()


def _inputs(n: int = 37, hdim: int = 16, vocab: int = 53, bias: bool = True, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hdim, generator=g, requires_grad=True)
    w = torch.randn(vocab, hdim, generator=g, requires_grad=True)
    b = torch.randn(vocab, generator=g, requires_grad=True) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g)
    return h, w, b, t


def _grads(lp: torch.Tensor, tensors: list[torch.Tensor | None], seed: int = 3) -> list[torch.Tensor | None]:
    coef = torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed))
    live = [x for x in tensors if x is not None]
    gs = iter(torch.autograd.grad((lp * coef).sum(), live))
    return [next(gs) if x is not None else None for x in tensors]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tile_elements,vocab_block", [(10**9, 16384), (60, 8), (53, 53), (1, 1)])
def test_matches_full_logits_values_and_gradients(monkeypatch: pytest.MonkeyPatch, bias: bool, tile_elements: int,
                                                  vocab_block: int) -> None:
    # Small tiles and blocks: several token tiles, several vocabulary blocks, targets in every block.
    monkeypatch.setattr(cl, "VOCAB_BLOCK", vocab_block)
    h, w, b, t = _inputs(bias=bias)
    lp, ent = cl.chunked_logps(h, w, b, t, 0.7, tile_elements)
    ref_lp, ref_ent = _reference(h, w, b, t, 0.7)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert not ent.requires_grad
    got = _grads(lp, [h, w, b])
    want = _grads(ref_lp, [h, w, b])
    for a, e in zip(got, want, strict=True):
        if e is None:
            assert a is None
        else:
            assert a is not None
            # float32 sums of tile-sized pieces: the error scales with the gradient's size (up to ~9 here;
            # against float64 the head is within 2e-6 of it relative, autograd within 4e-7)
            scale = max(1.0, e.abs().max().item())
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5 * scale)


def test_leading_shape_and_no_grad_path() -> None:
    h, w, b, t = _inputs(n=24)
    lp, ent = cl.chunked_logps(h.reshape(4, 6, -1), w, b, t.reshape(4, 6), 1.0, 64)
    assert lp.shape == ent.shape == (4, 6)
    with torch.no_grad():
        lp2, _ = cl.chunked_logps(h.reshape(4, 6, -1), w, b, t.reshape(4, 6), 1.0, 64)
    torch.testing.assert_close(lp2, lp.detach())
    assert not lp2.requires_grad


def test_bf16_autocast_uses_the_autocast_dtype_and_stays_close() -> None:
    h, w, b, t = _inputs(n=40, hdim=32, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = cl.chunked_logps(h, w, b, t, 1.0, 512)
        ref_lp, _ = _reference(h, w, b, t, 1.0)  # autocast's linear is bf16 here too
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=2e-2)
    g_got = _grads(lp, [h, w])
    g_ref = _grads(ref_lp, [h, w])
    for a, e in zip(g_got, g_ref, strict=True):
        assert a is not None and e is not None
        assert a.dtype == torch.float32  # gradients come back in the parameters' dtype
        assert float((a - e).norm() / e.norm()) < 2e-2


def test_compiled_tiles_trace_and_match() -> None:
    h, w, b, t = _inputs()
    lp, ent = cl.chunked_logps(h, w, b, t, 0.9, 100, compiled=True, backend="aot_eager")
    ref_lp, ref_ent = _reference(h, w, b, t, 0.9)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    for a, e in zip(_grads(lp, [h, w, b]), _grads(ref_lp, [h, w, b]), strict=True):
        assert a is not None and e is not None
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
