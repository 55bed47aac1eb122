"""LoRA under FSDP2: two real processes over gloo (accelerate's FSDP2 path on CPU, `lora_dist_worker.py`), GRPO
with beta > 0 and a weight push after every step, against the same run under DDP and a resumed copy of it."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from toy_runs import read_metrics, toy_cfg
from vllm_standin.harness import free_port

HERE = Path(__file__).parent
WORKER = HERE / "lora_dist_worker.py"


def _launch(mode: str, cfg: dict[str, Any], tmp_path: Path, name: str) -> subprocess.Popen[str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(WORKER), mode, str(path), str(tmp_path / f"{name}.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(proc: subprocess.Popen[str], tmp_path: Path, name: str) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=500)
    assert proc.returncode == 0, out[-4000:]
    report: dict[str, Any] = json.loads((tmp_path / f"{name}.json").read_text())
    assert report["exit"] == 0
    return report


def _adapter(final: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(final / "adapter_model.safetensors"))


@pytest.mark.slow
def test_fsdp2_lora_syncs_merged_weights_matches_ddp_and_resumes_exactly(tmp_path: Path, wide_model: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    def cfg(out: str) -> dict[str, Any]:
        # generation: the hf sampler behind a recorder posing as a vLLM server (see the worker), so every step
        # pushes merged weights and a resume replays the same samples
        return toy_cfg(tmp_path, wide_model, out, "grpo", num_generations=4, per_device_train_batch_size=8,
                       beta=0.04, max_steps=4, save_steps=2, save_final_model=True,
                       peft={"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "save_merged": True},
                       generation={"backend": "vllm_server", "max_completion_length": 6})

    fsdp_proc, ddp_proc = _launch("fsdp", cfg("fsdp"), tmp_path, "fsdp"), _launch("ddp", cfg("ddp"), tmp_path, "ddp")
    fsdp, ddp = _finish(fsdp_proc, tmp_path, "fsdp"), _finish(ddp_proc, tmp_path, "ddp")

    # only the adapters train (and have AdamW state); every parameter, frozen or not, is an FSDP2 shard
    assert fsdp["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in fsdp["trainable"])
    assert fsdp["optimized"] == fsdp["trainable"] and set(fsdp["trainable"]) < set(fsdp["sharded"])
    # before the first generation, then after each step: PEFT's merge of the gathered model, bit for bit
    syncs = fsdp["syncs"]
    assert len(syncs) == 5 and all(s["bit_exact"] and s["frozen_base_unchanged"] for s in syncs), syncs
    assert [s["names"] for s in syncs] == [s["names"] for s in ddp["syncs"]]
    # the first push is every weight; the later ones all-linear's modules only (no embeddings, no LM head)
    assert "lm_head.weight" in syncs[0]["names"]
    assert not any(n.startswith(("lm_head", "model.embed_tokens")) for s in syncs[1:] for n in s["names"])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert len({s["digest"][q] for s in syncs}) == 5  # the adapters moved every step, and so did the pushed weight

    # the loss trajectory of DDP over the same two processes: the same samples, sums in another order
    f_metrics, d_metrics = read_metrics(tmp_path / "fsdp"), read_metrics(tmp_path / "ddp")
    assert [m["step"] for m in f_metrics] == [1, 2, 3, 4]
    for f, d in zip(f_metrics, d_metrics, strict=True):
        assert f["reward"] == d["reward"], (f, d)
        for key in ("loss", "kl", "grad_norm"):
            assert math.isclose(f[key], d[key], rel_tol=1e-4, abs_tol=1e-6), (key, f, d)

    # checkpoints: the adapter and its optimizer state only (no sharded model, no frozen base)
    ck = tmp_path / "fsdp" / "checkpoint-2"
    saved = load_file(str(ck / "model.safetensors"))
    assert sorted(saved) == fsdp["trainable"]
    assert not [p.name for p in ck.iterdir() if "fsdp" in p.name or p.is_dir()]
    assert ck.joinpath("optimizer.bin").is_file()

    # resume from checkpoint-2 in a new directory: steps 3-4 and the final adapter exactly as the whole run
    (tmp_path / "resumed").mkdir()
    shutil.copytree(ck, tmp_path / "resumed" / "checkpoint-2")
    resumed = _finish(_launch("fsdp", cfg("resumed"), tmp_path, "resumed"), tmp_path, "resumed")
    r_metrics = read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in r_metrics] == [3, 4]
    for a, b in zip(f_metrics[2:], r_metrics, strict=True):
        assert (a["loss"], a["grad_norm"], a["reward"], a["kl"]) == (b["loss"], b["grad_norm"], b["reward"], b["kl"])
    first = resumed["syncs"][0]["digest"]  # the first push after resume: step 2's weights
    assert {n: first[n] for n in syncs[2]["digest"]} == syncs[2]["digest"]
    fa, fb = _adapter(tmp_path / "fsdp" / "final"), _adapter(tmp_path / "resumed" / "final")
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)

    # final/: the PEFT adapter; final/merged: PEFT's merge of it
    final = tmp_path / "fsdp" / "final"
    base = AutoModelForCausalLM.from_pretrained(wide_model, dtype=torch.float32)
    want = PeftModel.from_pretrained(base, str(final)).merge_and_unload().state_dict()
    merged = load_file(str(final / "merged" / "model.safetensors"))
    assert set(merged) == set(load_file(str(wide_model / "model.safetensors")))
    assert all(torch.equal(merged[k], want[k]) for k in merged)
