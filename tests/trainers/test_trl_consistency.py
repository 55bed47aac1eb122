"""One spec, two trainer lines: the bundled `sft` and TRL's own `trl.sft` (TRL 1.16's SFTTrainer) reach the same
first-step loss, gradient norm and token count from the same spec and seed.

SFT is the pair where both sides define the same loss on the same rows with nothing sampled (every row is the
same example, so neither sampler's order matters). GRPO's first-step loss is no such check: on-policy (ratio 1)
it is -sum(len_i * A_i) / sum(len_i), which is 0 whenever the completions have equal lengths (the tiny model
never samples EOS), and the two trainers draw different completions from their own samplers; GRPO's loss math
is checked against values worked out by hand in tests/trainers/test_grpo_loss.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchgen.trainers.trl.config import TrlRunConfig

from launchgen.loader import load_spec_text
from launchgen.trainer_config import resolve_trainer_config


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def _first_record(trainer: str, model: Path, data: Path, out: Path) -> dict[str, Any]:
    from accelerate.state import AcceleratorState

    spec = {"job": {"name": "consistency"}, "model": {"name_or_path": str(model), "dtype": "float32"},
            "train": {"device": "cpu", "trainer": trainer, "precision": "fp32",
                      "args": {"data": {"path": str(data)}, "per_device_train_batch_size": 4, "max_steps": 1,
                               "learning_rate": 1e-3, "seed": 0, "logging_steps": 1, "save_final_model": False,
                               "report_to": ["jsonl"], "max_length": 64}}}
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
    ours = _first_record("sft", tiny_model_dir, data, tmp_path / "sft")
    trls = _first_record("trl.sft", tiny_model_dir, data, tmp_path / "trl-sft")
    assert ours["num_tokens"] == trls["num_tokens"]
    assert ours["loss"] == pytest.approx(trls["loss"], rel=1e-5, abs=1e-6)
    assert ours["grad_norm"] == pytest.approx(trls["grad_norm"], rel=1e-4)
