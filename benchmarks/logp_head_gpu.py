"""The trainer's log-prob head on the GPU: own-backward `chunked_logps` against the checkpointed plain chunks.

    python benchmarks/logp_head_gpu.py                 # H200: config-2 shape (151,936 vocab, 896 hidden, bf16)
    python benchmarks/logp_head_gpu.py --tokens 512 --vocab 1000 --hidden 64   # CPU smoke test

For each variant: forward + backward time (median of 5 after 2 warm-ups) over `--tokens` tokens, peak memory above
the inputs, and, on a `--check-tokens` slice, the error of the log-probs and of the hidden/weight gradients against an
fp32 full-logits reference (relative L2), which shows what fp32 accumulation of the head's weight gradient buys.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


def reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, coef: torch.Tensor) -> tuple[Any, ...]:
    h32 = h.detach().float().requires_grad_(True)
    w32 = w.detach().float().requires_grad_(True)
    lp = torch.log_softmax(h32 @ w32.t(), -1).gather(-1, t[:, None]).squeeze(-1)
    (lp * coef).sum().backward()
    return lp.detach(), h32.grad, w32.grad


def checkpointed(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, tile: int, compiled: bool) -> torch.Tensor:
    from launchgen.trainers import modeling
    from torch.utils.checkpoint import checkpoint

    fn = modeling._chunk_fn(compiled)
    step = max(1, tile // w.shape[0])
    out = []
    for s in range(0, h.shape[0], step):
        lp, _ = checkpoint(fn, h[None, s : s + step], w, None, t[None, s : s + step], 1.0, use_reentrant=False)
        out.append(lp[0])
    return torch.cat(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64 * 1024)
    p.add_argument("--check-tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--tile-mib", type=int, default=256)
    a = p.parse_args()
    from launchgen.trainers.chunked_logps import chunked_logps

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    tile = a.tile_mib * 2**20 // 4
    g = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(a.vocab, a.hidden, device=dev, generator=g) * 0.02).to(dtype).requires_grad_(True)
    h_all = torch.randn(a.tokens, a.hidden, device=dev, generator=g).to(dtype).requires_grad_(True)
    t_all = torch.randint(0, a.vocab, (a.tokens,), device=dev, generator=g)
    coef = torch.randn(a.tokens, device=dev, generator=g)

    variants = {
        "own backward, eager tiles": lambda h, t: chunked_logps(h, w, None, t, 1.0, tile)[0],
        "own backward, compiled tiles": lambda h, t: chunked_logps(h, w, None, t, 1.0, tile, compiled=True)[0],
        "checkpointed chunks, eager": lambda h, t: checkpointed(h, w, t, tile, False),
        "checkpointed chunks, compiled": lambda h, t: checkpointed(h, w, t, tile, True),
    }
    n = min(a.check_tokens, a.tokens)
    ref_lp, ref_gh, ref_gw = reference(h_all[:n], w, t_all[:n], coef[:n])
    rows = []
    for name, fn in variants.items():
        try:
            h = h_all[:n].detach().requires_grad_(True)
            w.grad = None
            lp = fn(h, t_all[:n])
            (lp * coef[:n]).sum().backward()
            assert h.grad is not None and w.grad is not None
            err_lp = float((lp.detach().float() - ref_lp).abs().max())
            err_gh = float((h.grad.float() - ref_gh).norm() / ref_gh.norm())
            err_gw = float((w.grad.float() - ref_gw).norm() / ref_gw.norm())
            times = []
            for i in range(7):
                w.grad = None
                h = h_all.detach().requires_grad_(True)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                t0 = time.perf_counter()
                (fn(h, t_all) * coef).sum().backward()
                if cuda:
                    torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else 0.0
            rows.append(f"| {name} | {1e3 * statistics.median(times):.1f} | {peak:.2f} | {err_lp:.2e} | "
                        f"{err_gh:.2e} | {err_gw:.2e} |")
        except Exception as e:  # one failing variant must not hide the others
            rows.append(f"| {name} | ERROR {type(e).__name__}: {str(e)[:100]} |")
        print(rows[-1], flush=True)
    print(f"\ntokens {a.tokens}, vocab {a.vocab}, hidden {a.hidden}, {dtype}, tile {a.tile_mib} MiB fp32, "
          f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}")
    print("| variant | fwd+bwd ms | peak GiB over inputs | max abs err log-prob | rel L2 err grad hidden | "
          "rel L2 err grad weight |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
