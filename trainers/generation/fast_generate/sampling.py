"""Sampling on the device: the sampler's key from the request's parameters, and one token per row with its log-prob.

Kept apart from the backend so the decode loop and its graphs call one pure function of tensors (graph-capturable:
no host sync, no Python state).
"""

from __future__ import annotations

import math

import torch

from ..protocol import SamplingParams
from .state import _SamplerKey


def sampler_key(p: SamplingParams) -> _SamplerKey:
    greedy = p.temperature <= 0.0 or p.top_k == 1 or bool(p.extra.get("greedy", False))
    return _SamplerKey(
        greedy=greedy,
        temperature=1.0 if p.temperature <= 0.0 else float(p.temperature),
        top_k=int(p.top_k),
        top_p=float(p.top_p),
        min_p=float(p.min_p),
        repetition_penalty=float(p.repetition_penalty),
    )


def sample(logits: torch.Tensor, key: _SamplerKey, seen: torch.Tensor | None, vocab: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and its log-prob under log_softmax(logits * (1/T)); all on the device."""
    # Multiply by 1/T (not divide by T): the trainer's recomputation does this, so the values match bitwise.
    scaled = logits * (1.0 / key.temperature)
    logp = torch.log_softmax(scaled, dim=-1)
    work = scaled
    filtered = False
    if key.repetition_penalty != 1.0 and seen is not None:
        # HF's penalty acts on raw logits (every token id seen so far, prompt padding included); scaling both
        # branches by 1/T commutes with it.
        pen = torch.where(work < 0, work * key.repetition_penalty, work / key.repetition_penalty)
        work = torch.where(seen, pen, work)
        filtered = True
    if key.greedy:
        tok = torch.argmax(work, dim=-1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1)
    if 0 < key.top_k < vocab:
        kth = torch.topk(work, key.top_k, dim=-1).values[:, -1:]
        work = work.masked_fill(work < kth, -math.inf)
        filtered = True
    if key.top_p < 1.0:
        srt, idx = torch.sort(work, dim=-1, descending=True)
        cum = torch.softmax(srt, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(srt, dim=-1)) > key.top_p  # keeps the token that crosses p
        drop = torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)
        work = work.masked_fill(drop, -math.inf)
        filtered = True
    if key.min_p > 0.0:
        probs = torch.softmax(work, dim=-1)
        thresh = probs.amax(dim=-1, keepdim=True) * key.min_p
        work = work.masked_fill(probs < thresh, -math.inf)
        filtered = True
    probs = torch.softmax(work, dim=-1) if filtered else logp.exp()
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) is an exact draw from p (no host sync, graphable).
    race = torch.empty_like(probs).exponential_().clamp_min_(1e-20)
    tok = torch.argmax(probs / race, dim=-1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)
