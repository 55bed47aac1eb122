"""Liger fused linear GRPO loss vs launchgen's plain-torch GRPO loss: values and gradients (needs CUDA + liger-kernel).

    pip install 'liger-kernel>=0.8.2'   # into the GPU environment, next to launchgen[train]
    python benchmarks/liger_parity.py [--hidden 256] [--layers 2] [--dtype bfloat16]

Builds a small random Qwen2 (launchgen.trainers.tiny), loads it in bf16 on the GPU, and for every loss type x
beta x (old log-probs present / absent) x (IS ratio present / absent) computes the loss and all parameter
gradients both ways on the same batch. Prints max abs / relative differences per case and PASS/FAIL
(bf16 tolerances: loss rel 2e-2, gradient relative L2 error 3e-2). Exit code 0 only if every case passes.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"],
        help="cpu: a dry run of the fused loss math without torch.compile (use --dtype float32)",
    )
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("FAIL: needs a CUDA GPU (or --device cpu for a dry run)")
        return 1

    from launchgen.trainers import modeling
    from launchgen.trainers.algorithms import grpo as g
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, a.dtype)
    tmp = tempfile.mkdtemp(prefix="liger-parity-")
    build_tiny_model(tmp, arch="qwen2", hidden_size=a.hidden, num_layers=a.layers, num_heads=4, num_kv_heads=2)
    torch.manual_seed(0)
    dev = a.device
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).to(dev)
    model.train()
    modeling.install_logp_head(model)
    V = model.config.vocab_size
    B, P, C = a.batch, 16, a.completion
    prompt_ids = torch.randint(0, V, (B, P), device=dev)
    prompt_mask = torch.ones(B, P, dtype=torch.long, device=dev)
    prompt_mask[0, :5] = 0  # left padding in one row
    completion_ids = torch.randint(0, V, (B, C), device=dev)
    completion_mask = torch.ones(B, C, dtype=torch.long, device=dev)
    completion_mask[1, C // 2 :] = 0
    completion_mask[2, C - 3 :] = 0
    advantages = torch.randn(B, device=dev)
    with torch.no_grad():
        base, _ = modeling.per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.9)
    old = (base + 0.05 * torch.randn_like(base)) * completion_mask
    ref = (base + 0.1 * torch.randn_like(base)) * completion_mask
    is_ratio = torch.rand(B, 1, device=dev) + 0.5
    n_items = completion_mask.sum().float()

    all_ok = True
    print(f"model hidden={a.hidden} layers={a.layers} vocab={V} dtype={a.dtype} B={B} C={C} device={dev}")
    for loss_type, beta, with_old, with_is in itertools.product(
        ["dapo", "grpo", "bnpo", "dr_grpo"], [0.0, 0.04], [False, True], [False, True]
    ):
        cfg = TrainerConfig.model_validate(
            {
                "trainer": "grpo",
                "output_dir": tmp,
                "model": {"name_or_path": tmp, "use_liger_kernel": True},
                "data": {"path": "unused.jsonl"},
                "loss_type": loss_type,
                "beta": beta,
                "epsilon": 0.2,
                "epsilon_high": 0.28,
                "generation": {"max_completion_length": C, "temperature": 0.9},
            }
        )
        kw = dict(
            old_logps=old if with_old else None,
            ref_logps=ref if beta else None,
            is_ratio=is_ratio if with_is else None,
        )
        model.zero_grad(set_to_none=True)
        lp, _ = modeling.per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.9)
        ptl = g.grpo_per_token_loss(
            lp, advantages, epsilon_low=0.2, epsilon_high=0.28, beta=beta, use_bias_correction_kl=True, **kw
        )
        plain = g.normalize_loss(
            ptl.loss, completion_mask, loss_type, gradient_accumulation_steps=1, max_completion_length=C,
            num_items_in_batch=n_items, num_processes=1, steps_per_generation=1,
        )
        plain.backward()
        g_plain = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}

        model.zero_grad(set_to_none=True)
        fused, _ = modeling.liger_grpo_loss(
            model, modeling.make_liger_grpo_loss(cfg, compiled=dev == "cuda"), prompt_ids, prompt_mask, completion_ids, completion_mask,
            advantages=advantages,
            ref_per_token_logps=kw["ref_logps"],
            old_per_token_logps=kw["old_logps"],
            vllm_is_ratio=kw["is_ratio"],
            num_items_in_batch=n_items if loss_type == "dapo" else None,
        )
        fused.backward()
        g_fused = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}

        loss_abs = abs(plain.item() - fused.item())
        loss_rel = loss_abs / max(abs(plain.item()), 1e-6)
        worst_rel, worst_abs, worst_name = 0.0, 0.0, ""
        missing = set(g_plain) ^ set(g_fused)
        for n in g_plain.keys() & g_fused.keys():
            d = (g_plain[n] - g_fused[n]).norm().item()
            rel = d / max(g_plain[n].norm().item(), 1e-8)
            worst_abs = max(worst_abs, (g_plain[n] - g_fused[n]).abs().max().item())
            if rel > worst_rel:
                worst_rel, worst_name = rel, n
        ok = (loss_rel <= 2e-2 or loss_abs <= 1e-4) and worst_rel <= 3e-2 and not missing
        all_ok &= ok
        print(
            f"{'PASS' if ok else 'FAIL'} loss_type={loss_type:<7} beta={beta:<4} old={with_old!s:<5} is={with_is!s:<5} "
            f"loss plain={plain.item():+.6f} liger={fused.item():+.6f} abs={loss_abs:.2e} rel={loss_rel:.2e} "
            f"grad max_abs={worst_abs:.2e} worst_rel_l2={worst_rel:.2e} ({worst_name}){' MISSING ' + str(missing) if missing else ''}"
        )
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
