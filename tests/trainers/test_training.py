"""CPU end-to-end runs of the online-RL core on the tiny model with the plain-generate backend."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import torch
from tools import tool
from toy_runs import read_metrics, run_cfg, toy_cfg, toy_data

HERE = Path(__file__).parent


_data = toy_data
_metrics = read_metrics
_run_inprocess = run_cfg


def _cfg(tmp_path: Path, model: Path, out: str, **over: Any) -> dict[str, Any]:
    return toy_cfg(tmp_path, model, out, **{"trainer": "grpo", "num_generations": 8, **over})




@pytest.mark.parametrize("trainer,extra", [("grpo", {}), ("rloo", {"beta": 0.0})])
def test_learns_toy_task(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, trainer: str, extra: dict[str, Any]) -> None:
    # Reward = fraction of "7" characters in a 6-token completion; a random-init model starts near 0.04.
    monkeypatch.syspath_prepend(str(HERE))
    cfg = _cfg(tmp_path, tiny_model_dir, f"learn-{trainer}", trainer=trainer, **extra)
    assert _run_inprocess(cfg) == 0
    rewards = [m["reward"] for m in _metrics(tmp_path / f"learn-{trainer}")]
    assert len(rewards) == 12
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert start < 0.15
    assert end > 0.5 and end > 4 * start, rewards


def test_signal_checkpoint_and_bit_identical_resume(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """USR2 -> checkpoint + exit 75 mid-generation-batch; the resumed run reproduces the uninterrupted one exactly."""
    monkeypatch.syspath_prepend(str(HERE))
    import toy_rewards

    common = dict(
        rewards=[{"name": "toy_rewards:target_fraction_signal"}],
        num_generations=4,
        per_device_train_batch_size=8,
        steps_per_generation=2,  # checkpoint after step 1 falls inside a generation batch: the buffer must survive
        max_steps=4,
        beta=0.04,  # exercise the reference model and old log-probs too
        lr_scheduler_type="linear",
    )
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert _run_inprocess(_cfg(tmp_path, tiny_model_dir, "a", **common)) == 0
    full = _metrics(tmp_path / "a")
    assert full[0]["kl"] == 0.0  # the reference model is loaded from the same path as the policy

    monkeypatch.setattr(toy_rewards, "_calls", 0)
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 1)
    assert _run_inprocess(_cfg(tmp_path, tiny_model_dir, "b", **common)) == 75
    assert (tmp_path / "b" / "checkpoint-1" / "trainer_state.json").is_file()
    assert not list((tmp_path / "b").glob(".tmp-*"))
    monkeypatch.setattr(toy_rewards, "SIGNAL_AT", 0)
    assert _run_inprocess(_cfg(tmp_path, tiny_model_dir, "b", **common)) == 0
    resumed = _metrics(tmp_path / "b")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed, strict=True):
        assert a["loss"] == b["loss"], (a["step"], a["loss"], b["loss"])
        assert a["grad_norm"] == b["grad_norm"]
        assert a.get("reward") == b.get("reward")
        assert a.get("kl") == b.get("kl")
    # save_total_limit (default 2) keeps the newest complete checkpoints only
    assert sorted(p.name for p in (tmp_path / "b").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-4"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def test_cli_two_steps_and_config_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    import yaml

    cfg = _cfg(tmp_path, tiny_model_dir, "cli", max_steps=2, per_device_train_batch_size=8, save_final_model=True)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # the rendered scripts override output_dir / server host and ports with --set KEY=YAML-VALUE
    proc = subprocess.run(
        [sys.executable, "-m", "launchgen.trainers.grpo", "--config", str(path),
         "--set", f"output_dir='{tmp_path / 'cli2'}'", "--set", "generation.vllm_server.port=8123"],
        env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "cli2"
    assert [m["step"] for m in _metrics(out)] == [1, 2]
    assert (out / "final" / "model.safetensors").is_file()
    assert json.loads((out / "launchgen-complete.json").read_text())["global_step"] == 2
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert resolved["generation"]["vllm_server"]["port"] == 8123
    assert not (tmp_path / "cli").exists()



def test_config_errors_are_one_line_exit_2(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml
    from launchgen.trainers.grpo import main

    cfg = _cfg(tmp_path, tiny_model_dir, "bad", max_steps=2, per_device_train_batch_size=8)
    path = tmp_path / "run.yaml"
    cases = [
        (dict(cfg, num_generations=3), "num_generations (3)"),  # 8 completions cannot split into groups of 3
        (dict(cfg, loss_type="ppo"), "loss_type"),
        (dict(cfg, trainer="rloo"), "python -m launchgen.trainers.rloo"),
        (dict(cfg, rewards=[{"name": "no_such_module_xyz:f"}]), "cannot import module"),
        (dict(cfg, data={"path": str(tmp_path / "missing.jsonl")}), "file not found"),
    ]
    for bad, needle in cases:
        path.write_text(yaml.safe_dump(bad))
        assert main(["--config", str(path)]) == 2
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and needle in lines[0], err
        assert "Traceback" not in err
    path.write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(path), "--set", "nonsense"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_accelerate_launch_two_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    import yaml
    cfg = _cfg(tmp_path, tiny_model_dir, "ddp", max_steps=2, per_device_train_batch_size=4, num_generations=4, save_steps=1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        # `--cpu` would start ONE process (accelerate's simple launcher); `--multi_gpu` uses torchrun, and the trainer
        # asks accelerate for a CPU (gloo) group when there is no GPU.
        [tool("accelerate"), "launch", "--num_processes", "2", "--num_machines", "1", "--multi_gpu", "--mixed_precision", "no",
         "--dynamo_backend", "no", "-m", "launchgen.trainers.grpo", "--config", str(path)],
        env=_env(), capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ms = _metrics(tmp_path / "ddp")
    assert [m["step"] for m in ms] == [1, 2]
    ck = tmp_path / "ddp" / "checkpoint-2"
    assert (ck / "random_states_0.pkl").is_file() and (ck / "random_states_1.pkl").is_file()
    assert json.loads((ck / "trainer_state.json").read_text())["num_processes"] == 2


def test_vllm_like_backend_gets_is_correction_and_weight_syncs(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-hf backend: IS ratios + the five sampling/* metrics, and full named weights after every step."""
    import torch
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    monkeypatch.syspath_prepend(str(HERE))
    synced: list[dict[str, torch.Tensor]] = []
    calls: list[str] = []

    class FakeServer:
        def __init__(self, inner: HFGenerateBackend) -> None:
            self.inner = inner

        def generate(self, prompt_ids, params):
            calls.append("generate")
            out = self.inner.generate(prompt_ids, params)
            assert out.logprobs is not None
            # a sampler that disagrees slightly with the trainer, and one position it could not score
            out.logprobs = [[x + 0.01 for x in row] for row in out.logprobs]
            out.logprobs[0][0] = None
            return out

        def sync_weights(self, named_params):
            calls.append("sync")
            synced.append({n: t.clone() for n, t in named_params})

        def close(self) -> None:
            pass

    def fake_make_backend(cfg, accelerator, model, tokenizer):
        return FakeServer(HFGenerateBackend.from_config(cfg, accelerator, model, tokenizer))

    monkeypatch.setattr(backends, "make_backend", fake_make_backend)
    cfg = _cfg(
        tmp_path, tiny_model_dir, "fake", max_steps=2, per_device_train_batch_size=8, num_generations=4,
        generation={"backend": "vllm_server", "max_completion_length": 6,
                    "importance_sampling": {"mode": "token_truncate", "clip_max": 2.0}},
    )
    assert _run_inprocess(cfg) == 0
    ms = _metrics(tmp_path / "fake")
    for m in ms:
        for key in ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                    "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                    "sampling/importance_sampling_ratio/max", "time/sync_weights"):
            assert key in m, key
        assert m["sampling/sampling_logp_difference/max"] == pytest.approx(0.01, abs=2e-3)
        assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-0.01), abs=2e-3)
    # A fresh trainer pushes its weights before the first generation too: the engine may hold others.
    assert calls == ["sync", "generate", "sync", "generate", "sync"]
    from safetensors.torch import load_file

    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(synced[0]) == set(initial)
    for name, t in synced[0].items():
        assert torch.equal(t, initial[name]), name

    final = load_file(str(tmp_path / "fake" / "checkpoint-2" / "model.safetensors"))
    assert set(synced[-1]) == set(final)  # HF names, as vLLM's load_weights expects
    for name, t in synced[-1].items():
        assert torch.equal(t, final[name])


