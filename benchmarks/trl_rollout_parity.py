"""launchgen's generation-batch side vs TRL 1.16's `_generate_and_score_completions` (CPU, fp32).

Verification tooling only; run by `benchmarks/trl_loss_parity.py`. Both trainers get the same fixed completions
(generation replaced by a stub: some end with EOS, some are cut at max_completion_length) for the same chat
prompt, and two reward functions of the completion text (one returns None for some completions). Compared: the
advantages (both `multi_objective_aggregation` modes x `scale_rewards`), and every generation-time metric TRL logs
(reward, reward_std, frac_reward_zero_std, rewards/<fn>/*, num_tokens, completions/*). launchgen's side is its
own `Rollout` (data, tokenizer, reward loading, scoring, `GRPOObjective.prepare`) with a stub backend.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch

G, N = 4, 8  # completions per prompt, completions per generation batch
MAX_LEN = 6
PROMPT = [{"role": "user", "content": "say something"}]
#: Keys TRL logs in `_generate_and_score_completions` that launchgen does not (none).
_TRL_ONLY: frozenset[str] = frozenset()


def _text(c: Any) -> str:
    return c if isinstance(c, str) else str(c[0]["content"])


def reward_len(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
    return [float(len(_text(c)) % 5) for c in completions]


def reward_chars(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float | None]:
    out: list[float | None] = []
    for c in completions:
        t = _text(c)
        out.append(None if len(t) % 3 == 0 else len(set(t)) / 4)
    return out


def _completions(eos: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(N):
        n = 1 + (i * 5) % MAX_LEN
        ids = torch.randint(20, vocab, (n,), generator=g).tolist()
        if i % 3:  # ends with EOS
            out.append([*ids[:-1], eos])
        else:  # cut at max_completion_length
            out.append(ids + torch.randint(20, vocab, (MAX_LEN - n,), generator=g).tolist())
    return out


def _trl(model_dir: str, out: str, comps: list[list[int]], agg: str, scale: str) -> tuple[torch.Tensor, dict[str, float]]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=N, num_generations=G,
                      max_completion_length=MAX_LEN, report_to=[], gradient_checkpointing=False, beta=0.0,
                      multi_objective_aggregation=agg, scale_rewards=scale, reward_weights=[1.0, 0.5])
    ds = Dataset.from_list([{"prompt": PROMPT}] * N)
    tr = GRPOTrainer(model=model_dir, reward_funcs=[reward_len, reward_chars], args=args, train_dataset=ds)
    tr.model.train()
    tr._generate_single_turn = lambda prompt_ids, *a, **k: ([list(comps[i]) for i in range(len(prompt_ids))], None)
    res = tr._generate_and_score_completions([{"prompt": PROMPT} for _ in range(N)])
    metrics = {k: float(v[-1]) for k, v in tr._metrics["train"].items() if v}
    return res["advantages"], metrics


class _StubBackend:
    def __init__(self, comps: list[list[int]], eos: int) -> None:
        self.comps, self.eos = comps, eos

    def generate(self, prompt_ids: list[list[int]], params: Any) -> Any:
        from launchgen.trainers.generation.protocol import GenerationOutput

        comps = [list(self.comps[i]) for i in range(len(prompt_ids))]
        return GenerationOutput(prompt_ids=prompt_ids, completion_ids=comps, logprobs=None,
                                finished=[c[-1] == self.eos for c in comps])

    def sync_weights(self, named_params: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _ours(model_dir: str, work: Path, comps: list[list[int]], agg: str, scale: str, eos: int
          ) -> tuple[torch.Tensor, dict[str, float]]:
    from accelerate import Accelerator
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation import backends
    from launchgen.trainers.objectives.grpo import GRPOObjective
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": PROMPT}) + "\n" for _ in range(N)))
    cfg = TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": str(work / "out"), "precision": "fp32", "model": {"name_or_path": model_dir},
        "data": {"path": str(data)}, "num_generations": G, "per_device_train_batch_size": N,
        "rewards": [{"name": "trl_rollout_parity:reward_len"},
                    {"name": "trl_rollout_parity:reward_chars", "weight": 0.5}],
        "generation": {"max_completion_length": MAX_LEN}, "multi_objective_aggregation": agg, "scale_rewards": scale,
    })
    obj = GRPOObjective(cfg, 1)
    seen: list[torch.Tensor] = []
    prepare = obj.prepare

    def capture(batch: Any) -> torch.Tensor:
        out = prepare(batch)
        seen.append(batch.t["advantages"].clone())
        return out

    obj.prepare = capture  # type: ignore[method-assign]
    acc = Accelerator(cpu=True)
    src: Any = obj.make_source(acc)
    tok = AutoTokenizer.from_pretrained(model_dir)
    src.after_tokenizer(tok)
    orig = backends.make_backend
    backends.make_backend = lambda *a, **k: _StubBackend(comps, eos)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        src.start(model, None, False)
        _, metrics = src.next_batches()
    finally:
        backends.make_backend = orig
    return seen[0], {k: v for k, v in metrics.items() if not k.startswith("time/")}


def run(model_dir: str) -> tuple[float, int]:
    """Every aggregation x scale_rewards case; prints one line each. Returns (worst difference, failed cases)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    comps = _completions(tok.eos_token_id, len(tok))
    worst, bad = 0.0, 0
    for agg in ("sum_then_normalize", "normalize_then_sum"):
        for scale in ("group", "batch", "none"):
            with tempfile.TemporaryDirectory() as tmp:
                a_trl, m_trl = _trl(model_dir, tmp, comps, agg, scale)
                a_me, m_me = _ours(model_dir, Path(tmp), comps, agg, scale, tok.eos_token_id)
            adv = (a_trl - a_me).abs().max().item()
            missing = sorted(set(m_trl) - set(m_me) - _TRL_ONLY)
            diffs = {k: abs(m_trl[k] - m_me[k]) / max(1.0, abs(m_trl[k])) for k in set(m_trl) & set(m_me)
                     if not (math.isnan(m_trl[k]) and math.isnan(m_me[k]))}
            md = max(diffs.values(), default=0.0)
            ok = adv < 1e-5 and md < 1e-5 and not missing
            bad += not ok
            worst = max(worst, adv, md)
            print(f"{'PASS' if ok else 'FAIL'} rollout {agg:18s} scale={scale:5s} advantages max abs diff={adv:.1e} "
                  f"metrics {len(m_trl)} worst={md:.1e} num_tokens trl={m_trl.get('num_tokens')} "
                  f"ours={m_me.get('num_tokens')} {' '.join('missing ' + k for k in missing)}")
            if md >= 1e-5:
                print("  differing:", {k: (m_trl[k], m_me[k]) for k, v in diffs.items() if v >= 1e-5})
    return worst, bad
