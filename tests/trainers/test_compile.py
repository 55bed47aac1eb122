"""`model.compile`: regional compilation of the decoder layers and the log-prob head.

CPU tests run dynamo with the "eager" backend (tracing, guards and graph breaks are real; no code is generated,
which would take minutes on the CI machine): they pin what the GPU build relies on, namely that a Qwen2/Llama
layer traces without graph breaks, that all layers share one compiled frame (no per-layer recompiles), that the
numbers are the uncompiled ones, and that generation runs the layers eagerly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import torch
from toy_runs import read_metrics, run_cfg, toy_cfg

HERE = Path(__file__).parent


LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0}


def _cfg(model_dir: Path, peft: dict[str, Any] | None = None, **model: Any) -> Any:
    from launchgen.trainers.declarations.config import TrainerConfig

    return TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": "o", "precision": "fp32", "data": {"path": "d"},
        "model": {"name_or_path": str(model_dir), **model}, **({"peft": peft} if peft else {}),
    })


@pytest.mark.parametrize("compile_,device,liger,dist,lora,layers,head", [
    ("auto", "cuda", False, "NO", False, True, True),
    ("auto", "cuda", False, "MULTI_GPU", False, True, True),
    ("auto", "cpu", False, "NO", False, False, False),
    ("auto", "cuda", True, "NO", False, False, True),
    ("auto", "cuda", False, "FSDP", False, False, True),
    ("auto", "cuda", False, "DEEPSPEED", False, False, True),
    (True, "cpu", False, "NO", False, True, True),
    (False, "cuda", False, "NO", False, False, False),
    # LoRA: the layers compile as for full fine-tuning (its training phase was 2x full fine-tuning's uncompiled)
    ("auto", "cuda", False, "NO", True, True, True),
    ("auto", "cuda", False, "MULTI_GPU", True, True, True),
    ("auto", "cuda", False, "FSDP", True, False, True),
    ("auto", "cpu", False, "NO", True, False, False),
    (True, "cuda", False, "NO", True, True, True),
])
def test_resolve_compile(
    compile_: Any, device: str, liger: bool, dist: str, lora: bool, layers: bool, head: bool
) -> None:
    from launchgen.trainers.modeling import CompilePlan, resolve_compile

    cfg = _cfg(Path("m"), LORA if lora else None, compile=compile_, use_liger_kernel=liger)
    assert resolve_compile(cfg, device, dist) == CompilePlan(layers=layers, head=head)


@pytest.fixture()
def dynamo_eager(monkeypatch: pytest.MonkeyPatch) -> Any:
    import torch._dynamo
    from launchgen.trainers import modeling
    from torch._dynamo.utils import counters

    monkeypatch.setattr(modeling, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt ids and mask (row 0 left-padded, as the trainer feeds prompts), completion ids and mask (row 1 ends
    early)."""
    g = torch.Generator().manual_seed(1)
    pid = torch.randint(3, 100, (4, 5), generator=g)
    pm = torch.ones(4, 5, dtype=torch.long)
    pm[0, :2] = 0
    cid = torch.randint(3, 100, (4, 7), generator=g)
    cm = torch.ones(4, 7, dtype=torch.long)
    cm[1, 4:] = 0
    return pid, pm, cid, cm


