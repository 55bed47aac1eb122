"""GRPO with LoRA (peft, all-linear) against the shared real vLLM server: the server follows base + adapter.

The bundled CLI trains as in test_training.py, with the server first holding other weights. The first push is
every weight (merged), each later push the merged adapted modules only, which real vLLM's layerwise reload
applies while keeping every layer it receives nothing for (embeddings, norms, LM head). Checked: each step's
`sampling/sampling_logp_difference/max` (the server samples from the merged policy), the weight version, the
server's log-probs after the run (the saved merged model's, not the base's), the adapter-sized checkpoint, and
the server's effective weights against the saved merged model bit for bit (`worker_ext.py`). The same for the
colocated engine (`generation.backend: vllm_colocate`, the trainer in the server venv as in test_colocate.py),
whose pushes go through vLLM's in-place `reload_weights`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from launchgen.trainers.generation.protocol import SamplingParams
from launchgen.trainers.generation.vllm_client import VLLMClient
from safetensors.torch import load_file

from vllm_real.common import (
    LOGPROB_TOL,
    VLLM_FUSED,
    connect,
    load_model,
    max_logprob_gap,
    perturb,
    train,
    trainer_config,
    vllm_layout,
)
from vllm_real.harness import REPO_ROOT, RealServer, free_port, server_env
from vllm_real.test_colocate import _config as colocate_config
from vllm_real.test_training import STEPS
from vllm_real.worker_ext import DIGEST_METHOD, tensor_digest

pytestmark = pytest.mark.vllm_real

LORA = {"r": 4, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "save_merged": True}


def _client(server: RealServer) -> VLLMClient:
    return VLLMClient("127.0.0.1", server.port, control_timeout=60, request_timeout=120)


@pytest.fixture(scope="module")
def lora_run(shared_server: RealServer, real_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One LoRA run for the tests below (which read the server it leaves behind, so nothing else runs between)."""
    if not shared_server.alive():
        pytest.fail(f"the shared vLLM server died in an earlier test:\n{shared_server.log_text()}", pytrace=False)
    tmp = tmp_path_factory.mktemp("lora-real")
    cfg = trainer_config(tmp, real_model, shared_server, "grpo", STEPS)
    cfg["peft"] = LORA
    # Another run's weights on the server, embeddings, norms and LM head included: the adapter pushes leave
    # those out, so the run's first push must bring them back to the policy's.
    stale = load_model(real_model)
    perturb(stale, seed=12)
    other = connect(shared_server)
    other.sync_weights(iter(stale.named_parameters()))
    other.close()
    metrics = train(tmp, cfg)
    return {"metrics": metrics, "final": Path(cfg["output_dir"]) / "final"}


def test_grpo_lora_trains_and_the_server_follows_the_merged_policy(
    lora_run: dict[str, Any], shared_server: RealServer, real_model: Path
) -> None:
    metrics = lora_run["metrics"]
    assert len(metrics) == STEPS
    for m in metrics:
        assert m["time/sync_weights"] > 0
        # the trainer's recompute with the adapters against the server's sampler: the merged policy, each step
        assert m["sampling/sampling_logp_difference/max"] < 1e-4, m
    client = _client(shared_server)
    assert client.weight_version() == str(STEPS + 1)  # the full push before the first generation, one per step
    final: Path = lora_run["final"]
    merged, base = load_model(final / "merged"), load_model(real_model)
    prompt = [31, 32, 33, 34, 35]
    res = client.completions(str(real_model), [prompt], 2, SamplingParams(max_tokens=6, temperature=1.0,
                                                                           extra={"seed": 5}))
    assert res.logprobs is not None
    assert max_logprob_gap(merged, prompt, res.completion_ids, res.logprobs, 1.0) < LOGPROB_TOL
    assert max_logprob_gap(base, prompt, res.completion_ids, res.logprobs, 1.0) > 1e-3  # the adapters moved
    # the artefact is the adapter: r * (in + out) float32 numbers per adapted linear, plus the file's header
    linears = {n: t for n, t in load_file(str(real_model / "model.safetensors")).items()
               if ".layers." in n and n.endswith("proj.weight")}
    adapter = sum(LORA["r"] * (t.shape[0] + t.shape[1]) * 4 for t in linears.values())
    size = (final / "adapter_model.safetensors").stat().st_size
    assert adapter < size < adapter + 32 * 1024, (size, adapter)
    assert size < (real_model / "model.safetensors").stat().st_size / 10


def test_the_servers_weights_are_the_merged_model_bit_for_bit(
    lora_run: dict[str, Any], shared_server: RealServer, real_model: Path
) -> None:
    """vLLM's tensors (fused qkv_proj / gate_up_proj, linears read back through the CPU kernel) against PEFT's
    merge_and_unload of the final adapter, which the last push sent; every other tensor is the base model's."""
    got: dict[str, str] = _client(shared_server).collective_rpc(DIGEST_METHOD)[0]
    merged = vllm_layout(load_file(str(lora_run["final"] / "merged" / "model.safetensors")))
    base = vllm_layout(load_file(str(real_model / "model.safetensors")))
    assert set(got) == set(merged), sorted(set(got) ^ set(merged))
    differ = sorted(n for n, t in merged.items() if got[n] != tensor_digest(t))
    assert not differ, differ
    adapted = {n for n in merged if n.endswith(".weight") and n.split(".")[-2] in
               (*VLLM_FUSED, "o_proj", "down_proj")}
    moved = {n for n, t in merged.items() if not torch.equal(t, base[n])}
    assert moved == adapted, sorted(moved ^ adapted)  # so the comparison above covered changed tensors


def test_colocated_engine_follows_the_merged_policy_and_holds_its_weights(
    real_venv: Path, real_model: Path, tmp_path: Path
) -> None:
    """The in-process `vllm.LLM` (colocate) with LoRA: the first push is every weight through vLLM's in-place
    reload, the later ones the adapted modules only; after the run the engine's model is the merged one."""
    cfg = colocate_config(tmp_path, real_model)
    cfg.update(peft=LORA, save_final_model=True, max_steps=2)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    digests = tmp_path / "engine-digests.json"
    env = server_env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests" / "trainers"), str(REPO_ROOT / "tests")]))
    run = subprocess.run([str(real_venv / "bin" / "python"), str(Path(__file__).with_name("colocate_digest.py")),
                          str(digests), "--config", str(path)],
                         env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["sampling/sampling_logp_difference/max"] < 1e-4, m  # the engine samples from the merged policy
        assert m["grad_norm"] > 0
    got: dict[str, str] = json.loads(digests.read_text())
    merged = vllm_layout(load_file(str(tmp_path / "out" / "final" / "merged" / "model.safetensors")))
    assert set(got) == set(merged), sorted(set(got) ^ set(merged))
    assert not sorted(n for n, t in merged.items() if got[n] != tensor_digest(t))
    base = vllm_layout(load_file(str(real_model / "model.safetensors")))
    assert any(not torch.equal(t, base[n]) for n, t in merged.items())  # trained: not the file's weights