@pytest.mark.slow
def test_sigterm_from_outside_checkpoints_and_exits_75(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A real TERM from another process (what SLURM / the supervisor sends): checkpoint, exit 75, then resume."""
    import signal
    import time

    import yaml

    cfg = _cfg(tmp_path, tiny_model_dir, "term", max_steps=10_000, per_device_train_batch_size=8, num_generations=4)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchgen.trainers.grpo", "--config", str(path)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    metrics = tmp_path / "term" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    ckpts = sorted((tmp_path / "term").glob("checkpoint-*"))
    assert len(ckpts) == 1
    step = int(ckpts[0].name.split("-")[1])
    assert step == len(_metrics(tmp_path / "term")) >= 1
    assert not (tmp_path / "term" / "launchgen-complete.json").exists()
    # the requeued run continues from that step
    proc2 = subprocess.run(
        [sys.executable, "-m", "launchgen.trainers.grpo", "--config", str(path), "--set", f"max_steps={step + 1}"],
        env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert [m["step"] for m in _metrics(tmp_path / "term")][-1] == step + 1


@pytest.mark.parametrize(
    "trainer,use_is,ga,spg,it,expected",
    [
        ("grpo", False, 1, 1, 1, False),  # on-policy: r = exp(l - l.detach())
        ("grpo", False, 1, 1, 2, True),  # second pass after an optimizer step
        ("grpo", False, 2, 1, 2, False),  # both passes inside one optimizer step
        ("grpo", False, 4, 2, 1, False),
        ("grpo", False, 2, 4, 1, True),  # one generation batch spans two optimizer steps
        ("grpo", True, 1, 1, 1, True),  # IS needs them
        ("rloo", False, 1, 1, 1, True),
    ],
)
def test_old_logps_rule(trainer: str, use_is: bool, ga: int, spg: int, it: int, expected: bool) -> None:
    from launchgen.trainers.objectives import OBJECTIVES
    from launchgen.trainers.objectives.grpo import keeps_old_logps

    if trainer == "grpo":
        assert keeps_old_logps(use_is, ga, spg, it) is expected
    else:
        assert OBJECTIVES[trainer].keeps_old_logps is expected  # type: ignore[attr-defined]


def test_dapo_micro_batch_losses_sum_to_the_whole_batch_loss(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GA = SPG = 2: the loop's dapo normaliser (N / n_proc * GA / SPG) makes the two micro-batch losses add up to
    the loss of the whole generation batch, computed here independently from the initial weights."""
    import torch
    from launchgen.trainers import core, modeling
    from launchgen.trainers.algorithms import grpo as g
    from transformers import AutoModelForCausalLM

    monkeypatch.syspath_prepend(str(HERE))
    seen: list[tuple[dict[str, Any], float]] = []
    orig = core.Trainer.micro_loss

    def spy(self, mb, stats):
        loss = orig(self, mb, stats)
        seen.append(({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in mb.items()}, loss.item()))
        return loss

    monkeypatch.setattr(core.Trainer, "micro_loss", spy)
    cfg = _cfg(tmp_path, tiny_model_dir, "ga", max_steps=1, per_device_train_batch_size=4, num_generations=4,
               gradient_accumulation_steps=2, loss_type="dapo")
    assert _run_inprocess(cfg) == 0
    assert len(seen) == 2
    batch = {k: torch.cat([seen[0][0][k], seen[1][0][k]]) for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                                    "completion_mask", "advantages")}
    n_items = seen[0][0]["num_items_in_batch"]
    assert n_items.item() == batch["completion_mask"].sum().item()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    modeling.install_logp_head(model)
    lp, _ = modeling.per_token_logps(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                     batch["completion_mask"], 1.0)
    ptl = g.grpo_per_token_loss(lp, batch["advantages"])
    whole = g.normalize_loss(ptl.loss, batch["completion_mask"], "dapo", gradient_accumulation_steps=1,
                             num_items_in_batch=n_items, steps_per_generation=1)
    whole.backward()
    norm = torch.stack([(p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None]).sum().sqrt()
    logged = _metrics(tmp_path / "ga")[0]
    assert seen[0][1] + seen[1][1] == pytest.approx(whole.item(), abs=1e-6)
    assert logged["loss"] == pytest.approx(whole.item(), abs=1e-6)
    # on-policy the loss value is ~0 (zero-sum advantages), so the gradient is what shows the normaliser is right
    assert norm.item() > 1e-3
    assert logged["grad_norm"] == pytest.approx(norm.item(), rel=1e-4)


def test_logging_window_average_and_metrics_truncated_on_resume(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchgen.trainers.reporting import truncate_metrics

    monkeypatch.syspath_prepend(str(HERE))
    cfg = _cfg(tmp_path, tiny_model_dir, "log", max_steps=3, per_device_train_batch_size=8, num_generations=4,
               logging_steps=2)
    assert _run_inprocess(cfg) == 0
    ms = _metrics(tmp_path / "log")
    assert [m["step"] for m in ms] == [2, 3]  # steps 1-2 averaged into one record, step 3 (the last) on its own
    path = tmp_path / "log" / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 4, "loss": 1.0}\n{"step": 5, "lo')  # steps after a checkpoint, the last one torn
    truncate_metrics(path, 3)
    assert [m["step"] for m in _metrics(tmp_path / "log")] == [2, 3]


def test_unscorable_batch_trains_with_zero_advantages(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    cfg = _cfg(tmp_path, tiny_model_dir, "never", max_steps=1, per_device_train_batch_size=8, num_generations=4,
               rewards=[{"name": "toy_rewards:never"}])
    assert _run_inprocess(cfg) == 0
    m = _metrics(tmp_path / "never")[0]
    assert m["reward"] is None and m["rewards/never/mean"] is None  # NaN is written as null
    assert m["loss"] == 0.0 and m["grad_norm"] == 0.0


def test_backend_closed_when_setup_fails_after_creating_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up stops after the backend exists (output_dir is a file): `run` still closes it (sockets, engines)."""
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend

    closed: list[bool] = []

    class Closing(HFGenerateBackend):
        def close(self) -> None:
            closed.append(True)

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setattr(backends, "make_backend", lambda cfg, acc, model, tok: Closing.from_config(cfg, acc, model, tok))
    (tmp_path / "taken").write_text("not a directory")
    cfg = _cfg(tmp_path, tiny_model_dir, "taken", max_steps=1, per_device_train_batch_size=8, num_generations=4)
    with pytest.raises(FileExistsError):
        run_cfg(cfg)
    assert closed == [True]
