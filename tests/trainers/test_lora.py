"""LoRA (peft) in the bundled trainers: learning, adapter-only training, merged-weight sync (bit-exact against
PEFT's own merge, on the vLLM stand-in over a real gloo group), adapter checkpoints and exact resume."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import peft  # noqa: F401  (a [train] dependency: missing is a failure, not a skip)
import pytest
import torch
from launchgen.trainers.core import Trainer
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.errors import TrainerSetupError
from pydantic import ValidationError
from toy_runs import read_metrics, run_cfg, toy_cfg
from vllm_standin.harness import free_port, start_standin

HERE = Path(__file__).parent
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}


def _cfg(tmp_path: Path, model: Path, out: str, peft_over: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    return toy_cfg(tmp_path, model, out, "grpo", **{"num_generations": 8, "peft": {**LORA, **(peft_over or {})}, **over})


def _trainer(cfg: dict[str, Any]) -> Trainer:
    t = Trainer(TrainerConfig.model_validate(cfg))
    t.setup()
    return t


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _merged_reference(trainer: Trainer) -> dict[str, torch.Tensor]:
    """PEFT's own merge_and_unload on a copy of the trainer's model: base + scaling * B @ A."""
    inner = trainer.accelerator.unwrap_model(trainer.model)
    return copy.deepcopy(inner).merge_and_unload().state_dict()


@pytest.mark.parametrize("engine", ["generate", "static_cache"])
def test_learns_toy_task_and_only_adapter_params_change(
    tmp_path: Path, wide_model: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """With either engine: the rewards are those of completions sampled from the adapted policy, so a static-cache
    engine that decoded the frozen base would not show the rise."""
    monkeypatch.syspath_prepend(str(HERE))
    t = _trainer(_cfg(tmp_path, wide_model, "learn", save_final_model=True,
                         generation={"max_completion_length": 6, "hf_engine": engine}))
    assert type(t.backend).__name__ == {"generate": "HFGenerateBackend", "static_cache": "FastGenerateBackend"}[engine]
    if engine == "static_cache":
        assert t.backend.decode_path == "fused" and t.backend._adapted
    named = dict(t.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimized = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(named[n]) for n in trainable}  # optimizer state for the adapters only
    before = {n: p.detach().clone() for n, p in named.items()}
    try:
        assert t.train() == 0
    finally:
        t.close()
    changed = {n for n, p in t.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n in trainable if ".lora_B." in n or ".lora_A." in n}, sorted(set(trainable) - changed)[:4]
    rewards = [m["reward"] for m in read_metrics(tmp_path / "learn")]
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert start < 0.1 and end > 0.2 and end > 4 * start, rewards
    final = tmp_path / "learn" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()  # the artefact is the adapter, not a model copy


def test_sync_to_standin_is_the_merged_model_bit_for_bit_after_every_step(
    tmp_path: Path, wide_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GRPO with beta > 0 (the reference is the policy with adapters off) against the vLLM stand-in over gloo:
    after every sync the server's weights hash exactly like PEFT's merge_and_unload of the trainer's model."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("LAUNCHGEN_WEIGHT_TRANSPORT", "gloo")
    seen: list[dict[str, Any]] = []
    orig = Trainer._sync_weights

    def checked(self: Trainer, full: bool = False) -> float:
        took = orig(self, full)
        backend: Any = self.backend
        got = backend.client.collective_rpc("launchgen_weight_digest")[0]
        want = {n: _sha(v) for n, v in _merged_reference(self).items()}
        assert got == want, sorted(n for n in want if got.get(n) != want[n])[:5]
        seen.append({"bytes": backend.last_sync_bytes, "digest": got})
        return took

    monkeypatch.setattr(Trainer, "_sync_weights", checked)
    server = start_standin(wide_model, tmp_path, env={"LAUNCHGEN_STANDIN_QUIET": "1"})
    try:
        vs = {"port": server.port, "group_port": free_port(), "health_timeout": 60, "weight_sync_timeout": 60}
        cfg = _cfg(tmp_path, wide_model, "sync", max_steps=3, num_generations=4, per_device_train_batch_size=8,
                   beta=0.04, generation={"backend": "vllm_server", "max_completion_length": 6, "vllm_server": vs})
        assert run_cfg(cfg) == 0
    finally:
        server.stop()
    assert len(seen) == 4  # before the first generation, then after each step
    base = json.loads((wide_model / "config.json").read_text())
    assert base["tie_word_embeddings"] is False
    full_bytes = sum(p.numel() * 4 for p in _base_params(wide_model).values())
    # the first push is every weight (the server may hold another run's); then all-linear's: the decoder's
    # linears only, the embeddings and the LM head (~half of this tiny model) stay put
    assert seen[0]["bytes"] == full_bytes
    assert all(0 < s["bytes"] < 0.6 * full_bytes for s in seen[1:]), ([s["bytes"] for s in seen], full_bytes)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert seen[0]["digest"][q] == _sha(_base_params(wide_model)[q])  # B starts at 0: the first push is the base
    assert len({s["digest"][q] for s in seen}) == 4  # the adapters moved every step, and so did the server
    assert seen[0]["digest"]["lm_head.weight"] == _sha(_base_params(wide_model)["lm_head.weight"])
    kl = [m["kl"] for m in read_metrics(tmp_path / "sync")]
    assert kl[0] == 0.0 and kl[-1] > 0.0  # the adapter-off reference equals the policy until the adapters move


def _base_params(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _peft_model(model_dir: Path, dtype: torch.dtype, **lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    pm = get_peft_model(m, LoraConfig(task_type="CAUSAL_LM", **lora), autocast_adapter_dtype=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_B." in n:  # B starts at zero: give the merge something to do
                p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    return pm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_tensors_equal_peft_merge_and_fused_groups_go_whole(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    from launchgen.trainers.lora import iter_sync_params

    pm = _peft_model(tiny_model_dir, dtype, r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    merged = copy.deepcopy(pm).merge_and_unload().state_dict()
    sent = dict(iter_sync_params(pm))
    for n, v in sent.items():
        assert v.dtype == dtype and torch.equal(v, merged[n]), n
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"],
                           pm.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)
    per_layer = {n.split(".", 3)[3] for n in sent}
    # q_proj adapted -> the whole qkv group (weights and biases); up_proj -> gate_up; o_proj/down_proj untouched
    assert per_layer == {"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                         "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                         "mlp.gate_proj.weight", "mlp.up_proj.weight"}
    # full=True (a colocated engine re-pulling after level-2 sleep): every base name, merged where adapted
    full = dict(iter_sync_params(pm, full=True))
    assert list(full) == [n for n in merged if n in full] and set(full) == set(merged)
    assert all(torch.equal(full[n], merged[n]) for n in merged)
    # the trainer's own base weights are never merged into
    assert not any(getattr(m, "merged", False) for m in pm.modules())


def test_adapters_compute_in_the_inputs_dtype_and_keep_no_float32_copy_of_it(tiny_model_dir: Path) -> None:
    """bf16 base, fp32 adapters: the adapter matmuls run in bf16 on the bf16 input (what autograd saves for the
    adapter's gradient is that input, not a float32 copy), and the gradients reach the fp32 parameters."""
    from launchgen.trainers.lora import InputDtypeLinear, compute_in_input_dtype

    pm = _peft_model(tiny_model_dir, torch.bfloat16, r=4, lora_alpha=8, target_modules=["up_proj", "down_proj"])
    layer = pm.get_base_model().model.layers[0].mlp.down_proj
    x = torch.randn(15, layer.in_features, dtype=torch.bfloat16, requires_grad=True)

    def saved_dtypes() -> list[torch.dtype]:
        seen: list[torch.dtype] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.numel() == x.numel():
                seen.append(t.dtype)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x).sum().backward()
        return seen

    assert torch.float32 in saved_dtypes()  # PEFT's own casting: the input's float32 copy is kept for backward
    assert compute_in_input_dtype(pm.get_base_model()) == 4  # up/down of each of the 2 layers
    A, B = layer.lora_A["default"], layer.lora_B["default"]
    assert type(A) is InputDtypeLinear and A.weight.dtype == torch.float32
    A.weight.grad = B.weight.grad = None
    assert saved_dtypes() == [torch.bfloat16]
    # the same arithmetic written out: base(x) + B(A(x)) * scaling, adapters cast to bf16
    assert A.weight.grad is not None and A.weight.grad.dtype == torch.float32
    xr = x.detach().clone().requires_grad_(True)
    a, b = A.weight.detach().clone().requires_grad_(True), B.weight.detach().clone().requires_grad_(True)
    ref = layer.base_layer(xr) + (xr @ a.to(torch.bfloat16).T) @ b.to(torch.bfloat16).T * layer.scaling["default"]
    ref.sum().backward()
    assert a.grad is not None and b.grad is not None and B.weight.grad is not None
    assert torch.equal(A.weight.grad, a.grad) and torch.equal(B.weight.grad, b.grad)
    assert compute_in_input_dtype(pm.get_base_model()) == 4  # idempotent


