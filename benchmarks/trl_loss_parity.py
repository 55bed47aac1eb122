"""launchgen's GRPO/RLOO losses and gradients vs TRL 1.16's `_compute_loss` on the same model and batch (CPU, fp32).

Verification tooling only (launchgen itself never imports trl). Needs trl==1.16.0 next to launchgen, e.g. in a
scratch venv: `python -m venv --system-site-packages /tmp/v && /tmp/v/bin/pip install --no-deps trl==1.16.0`.

    python -m launchgen.trainers.tiny /tmp/tiny && /tmp/v/bin/python benchmarks/trl_loss_parity.py /tmp/tiny

Every loss type x beta x (old log-probs) x (IS ratio) x (KL bias correction), dapo under gradient accumulation
(GA 4, SPG 2, N spanning the generation batch), and RLOO; left padding, temperature 0.8. Prints both losses and
the worst relative gradient difference per case, then PASS (all < 1e-5) or FAIL. The GRPOConfig loss options
(GSPO, cispo/sapo/luspo/vespo, delta, entropy masking and bonus, the off-policy mask) and their logged metrics are
compared in `benchmarks/trl_options_parity.py`, the generation batch's advantages (`multi_objective_aggregation`,
`scale_rewards`) and metrics (num_tokens, completions/*, rewards) in `benchmarks/trl_rollout_parity.py`; both run
from here.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import warnings
from typing import Any

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import trl_options_parity as options
import trl_rollout_parity as rollout

T = 0.8
B, P, C, V = 4, 5, 7, 500


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max(((a[n] - b[n]).abs().max() / (a[n].abs().max() + 1e-12)).item() for n in a)


def main(model_dir: str) -> int:
    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from launchgen.trainers import modeling
    from launchgen.trainers.algorithms import grpo as g
    from launchgen.trainers.algorithms import rloo as r
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    ds = Dataset.from_list([{"prompt": "hi"}] * 8)

    def rew(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        return [0.0] * len(completions)

    torch.manual_seed(0)
    prompt_ids = torch.randint(10, V, (B, P))
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_ids[0, :2] = 3
    completion_ids = torch.randint(10, V, (B, C))
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[1, 4:] = 0
    completion_mask[2, 6:] = 0
    adv = torch.tensor([0.7, -1.2, 0.3, 0.2])
    mine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    modeling.install_logp_head(mine)
    mine.train()
    with torch.no_grad():
        base, _ = modeling.per_token_logps(mine, prompt_ids, prompt_mask, completion_ids, completion_mask, T)
    old = (base + 0.3 * torch.randn_like(base)) * completion_mask
    ref = (base + 0.2 * torch.randn_like(base)) * completion_mask
    isr = torch.rand(B, C) + 0.5
    batch = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                 completion_mask=completion_mask, advantages=adv)
    out = tempfile.mkdtemp()
    worst = 0.0

    def ours_logps() -> torch.Tensor:
        mine.zero_grad()
        lp, _ = modeling.per_token_logps(mine, prompt_ids, prompt_mask, completion_ids, completion_mask, T)
        return lp

    def grpo_case(lt: str, beta: float, with_old: bool, with_is: bool, corr: bool, ga: int, spg: int,
                  n_items: torch.Tensor) -> tuple[float, float, float]:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
                          loss_type=lt, beta=beta, epsilon=0.2, epsilon_high=0.28, temperature=T,
                          max_completion_length=10, use_bias_correction_kl=corr, report_to=[],
                          gradient_checkpointing=False, steps_per_generation=spg, gradient_accumulation_steps=ga)
        tr = GRPOTrainer(model=model_dir, reward_funcs=rew, args=args, train_dataset=ds)
        tr.model.train()
        tr.current_gradient_accumulation_steps = ga
        tr.use_vllm = with_is  # TRL applies the IS ratio only with vLLM + correction on
        tr.vllm_importance_sampling_correction = with_is
        inputs: dict[str, Any] = dict(batch, num_items_in_batch=n_items)
        if with_old:
            inputs["old_per_token_logps"] = old
        if beta:
            inputs["ref_per_token_logps"] = ref
        if with_is:
            inputs["importance_sampling_ratio"] = isr
        tr.model.zero_grad()
        l_trl = tr._compute_loss(tr.model, inputs)
        l_trl.backward()
        ptl = g.grpo_per_token_loss(
            ours_logps(), adv, old_logps=old if with_old else None, ref_logps=ref if beta else None,
            epsilon_low=0.2, epsilon_high=0.28, beta=beta, use_bias_correction_kl=corr,
            is_ratio=isr if with_is else None,
        )
        l_me = g.normalize_loss(ptl.loss, completion_mask, lt, gradient_accumulation_steps=ga, max_completion_length=10,
                                num_items_in_batch=n_items, num_processes=1, steps_per_generation=spg)
        l_me.backward()
        return l_trl.item(), l_me.item(), _rel(_grads(tr.model), _grads(mine))

    n_local = completion_mask.sum()
    for lt, beta, with_old, with_is, corr in itertools.product(
        ["dapo", "grpo", "bnpo", "dr_grpo"], [0.0, 0.04], [False, True], [False, True], [True, False]
    ):
        if beta == 0.0 and not corr:
            continue
        lt_, lm, gd = grpo_case(lt, beta, with_old, with_is, corr, 1, 1, n_local)
        worst = max(worst, gd)
        print(f"GRPO {lt:7s} beta={beta} old={with_old!s:5} is={with_is!s:5} bias_corr={corr!s:5} "
              f"loss trl={lt_:+.8f} ours={lm:+.8f} grad rel={gd:.1e}")
    lt_, lm, gd = grpo_case("dapo", 0.04, True, False, True, 4, 2, n_local * 3)
    worst = max(worst, gd)
    print(f"GRPO dapo GA=4 SPG=2 N=3x loss trl={lt_:+.8f} ours={lm:+.8f} grad rel={gd:.1e}")

    for with_old in (False, True):
        args = RLOOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
                          beta=0.05, epsilon=0.2, epsilon_high=0.28, temperature=T, max_completion_length=10,
                          report_to=[], gradient_checkpointing=False)
        tr = RLOOTrainer(model=model_dir, reward_funcs=rew, args=args, train_dataset=ds)
        tr.model.train()
        tr.current_gradient_accumulation_steps = 1
        o = old if with_old else base
        old_seq = (o * completion_mask).sum(1)
        tr.model.zero_grad()
        l_trl = tr.compute_loss(tr.model, dict(batch, old_logps=old_seq))
        l_trl.backward()
        l_me = r.rloo_loss(ours_logps(), completion_mask, old_seq, adv, 0.2, 0.28).loss
        l_me.backward()
        gd = _rel(_grads(tr.model), _grads(mine))
        worst = max(worst, gd)
        print(f"RLOO old={with_old!s:5} loss trl={l_trl.item():+.8f} ours={l_me.item():+.8f} grad rel={gd:.1e}")
    print(f"worst relative gradient difference {worst:.2e}")
    samp = (base + 0.15 * torch.randn_like(base)) * completion_mask
    samp[3, 2] = float("nan")  # a token the sampler gave no log-prob for
    fx = options.Fixture(model_dir, out, T, batch, old, ref, isr, samp, ds, rew, mine, _grads, _rel)
    worst_opt, worst_metric, failed = options.run(fx)
    print(f"options: worst relative gradient difference {worst_opt:.2e}, worst metric difference "
          f"{worst_metric:.2e}, {failed} failed")
    worst_rollout, failed_rollout = rollout.run(model_dir)
    print(f"rollout: worst advantage/metric difference {worst_rollout:.2e}, {failed_rollout} failed")
    ok = worst < 1e-5 and failed == 0 and failed_rollout == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
