"""Per-token log-probs and entropies of `hidden @ W.T` without the (tokens x vocab) logits, with its own backward.

The forward walks token tiles over the whole vocabulary and keeps three numbers per token (log-prob, entropy,
log-sum-exp). The backward recomputes the logits tile by tile, vocabulary block outermost, so the LM head's weight
gradient is summed in an fp32 block accumulator over all tokens and rounded to the weight's dtype once per block:

* against activation checkpointing of a plain chunk (the previous design) it saves the separate recompute-forward
  pass and its fp32 temporaries, and it never holds a whole-vocabulary weight-gradient per chunk (272 MB each at
  Qwen2.5's 151,936 x 896) that autograd then adds into `.grad`;
* against per-chunk bf16 accumulation it avoids rounding every chunk's contribution to bf16 before summing, which
  loses the small per-token terms when a vocabulary row collects gradient from many chunks.

Mixed precision follows the caller's autocast: the GEMMs run in the autocast dtype when autocast is on (accelerate's
fp32-master-weights mode), otherwise in the weights' dtype; softmax statistics are always fp32. The elementwise work
of each tile goes through `tile_fns(compiled)`: plain torch, or one torch.compile'd kernel per direction.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from launchgen.trainers.dynamo_config import recompile_limit_name

#: Vocabulary rows per backward block: large enough for efficient GEMMs, small enough for an fp32 accumulator.
VOCAB_BLOCK = 16384


def _forward_tile(z: torch.Tensor, targets: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    zf = z.float() * inv_t
    lse = torch.logsumexp(zf, dim=-1)
    logp_all = zf - lse.unsqueeze(-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # -sum p log p, not lse - sum p z: the difference form cancels badly for peaked distributions.
    entropy = -(torch.exp(logp_all) * logp_all).sum(-1)
    return logp, entropy, lse


def _backward_tile(z: torch.Tensor, local_targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor,
                   inv_t: float) -> torch.Tensor:
    """d(sum_t g_t * logp_t)/dz for one (tokens x vocab-block) tile: g * inv_t * (onehot - p), in z's dtype.

    `local_targets` are the targets minus the block's first row; values outside [0, block) hit no column.
    """
    p = torch.exp(z.float() * inv_t - lse.unsqueeze(-1))
    cols = torch.arange(z.shape[-1], device=z.device)
    onehot = (cols.unsqueeze(0) == local_targets.unsqueeze(-1)).to(p.dtype)
    return ((onehot - p) * (grad * inv_t).unsqueeze(-1)).to(z.dtype)


@functools.cache
def tile_fns(compiled: bool, backend: str = "inductor") -> tuple[Any, Any]:
    if not compiled:
        return _forward_tile, _backward_tile
    recompile_limit_name()  # un-hide the limit dynamo reads on every compile
    return (torch.compile(_forward_tile, dynamic=None, backend=backend),
            torch.compile(_backward_tile, dynamic=None, backend=backend))


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    dev = t.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else t.dtype


class ChunkedLogps(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (log-probs [N], entropies [N]), both fp32.

    Entropies are returned without gradient (they are logged, never optimised).
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, inv_t: float, tile_elements: int, compiled: bool, backend: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
        cd = _compute_dtype(hidden)
        n, vocab = hidden.shape[0], weight.shape[0]
        fwd, _ = tile_fns(compiled, backend)
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        step = max(1, tile_elements // max(1, vocab))
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cd)
            b = bias.to(cd) if bias is not None else None
            for s in range(0, n, step):
                z = F.linear(hidden[s : s + step].to(cd), w, b)
                lp, en, lz = fwd(z, targets[s : s + step], inv_t)
                logp[s : s + step] = lp
                entropy[s : s + step] = en
                lse[s : s + step] = lz
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.inv_t, ctx.tile_elements, ctx.compiled, ctx.backend, ctx.cd = inv_t, tile_elements, compiled, backend, cd
        ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logp is None or not (need_h or need_w or need_b):
            return None, None, None, None, None, None, None, None
        cd: torch.dtype = ctx.cd
        _, bwd = tile_fns(ctx.compiled, ctx.backend)
        n, vocab = hidden.shape[0], weight.shape[0]
        g = grad_logp.float().contiguous()
        vb = max(1, min(vocab, VOCAB_BLOCK, ctx.tile_elements))
        step = max(1, ctx.tile_elements // vb)
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b and bias is not None else None
        with torch.autocast(hidden.device.type, enabled=False):
            for v0 in range(0, vocab, vb):
                w_blk = weight[v0 : v0 + vb].to(cd)
                b_blk = bias[v0 : v0 + vb].to(cd) if bias is not None else None
                acc_w = torch.zeros(w_blk.shape, dtype=torch.float32, device=weight.device) if need_w else None
                acc_b = torch.zeros(w_blk.shape[0], dtype=torch.float32, device=weight.device) if grad_b is not None else None
                for s in range(0, n, step):
                    h_t = hidden[s : s + step].to(cd)
                    z = F.linear(h_t, w_blk, b_blk)
                    gz = bwd(z, targets[s : s + step] - v0, lse[s : s + step], g[s : s + step], ctx.inv_t)
                    if grad_h is not None:
                        _addmm_fp32(grad_h[s : s + step], gz, w_blk)
                    if acc_w is not None:
                        _addmm_fp32(acc_w, gz.t(), h_t)
                    if acc_b is not None:
                        acc_b += gz.float().sum(0)
                if grad_w is not None and acc_w is not None:
                    grad_w[v0 : v0 + vb] = acc_w
                if grad_b is not None and acc_b is not None:
                    grad_b[v0 : v0 + vb] = acc_b
        gh = grad_h.to(hidden.dtype) if grad_h is not None else None
        return gh, grad_w, grad_b, None, None, None, None, None


def _addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc in fp32 and a/b in the compute dtype, without rounding the product to a/b's dtype
    where the device can (CUDA cuBLAS with an fp32 output); elsewhere the product is rounded once per tile."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif acc.device.type == "cuda":
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc += (a @ b).float()


def chunked_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  temperature: float, tile_elements: int, compiled: bool = False, backend: str = "inductor"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of `targets` under softmax(hidden @ weight.T / temperature); any leading shape."""
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    logp, ent = ChunkedLogps.apply(h, weight, bias, t, 1.0 / temperature, tile_elements, compiled, backend)
    return logp.reshape(lead), ent.reshape(lead)