def test_resume_is_exact_and_checkpoints_hold_the_adapter_only(
    tmp_path: Path, wide_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    monkeypatch.syspath_prepend(str(HERE))
    common = dict(num_generations=4, per_device_train_batch_size=8, beta=0.04, save_steps=2, save_final_model=True)
    # (constant LR, toy_cfg's: a linear schedule would depend on max_steps, which the continued run raises)
    assert run_cfg(_cfg(tmp_path, wide_model, "a", max_steps=4, **common)) == 0
    assert run_cfg(_cfg(tmp_path, wide_model, "b", max_steps=2, **common)) == 0
    assert run_cfg(_cfg(tmp_path, wide_model, "b", max_steps=4, **common)) == 0  # continues from checkpoint-2
    full, resumed = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for x, y in zip(full, resumed, strict=True):
        assert (x["loss"], x["grad_norm"], x["reward"], x["kl"]) == (y["loss"], y["grad_norm"], y["reward"], y["kl"])
    fa = load_file(str(tmp_path / "a" / "final" / "adapter_model.safetensors"))
    fb = load_file(str(tmp_path / "b" / "final" / "adapter_model.safetensors"))
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)
    ckpt = load_file(str(tmp_path / "b" / "checkpoint-4" / "model.safetensors"))
    assert ckpt and all(".lora_A." in k or ".lora_B." in k for k in ckpt)  # no frozen base in the checkpoint