def _same_logps_and_grads(lp0: torch.Tensor, g0: dict[str, torch.Tensor], lp1: torch.Tensor,
                          g1: dict[str, torch.Tensor]) -> None:
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-6)
    assert g0.keys() == g1.keys()
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch_fixture", ["tiny_model_dir", "tiny_llama_dir"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_trace_whole_share_one_frame_and_match(
    request: pytest.FixtureRequest, dynamo_eager: Any, arch_fixture: str, checkpointing: bool
) -> None:
    from launchgen.trainers import modeling

    model_dir: Path = request.getfixturevalue(arch_fixture)
    cfg = _cfg(model_dir, gradient_checkpointing=checkpointing)
    torch.manual_seed(0)
    plain = modeling.load_model(cfg, trainable=True, compile=None)
    compiled = modeling.load_model(cfg, trainable=True, compile=modeling.CompilePlan(True, True))
    compiled.load_state_dict(plain.state_dict())
    assert all(isinstance(layer.forward, modeling._LayerForward) for layer in compiled.get_decoder().layers)

    pid, pm, cid, cm = _batch()
    out = []
    for model in (plain, compiled):
        lp, ent = modeling.per_token_logps(model, pid, pm, cid, cm, 0.7)
        lp.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((lp.detach(), ent, grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = out
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-6)
    _same_logps_and_grads(lp0, g0, lp1, g1)

    counters = dynamo_eager
    assert dict(counters["graph_break"]) == {}
    # One frame for the layers (all of them) and one per direction of the log-prob tile: a per-layer guard would
    # add frames.
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    assert counters["frames"]["ok"] == counters["frames"]["total"]


def _lora_model(cfg: Any, plan: Any) -> Any:
    """The trainer's LoRA policy (modeling.load_model, then lora.wrap_policy), its B matrices made non-zero so the
    adapters change the output and every adapter parameter gets a gradient (PEFT initialises B to zero)."""
    from launchgen.trainers import lora, modeling

    model = lora.wrap_policy(modeling.load_model(cfg, trainable=True, compile=plan), cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_lora_layers_trace_whole_and_match(dynamo_eager: Any, tiny_model_dir: Path,
                                                    checkpointing: bool) -> None:
    """LoRA with compiled decoder layers: the layers' one frame traces through PEFT's linears (launchgen's
    input-dtype adapters included) with no graph break and no per-layer graph; the adapted log-probs, the
    adapter-off reference's and the adapters' gradients are the uncompiled ones."""
    from launchgen.trainers import lora, modeling

    cfg = _cfg(tiny_model_dir, LORA, gradient_checkpointing=checkpointing)
    plain = _lora_model(cfg, None)
    compiled = _lora_model(cfg, modeling.CompilePlan(True, True))
    compiled.load_state_dict(plain.state_dict())
    base = compiled.get_base_model()
    assert all(isinstance(layer.forward, modeling._LayerForward) for layer in base.get_decoder().layers)
    assert lora.compute_in_input_dtype(base) > 0  # the adapters are launchgen's input-dtype ones (already set)

    pid, pm, cid, cm = _batch()
    out = []
    for model in (plain, compiled):
        with torch.no_grad(), model.disable_adapter():
            ref, _ = modeling.per_token_logps(model, pid, pm, cid, cm, 0.7)
        lp, _ = modeling.per_token_logps(model, pid, pm, cid, cm, 0.7)
        lp.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((ref, lp.detach(), grads))
    (ref0, lp0, g0), (ref1, lp1, g1) = out
    assert not torch.allclose(lp0, ref0)  # the adapters act, so the on/off switch is observable
    torch.testing.assert_close(ref1, ref0, rtol=1e-5, atol=1e-6)
    assert g0 and all(".lora_" in k for k in g0)
    _same_logps_and_grads(lp0, g0, lp1, g1)

    counters = dynamo_eager
    assert dict(counters["graph_break"]) == {}
    # The layers' frame twice (adapters off without grad, adapters on with grad) and the head's tile three times
    # (no-grad, grad, backward); a per-layer guard (each layer's own LoRA modules) would add graphs per layer.
    assert counters["stats"]["unique_graphs"] == 5, dict(counters["stats"])
    assert counters["frames"]["ok"] == counters["frames"]["total"]


def test_lora_grpo_run_with_compiled_layers_matches_plain(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, dynamo_eager: Any
) -> None:
    """A whole GRPO run with LoRA (reference = adapters off, beta > 0), layers compiled or not: the same run."""
    monkeypatch.syspath_prepend(str(HERE))
    common: dict[str, Any] = {"num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 3, "beta": 0.04,
                              "peft": LORA, "learning_rate": 1e-2}
    runs = {}
    for name, flag in (("plain", False), ("compiled", True)):
        cfg = toy_cfg(tmp_path, tiny_model_dir, name, "grpo", **common)
        cfg["model"]["compile"] = flag
        assert run_cfg(cfg) == 0
        runs[name] = read_metrics(tmp_path / name)
    assert dynamo_eager["stats"]["unique_graphs"] >= 2  # the compiled run compiled
    assert dict(dynamo_eager["graph_break"]) == {}
    assert any(abs(m["kl"]) > 0 for m in runs["plain"][1:])  # the adapters moved, so the reference pass mattered
    for a, b in zip(runs["plain"], runs["compiled"], strict=True):
        for key in ("loss", "reward", "kl", "entropy", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a[key], b[key])


def test_generation_runs_layers_eagerly(dynamo_eager: Any, tiny_model_dir: Path) -> None:
    from launchgen.trainers import modeling

    cfg = _cfg(tiny_model_dir)
    model = modeling.load_model(cfg, trainable=True, compile=modeling.CompilePlan(True, True))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        with modeling.eager_layers():
            model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
        assert dynamo_eager["stats"]["unique_graphs"] == 0
        model(input_ids=ids, use_cache=False)  # outside the switch the compiled forward runs (as in training)
    assert dynamo_eager["stats"]["unique_graphs"] == 1


def test_grpo_run_with_compiled_layers_matches_plain(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, dynamo_eager: Any
) -> None:
    from launchgen.trainers import modeling
    from launchgen.trainers.generation import backends

    monkeypatch.syspath_prepend(str(HERE))
    # Generation must run the layers eagerly when they are compiled: record the switch at every generate call.
    eager_at_generate: list[int] = []
    make_backend = backends.make_backend

    def spying(*args: Any) -> Any:
        backend = make_backend(*args)
        generate = backend.generate

        def gen(*a: Any, **k: Any) -> Any:
            eager_at_generate.append(modeling._EagerSwitch.depth)
            return generate(*a, **k)

        backend.generate = gen
        return backend

    monkeypatch.setattr(backends, "make_backend", spying)
    common: dict[str, Any] = {"num_generations": 4, "per_device_train_batch_size": 8, "max_steps": 3, "beta": 0.04}
    runs = {}
    depths = {}
    for name, flag in (("plain", False), ("compiled", True)):
        cfg = toy_cfg(tmp_path, tiny_model_dir, name, "grpo", **common)
        cfg["model"]["compile"] = flag
        eager_at_generate.clear()
        assert run_cfg(cfg) == 0
        runs[name] = read_metrics(tmp_path / name)
        depths[name] = list(eager_at_generate)
    assert depths["plain"] == [0, 0, 0]  # nothing compiled, nothing to switch off
    assert depths["compiled"] == [1, 1, 1]
    assert dynamo_eager["stats"]["unique_graphs"] >= 2  # the compiled run compiled (grad and no-grad graphs)
    for a, b in zip(runs["plain"], runs["compiled"], strict=True):
        for key in ("loss", "reward", "kl", "entropy", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a[key], b[key])


def test_compiling_layers_raises_the_recompile_limit(tiny_model_dir: Path, dynamo_eager: Any) -> None:
    import torch._dynamo.config as dynamo_config
    from launchgen.trainers import dynamo_config as ours
    from launchgen.trainers import modeling

    name = ours.recompile_limit_name()
    assert name in ("recompile_limit", "cache_size_limit")
    # config.patch restores the old value exactly; monkeypatch's undo would *delete* it (torch's config module
    # keeps settings outside its __dict__), which hides the setting from every later compile in the process.
    with dynamo_config.patch({name: 2}):
        model = modeling.load_model(_cfg(tiny_model_dir), trainable=True, compile=modeling.CompilePlan(True, False))
        assert getattr(dynamo_config, name) == 4 * len(model.get_decoder().layers)


def test_a_hidden_recompile_limit_is_restored_and_compiling_still_works(tiny_model_dir: Path, dynamo_eager: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """What a user's `mock.patch` of the limit leaves behind: the setting deleted, so hidden."""
    import torch._dynamo.config as dynamo_config
    from launchgen.trainers import dynamo_config as ours
    from launchgen.trainers import modeling

    name = ours.recompile_limit_name()
    assert name is not None
    default = getattr(dynamo_config, name)
    with dynamo_config.patch({name: default}):  # restores (and so un-hides) it whatever the test does
        delattr(dynamo_config, name)
        with pytest.raises(AttributeError):
            getattr(dynamo_config, name)
        with caplog.at_level("WARNING", logger="launchgen.trainers.dynamo_config"):
            model = modeling.load_model(_cfg(tiny_model_dir), trainable=True,
                                        compile=modeling.CompilePlan(True, False))
        assert "had been deleted" in caplog.text
        assert getattr(dynamo_config, name) >= 4 * len(model.get_decoder().layers)
        ids = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            model(input_ids=ids)
    assert dynamo_eager["stats"]["unique_graphs"] >= 1  # it compiled, not fell back to eager


def test_recompile_limit_raised_for_a_block_only_and_never_lowered() -> None:
    import torch._dynamo.config as dynamo_config
    from launchgen.trainers import dynamo_config as ours

    name = ours.recompile_limit_name()
    assert name is not None
    with dynamo_config.patch({name: 5}):
        with ours.recompile_limit_raised(64):
            assert getattr(dynamo_config, name) == 64
        assert getattr(dynamo_config, name) == 5  # restored exactly
        with dynamo_config.patch({name: 100}), ours.recompile_limit_raised(64):
            assert getattr(dynamo_config, name) == 100  # a user's higher limit stays
