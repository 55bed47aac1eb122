"""One rank of a two-process LoRA run on CPU (gloo), launched by `torch.distributed.run` from test_lora_fsdp.py.

    python -m torch.distributed.run --nproc_per_node 2 lora_dist_worker.py fsdp|ddp CONFIG.yaml REPORT.json

`ddp` is the plain CPU accelerator (DDP over gloo). `fsdp` is accelerate's FSDP2 on the same group, configured
as `accelerate launch` configures it from the fsdp_config launchgen generates for train.backend fsdp
(transformer-based wrap, reshard after forward, sharded state dict, CPU-RAM-efficient loading). accelerate
enables FSDP for GPU process groups only, so the state is switched to FSDP after set-up; everything after that
(loading, prepare, backward, clip, save) is accelerate's and transformers' FSDP2 path.

The generation backend is the plain `hf` one behind a recorder that claims to be a vLLM server, so the trainer
pushes weights after every step (and before the first generation) while sampling stays reproducible across a
resume. At every push rank 0 checks the pushed tensors bit for bit against PEFT's `merge_and_unload` of the
whole trainer model, gathered, and that the frozen base still equals the checkpoint on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import yaml


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _accelerator(mode: str) -> Any:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from launchgen.planning.accelerate_config import accelerate_config

    if mode == "fsdp":
        # What `accelerate launch` exports from launchgen's fsdp_config (accelerate.utils.launch); transformers
        # reads it too (cpu_ram_efficient_loading: ranks other than 0 load the model on the meta device).
        fsdp = accelerate_config("fsdp", "fp32", 1, 2, "cuda")["fsdp_config"]
        os.environ.update({"ACCELERATE_USE_FSDP": "true", "FSDP_SYNC_MODULE_STATES": "true",
                           **{k.upper(): str(v).lower() if isinstance(v, bool) else str(v) for k, v in fsdp.items()}})
    acc = Accelerator(cpu=True)
    if mode == "fsdp":
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            shared["distributed_type"] = DistributedType.FSDP
        AcceleratorState._shared_state["fsdp_plugin"] = FullyShardedDataParallelPlugin()  # from the environment
        assert acc.is_fsdp2 and acc.state.fsdp_plugin.cpu_ram_efficient_loading
    return acc


def _gathered_state(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter of the trainer's model as a full tensor (collective: all ranks, same order)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        out[name.removeprefix("module.")] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def _merged_reference(cfg: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT's merge_and_unload of a fresh, unsharded PEFT model holding the gathered tensors."""
    import peft
    from transformers import AutoModelForCausalLM

    p = cfg.peft
    with torch.random.fork_rng(devices=[]):  # the adapters' init must not move the run's sampling on rank 0
        base = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, dtype=torch.float32)
        pm = peft.get_peft_model(base, peft.LoraConfig(r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout,
                                                       target_modules=p.target_modules, task_type="CAUSAL_LM"))
    result = pm.load_state_dict(state, strict=False)
    assert not result.unexpected_keys and not [k for k in result.missing_keys if "rotary" not in k], result
    return {n: v.detach() for n, v in pm.merge_and_unload().state_dict().items()}


def main() -> int:
    mode, config_path, report_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    from launchgen.trainers.core import Trainer
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation import backends
    from launchgen.trainers.generation.hf_generate import HFGenerateBackend
    from safetensors.torch import load_file

    cfg = TrainerConfig.model_validate(yaml.safe_load(config_path.read_text()))
    acc = _accelerator(mode)
    disk = load_file(str(Path(cfg.model.name_or_path) / "model.safetensors"))
    report: dict[str, Any] = {"mode": mode, "syncs": []}
    holder: dict[str, Any] = {}

    class RecordingServer:
        """The hf backend for generation; `sync_weights` walks the pushed iterator as the vLLM server backend
        does (every rank, since each step gathers) and rank 0 judges what it received."""

        def __init__(self, inner: HFGenerateBackend) -> None:
            self.inner = inner

        def generate(self, prompt_ids: Any, params: Any) -> Any:
            return self.inner.generate(prompt_ids, params)

        def sync_weights(self, named_params: Any) -> None:
            sent = {n: t.detach().clone() for n, t in named_params}
            model = holder["trainer"].model
            state = _gathered_state(model)
            if not acc.is_main_process:
                return
            want = _merged_reference(cfg, state)
            base = {n.replace("base_model.model.", "", 1).replace(".base_layer.", "."): t
                    for n, t in state.items() if ".lora_" not in n}
            report["syncs"].append({
                "names": sorted(sent),
                "bit_exact": all(torch.equal(t, want[n]) for n, t in sent.items()),
                "digest": {n: _sha(t) for n, t in sent.items()},
                "frozen_base_unchanged": set(base) == set(disk) and all(torch.equal(base[n], disk[n]) for n in disk),
            })

        def close(self) -> None:
            self.inner.close()

    def make_backend(cfg: Any, accelerator: Any, model: Any, tokenizer: Any) -> Any:
        return RecordingServer(HFGenerateBackend.from_config(cfg, accelerator, model, tokenizer))

    backends.make_backend = make_backend
    trainer = Trainer(cfg, acc)
    holder["trainer"] = trainer
    trainer.signals.install()
    try:
        trainer.setup()
        named = dict(trainer.model.named_parameters())
        report["trainable"] = sorted(n for n, p in named.items() if p.requires_grad)
        optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
        report["optimized"] = sorted(n for n, p in named.items() if id(p) in optimized)
        report["sharded"] = sorted(n for n, p in named.items() if hasattr(p, "full_tensor"))
        report["exit"] = trainer.train()
    finally:
        trainer.signals.uninstall()
        trainer.close()
    if acc.is_main_process:
        report_path.write_text(json.dumps(report))
    acc.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