def test_adapter_path_continues_from_a_saved_adapter_and_merged_model_is_written(
    tmp_path: Path, wide_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    monkeypatch.syspath_prepend(str(HERE))
    assert run_cfg(_cfg(tmp_path, wide_model, "first", max_steps=2, per_device_train_batch_size=8, num_generations=4,
                        save_final_model=True, peft_over={"save_merged": True})) == 0
    adapter = tmp_path / "first" / "final"
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    t = _trainer(_cfg(tmp_path, wide_model, "second", max_steps=1, per_device_train_batch_size=8, num_generations=4,
                      peft_over={"adapter_path": str(adapter)}))
    try:
        params = {k.replace(".default", ""): v for k, v in t.model.named_parameters() if ".lora_" in k}
        assert set(params) == set(saved) and all(torch.equal(params[k], saved[k]) for k in saved)
        assert all(p.requires_grad for p in params.values())
        # the merged model on disk is PEFT's merge of the saved adapter
        want = _merged_reference(t)
    finally:
        t.close()
    merged = AutoModelForCausalLM.from_pretrained(adapter / "merged", dtype=torch.float32).state_dict()
    assert all(torch.equal(merged[k], want[k]) for k in want)
    with pytest.raises(TrainerSetupError, match="r: 4 here, 16 saved"):
        _trainer(_cfg(tmp_path, wide_model, "third", peft_over={"adapter_path": str(adapter), "r": 4}))


@pytest.mark.parametrize("over,field", [
    ({"model": {"use_liger_kernel": True}}, "use_liger_kernel"),
])
def test_refused_combinations_name_the_field(tmp_path: Path, over: dict[str, Any], field: str) -> None:
    cfg = _cfg(tmp_path, Path("m"), "x")
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    with pytest.raises(ValidationError, match=field):
        TrainerConfig.model_validate(cfg)


@pytest.mark.parametrize("peft_over,match", [
    ({"target_modules": ["lm_head"]}, "LM head or the embeddings"),
    ({"modules_to_save": ["lm_head"]}, "LM head cannot be trained"),
    ({"target_modules": []}, "empty"),
    ({"target_modules": ["q proj"]}, "dotted module name"),
])
def test_bad_peft_fields_are_validation_errors(tmp_path: Path, peft_over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        TrainerConfig.model_validate(_cfg(tmp_path, Path("m"), "x", peft_over=peft_over))


def test_target_entry_matching_nothing_is_a_setup_error(tmp_path: Path, tiny_model_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    with pytest.raises(TrainerSetupError, match="'qq_proj' matches no linear layer"):
        _trainer(_cfg(tmp_path, tiny_model_dir, "x", peft_over={"target_modules": ["q_proj", "qq_proj"]}))


def test_deepspeed_and_fsdp1_are_refused_fsdp2_is_not() -> None:
    from accelerate.utils import DistributedType
    from launchgen.trainers.lora import check_distributed

    class Acc:
        def __init__(self, kind: DistributedType, is_fsdp2: bool = False) -> None:
            self.distributed_type, self.is_fsdp2 = kind, is_fsdp2

    with pytest.raises(TrainerSetupError, match="not DeepSpeed: the merged-weight sync under ZeRO-3"):
        check_distributed(Acc(DistributedType.DEEPSPEED))
    with pytest.raises(TrainerSetupError, match="needs FSDP2"):
        check_distributed(Acc(DistributedType.FSDP))
    for ok in (Acc(DistributedType.FSDP, is_fsdp2=True), Acc(DistributedType.MULTI_GPU), Acc(DistributedType.NO)):
        check_distributed(ok)


def test_new_adapters_do_not_depend_on_the_rank_seed(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each rank is seeded apart (set_seed device_specific) and FSDP2 keeps each rank's shard of its own init:
    the adapters are drawn from the config's seed instead, leaving the run's random stream where it was."""
    from launchgen.trainers.lora import wrap_policy
    from transformers import AutoModelForCausalLM

    cfg = TrainerConfig.model_validate(_cfg(tmp_path, tiny_model_dir, "x"))
    drawn = []
    for rank_seed in (0, 1):
        torch.manual_seed(rank_seed)
        wrapped = wrap_policy(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), cfg)
        drawn.append(({n: p.detach() for n, p in wrapped.named_parameters() if ".lora_A." in n}, torch.rand(1)))
    (a0, after0), (a1, after1) = drawn
    assert a0 and a0.keys() == a1.keys() and all(torch.equal(a0[n], a1[n]) for n in a0)
    torch.manual_seed(1)
    assert torch.equal(after1, torch.rand(1)) and not torch.equal(after0, after1)


def test_checkpoints_of_configs_without_peft_keep_their_fingerprint(tmp_path: Path) -> None:
    """A checkpoint written before the peft section existed has no `peft` key: an unset section must not make
    every such run refuse to resume."""
    from launchgen.trainers.resume import differences, fingerprint

    plain = toy_cfg(tmp_path, Path("m"), "x", "grpo")
    old = fingerprint(TrainerConfig.model_validate(plain))
    assert "peft" not in old
    assert differences(old, fingerprint(TrainerConfig.model_validate({**plain, "peft": None}))) == []
    with_lora = fingerprint(TrainerConfig.model_validate({**plain, "peft": LORA}))
    assert [d[0] for d in differences(old, with_lora)][:1] == ["peft.adapter_path"]
