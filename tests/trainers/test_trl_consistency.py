"""One spec, two trainer lines: the bundled trainer and TRL's own (`sft`/`trl.sft`, `grpo`/`trl.grpo`,
`rloo`/`trl.rloo`, TRL 1.16) reach the same first step from the same spec and seed.

SFT: both define the same loss on the same rows with nothing sampled (every row is the same example, so neither
sampler's order matters).

GRPO and RLOO sample their completions, and the two trainers reach `model.generate` with the global torch RNG in
different states (TRL's dataloader and sampler draw from it first), so the test pins the seed at the start of each
`generate` call: then both draw the same completions from the same prompt ids and everything after (rewards,
advantages, loss, gradient) is the two trainers' own code. This caught a real mapping difference: TRL tokenized a
text prompt bare, the bundled trainers through the tokenizer's chat template (`launchgen.trainers.trl.run._rows`
now renders it the same way). On-policy, the clipped loss is -sum(len_i * A_i) / sum(len_i), 0 for the tiny model's
equal-length completions, so GRPO runs with entropy_coef (loss = -coef x mean entropy) and both compare grad_norm,
which the advantages and the loss normalisation decide.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchgen.trainers.declarations.trl.config import TrlRunConfig

from launchgen.input.loader import load_spec_text
from launchgen.kinds.registry import resolve_trainer_config


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _first_record(trainer: str, model: Path, data: Path, out: Path, **extra: Any) -> dict[str, Any]:
    from accelerate.state import AcceleratorState

    args = {"data": {"path": str(data)}, "per_device_train_batch_size": 4, "max_steps": 1, "learning_rate": 1e-3,
            "seed": 0, "logging_steps": 1, "save_final_model": False, "report_to": ["jsonl"], **extra}
    spec = {"job": {"name": "consistency"}, "model": {"name_or_path": str(model), "dtype": "float32"},
            "train": {"device": "cpu", "trainer": trainer, "precision": "fp32", "args": args}}
    cfg, issues = resolve_trainer_config(load_spec_text(yaml.safe_dump(spec), "spec.yaml").spec)
    assert cfg is not None, issues
    AcceleratorState._reset_state(True)
    if isinstance(cfg, TrlRunConfig):
        from launchgen.trainers.trl.run import run

        cfg.args["output_dir"] = str(out)
    else:
        from launchgen.trainers.core import run

        cfg.output_dir = str(out)
    assert run(cfg) == 0
    record: dict[str, Any] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return record


@pytest.mark.slow
def test_sft_and_trl_sft_give_the_same_first_step(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "Say 7 and 7", "completion": " 7 and 7 and 7"}) + "\n"
                            for _ in range(16)))
    ours = _first_record("sft", tiny_model_dir, data, tmp_path / "sft", max_length=64)
    trls = _first_record("trl.sft", tiny_model_dir, data, tmp_path / "trl-sft", max_length=64)
    assert ours["num_tokens"] == trls["num_tokens"]
    assert ours["loss"] == pytest.approx(trls["loss"], rel=1e-5, abs=1e-6)
    assert ours["grad_norm"] == pytest.approx(trls["grad_norm"], rel=1e-4)


@pytest.fixture
def seeded_generate(monkeypatch: pytest.MonkeyPatch) -> list[list[list[int]]]:
    """transformers' own generate, with the global seed set as it starts; records the sequences it returns."""
    import torch
    from transformers.generation.utils import GenerationMixin

    real = GenerationMixin.generate
    seen: list[list[list[int]]] = []

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        torch.manual_seed(1234)
        out = real(self, *args, **kwargs)
        seen.append((out.sequences if hasattr(out, "sequences") else out).tolist())
        return out

    monkeypatch.setattr(GenerationMixin, "generate", generate)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(("name", "extra"), [("grpo", {"entropy_coef": 0.1}), ("rloo", {})])
def test_bundled_and_trl_online_trainers_give_the_same_first_step(
        name: str, extra: dict[str, Any], tmp_path: Path, wide_model: Path,
        seeded_generate: list[list[list[int]]]) -> None:
    """wide_model: with the usual tiny model's flat logits every completion scores alike (no gradient)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "Say 7 and 7", "answer": "7"}) + "\n" for _ in range(16)))
    common = {"rewards": [{"name": "toy_rewards:target_fraction"}], "num_generations": 4,
              "generation": {"max_completion_length": 8}, **extra}
    ours = _first_record(name, wide_model, data, tmp_path / name, **common)
    drawn_by_ours = list(seeded_generate)
    seeded_generate.clear()
    trls = _first_record(f"trl.{name}", wide_model, data, tmp_path / f"trl-{name}", **common)
    assert drawn_by_ours == seeded_generate  # same prompt ids (chat template applied by both), same completions
    assert ours["num_tokens"] == trls["num_tokens"]
    for key in ("reward", "reward_std", "rewards/target_fraction/mean"):
        assert ours[key] == pytest.approx(trls[key], rel=1e-6), key
    assert ours["entropy"] == pytest.approx(trls["entropy"], rel=1e-5)
    assert ours["grad_norm"] == pytest.approx(trls["grad_norm"], rel=1e-5)
    assert ours["grad_norm"] > 0.1  # a real gradient: the advantages are not all zero
    assert ours["loss"] == pytest.approx(trls["loss"], rel=1e-5, abs=1e-6)
    if name == "grpo":
        assert ours["loss"] == pytest.approx(-0.1 * ours["entropy"], rel=1e-5)  # the entropy term, not 0
