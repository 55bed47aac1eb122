"""Bounded staleness (`generation.max_staleness`) end to end: GRPO against the stand-in vLLM server over real HTTP
and a real gloo weight-transfer group.

* max_staleness 0 is the synchronous loop: every metric and the final weights equal a run without the field.
* max_staleness 1: no batch is older than one step, and each one really was generated from the weights it claims:
  the checkpoint after every step records the batch in flight (its version and the server's log-probs), and the
  trainer's own checkpoint of that version reproduces those log-probs.
* A run preempted mid-way and resumed trains exactly as the uninterrupted one (metrics and final weights).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.generation.vllm_server import VLLMServerBackend
from toy_runs import read_metrics, run_cfg, toy_cfg
from vllm_standin.harness import Standin, free_port, start_standin

HERE = Path(__file__).parent
STEPS = 6


class _Acc:
    is_main_process = True
    process_index = 0
    num_processes = 1
    device = torch.device("cpu")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    s = start_standin(tiny_model_dir, tmp_path_factory.mktemp("standin-logs"))
    try:
        yield s
    finally:
        s.stop()


def _vllm(server: Standin, **over: Any) -> dict[str, Any]:
    return {"backend": "vllm_server", "max_completion_length": 6, "generation_kwargs": {"seed": 11},
            "vllm_server": {"port": server.port, "group_port": free_port(), "health_timeout": 60,
                            "weight_sync_timeout": 120, "control_timeout": 60}, **over}


def _cfg(tmp_path: Path, model: Path, server: Standin, out: str, **gen: Any) -> dict[str, Any]:
    cfg = toy_cfg(tmp_path, model, out, "grpo", num_generations=4, per_device_train_batch_size=8, max_steps=STEPS,
                  save_final_model=True, generation=_vllm(server, **gen))
    return cfg


def _fresh_server(server: Standin, model: Path) -> None:
    """A fresh trainer assumes the server holds the model file's weights (as a newly started one does)."""
    from transformers import AutoModelForCausalLM

    cfg = TrainerConfig.model_validate({"trainer": "grpo", "output_dir": "unused", "model": {"name_or_path": str(model)},
                                        "data": {"path": "unused.jsonl"}, "num_generations": 4,
                                        "generation": _vllm(server)})
    backend = VLLMServerBackend.from_config(cfg, _Acc())
    backend.sync_weights(iter(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).named_parameters()))
    backend.close()


def _run(cfg: dict[str, Any], server: Standin, model: Path) -> list[dict[str, Any]]:
    _fresh_server(server, model)
    assert run_cfg(cfg) == 0
    return read_metrics(Path(cfg["output_dir"]))


def _content(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Everything but wall-clock timings."""
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_max_staleness_0_is_the_synchronous_run(tmp_path: Path, tiny_model_dir: Path, server: Standin) -> None:
    base = _run(_cfg(tmp_path, tiny_model_dir, server, "sync"), server, tiny_model_dir)
    zero = _run(_cfg(tmp_path, tiny_model_dir, server, "zero", max_staleness=0), server, tiny_model_dir)
    assert len(base) == STEPS and _content(zero) == _content(base)
    assert not any(k.startswith("async/") for m in zero for k in m)
    _assert_same_weights(_final_weights(tmp_path / "zero"), _final_weights(tmp_path / "sync"))
    state = json.loads((tmp_path / "zero" / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert "ahead" not in state
    # the server generated from the weights just pushed: its log-probs are the trainer's
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-4 for m in base)


def _logps(model: Any, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def _weights_at(out: Path, base: Path, version: int) -> Any:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if version:
        model.load_state_dict(load_file(str(out / f"checkpoint-{version}" / "model.safetensors")))
    return model.eval()


@pytest.mark.parametrize("in_flight", ["finish", "pause"])
def test_max_staleness_1_generates_ahead_from_weights_at_most_one_step_old(
    in_flight: str, tmp_path: Path, tiny_model_dir: Path, server: Standin
) -> None:
    cfg = _cfg(tmp_path, tiny_model_dir, server, "k1", max_staleness=1, in_flight_at_push=in_flight)
    cfg.update(save_steps=1, save_total_limit=None)
    metrics = _run(cfg, server, tiny_model_dir)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    # step 1 trains on what the initial weights generated; every later batch was generated one step behind
    assert [m["async/staleness"] for m in metrics] == [0.0] + [1.0] * (STEPS - 1)
    assert max(m["sampling/sampling_logp_difference/max"] for m in metrics[1:]) > 1e-3  # really stale
    out = Path(cfg["output_dir"])
    checked = 0
    for step in range(1, STEPS):
        state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
        jobs = state["ahead"]["jobs"]
        # the batch the next step trains on (generated during this step) and the one now in flight, drained
        expect = [(step, step - 1), (step + 1, step)] if step + 1 < STEPS else [(step, step - 1)]
        assert [(j["index"], j["version"]) for j in jobs] == expect
        for job in jobs:
            model = _weights_at(out, tiny_model_dir, job["version"])
            res = job["result"]
            for p, c, lp in list(zip(res["prompt_ids"], res["completion_ids"], res["logprobs"], strict=True))[:4]:
                ours = _logps(model, p, c, 1.0)
                assert max(abs(a - b) for a, b in zip(ours, lp, strict=True) if not math.isnan(b)) < 1e-4
                checked += 1
    assert checked >= 4 * (STEPS - 1)


def test_a_preempted_async_run_resumes_exactly(
    tmp_path: Path, tiny_model_dir: Path, server: Standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toy_rewards

    signalling = [{"name": "toy_rewards:target_fraction_signal"}]
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    whole_cfg = {**_cfg(tmp_path, tiny_model_dir, server, "whole", max_staleness=1), "rewards": signalling}
    whole = _run(whole_cfg, server, tiny_model_dir)
    cfg = {**_cfg(tmp_path, tiny_model_dir, server, "cut", max_staleness=1), "rewards": signalling}
    monkeypatch.setattr(toy_rewards, "_calls", 0)
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 3)  # during step 3: checkpoint-3 holds batches 3 and 4
    _fresh_server(server, tiny_model_dir)
    assert run_cfg(cfg) == 75
    out = Path(cfg["output_dir"])
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert [(j["index"], j["version"]) for j in state["ahead"]["jobs"]] == [(3, 2), (4, 3)]
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert run_cfg(cfg) == 0  # the server now holds step 3's weights: the resumed trainer pushes its own first
    assert _content(read_metrics(out)) == _content(whole)
    _assert_same_weights(_final_weights(out), _final_weights(tmp_path / "whole"))


@pytest.mark.parametrize(("over", "needle"), [
    ({"generation": {"backend": "hf", "max_staleness": 1}}, "needs the vllm_server backend"),
    ({"generation": {"backend": "vllm_server", "max_staleness": 1, "importance_sampling": {"enabled": False}}},
     "correction must stay enabled"),
    ({"trainer": "rloo", "generation": {"backend": "vllm_server", "max_staleness": 1}}, "rloo does not have"),
])
def test_the_trainer_config_refuses_staleness_it_cannot_honour(over: dict[str, Any], needle: str) -> None:
    cfg = {"trainer": "grpo", "output_dir": "o", "model": {"name_or_path": "m"}, "data": {"path": "d.jsonl"}, **over}
    with pytest.raises(ValueError, match=needle):
        TrainerConfig.model_validate(cfg)
