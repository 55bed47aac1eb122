"""SFT loss: Liger's fused linear cross entropy vs the chunked log-prob head, values and gradients (CUDA + liger-kernel).

    pip install 'liger-kernel>=0.8.2'   # into the GPU environment, next to launchgen[train]
    python benchmarks/sft_liger_parity.py [--dtype bfloat16] [--autocast]

Builds a small random Qwen2 (launchgen.trainers.tiny) on the GPU and computes
`launchgen.trainers.supervised.sequence_nll` on one padded batch with a partial loss mask both ways (the Liger path
is what `use_liger_kernel: true` runs for sft). `--autocast` loads fp32 weights and runs under bf16 autocast (the
`model.dtype: auto` + `precision: bf16` setting); otherwise the weights are in `--dtype`. Prints the loss difference
and the relative L2 error of all gradients; PASS when loss rel <= 2e-2 and gradient rel <= 3e-2 (bf16), exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from typing import Any

import torch

CUDA: Any = "cuda"  # Any: transformers' typing of PreTrainedModel.to rejects a plain str


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--autocast", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=96)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("FAIL: needs a CUDA GPU")
        return 1

    from launchgen.trainers import modeling
    from launchgen.trainers.supervised import make_liger_ce_loss, sequence_nll
    from launchgen.trainers.tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    dtype: torch.dtype = torch.float32 if a.autocast else getattr(torch, a.dtype)
    with tempfile.TemporaryDirectory() as d:
        path = build_tiny_model(d, arch="qwen2", hidden_size=a.hidden)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(CUDA)
    modeling.install_logp_head(model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (a.batch, a.length), generator=g).cuda()
    lengths = torch.randint(a.length // 2, a.length + 1, (a.batch,), generator=g)
    attn = (torch.arange(a.length).unsqueeze(0) < lengths.unsqueeze(1)).long().cuda()
    loss_mask = attn.clone()
    loss_mask[:, : a.length // 4] = 0  # a prompt that is not trained on
    liger = make_liger_ce_loss()

    def run(loss_fn: object) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if a.autocast else contextlib.nullcontext()
        with ctx:
            nll, _ = sequence_nll(model, ids, attn, loss_mask, loss_fn)
        nll.backward()
        return nll.item(), [p.grad.detach().float().clone() for p in model.parameters() if p.grad is not None]

    ref_loss, ref_grads = run(None)
    lig_loss, lig_grads = run(liger)
    loss_rel = abs(lig_loss - ref_loss) / max(abs(ref_loss), 1e-12)
    num = torch.stack([((x - y) ** 2).sum() for x, y in zip(lig_grads, ref_grads, strict=True)]).sum().sqrt()
    den = torch.stack([(y**2).sum() for y in ref_grads]).sum().sqrt()
    grad_rel = (num / den.clamp(min=1e-12)).item()
    tol_loss, tol_grad = (1e-4, 1e-3) if dtype == torch.float32 and not a.autocast else (2e-2, 3e-2)
    ok = loss_rel <= tol_loss and grad_rel <= tol_grad and len(lig_grads) == len(ref_grads)
    print(f"loss torch={ref_loss:.6f} liger={lig_loss:.6f} rel={loss_rel:.2e}; grad rel L2={grad_rel:.2e}; "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
