"""The training side of a mixture-of-experts model (issue 34): a tiny Qwen3-MoE built in code, trained end to end on
CPU by the bundled GRPO loop. The fast generation engine's fused decode knows only the Llama family (llama, mistral,
qwen2, qwen3); for a MoE it keeps its modules path (each layer's own forward, router included) and says so in one
log line: `FastGenerateBackend: modules decode path (model_type 'qwen3_moe' is not one of [...])`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from toy_runs import read_metrics, run_cfg, toy_cfg

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from launchgen.trainers.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-moe"), arch="qwen3_moe")


def test_grpo_trains_a_tiny_moe_with_the_fast_engine_on_its_modules_path(
        tmp_path: Path, tiny_moe_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import json

    cfg_json = json.loads((tiny_moe_dir / "config.json").read_text())
    assert cfg_json["model_type"] == "qwen3_moe" and cfg_json.get("num_experts", cfg_json.get("num_local_experts")) == 4
    monkeypatch.syspath_prepend(str(HERE))
    cfg = toy_cfg(tmp_path, tiny_moe_dir, "moe", "grpo", num_generations=4, per_device_train_batch_size=8,
                  max_steps=3, generation={"max_completion_length": 6, "backend": "hf", "hf_engine": "static_cache"})
    with caplog.at_level(logging.INFO):
        assert run_cfg(cfg) == 0
    metrics = read_metrics(tmp_path / "moe")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] == m["loss"] for m in metrics)  # finite: no NaN from the router
    notes = [r.getMessage() for r in caplog.records if "modules decode path" in r.getMessage()]
    assert notes and "qwen3_moe" in notes[0], [r.getMessage() for r in caplog.records][-20:]
