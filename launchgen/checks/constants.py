"""Constants the checks share with docs and tests."""

from __future__ import annotations

from launchgen.shared import ports

# --- constants the checks share with docs and tests ---------------------------------------------------------

# port ranges and the job-id shift: launchgen.shared.ports owns them
PORT_OFFSET_MAX = ports.MAX_OFFSET
PORT_OFFSET_STEP = 10
#: Seconds below which a /health wait is too short for any real model to load (TRL waits 240 s by default).
MIN_HEALTH_TIMEOUT = 120
#: Seconds a trainer needs at least to write a checkpoint after USR2.
MIN_SIGNAL_GRACE = 30
#: `vllm serve` options launchgen generates from typed fields (long and short spellings).
GENERATED_SERVER_FLAGS: dict[str, str] = {
    "--port": "vllm.port",
    "--host": "vllm.bind",
    "--tensor-parallel-size": "vllm.tensor_parallel_size",
    "-tp": "vllm.tensor_parallel_size",
    "--data-parallel-size": "vllm.data_parallel_size",
    "-dp": "vllm.data_parallel_size",
    "--data-parallel-rpc-port": "vllm.dp_rpc_port",
    "--data-parallel-address": "(generated from the allocation)",
    "--weight-transfer-config": "(required by the weight-sync protocol)",
    "--logprobs-mode": "(required: processed_logprobs)",
    "--max-logprobs": "(required: -1)",
    "--max-model-len": "vllm.max_model_len",
    "--gpu-memory-utilization": "vllm.gpu_memory_utilization",
    "--enable-prefix-caching": "vllm.enable_prefix_caching",
    "--no-enable-prefix-caching": "vllm.enable_prefix_caching",
    "--enforce-eager": "vllm.enforce_eager",
    "--trust-remote-code": "model.trust_remote_code",
    "--revision": "model.revision",
    "--dtype": "model.dtype",
    "--model": "model.name_or_path",
    "--data-parallel-size-local": "(generated for multi-node DP)",
    "--data-parallel-start-rank": "(generated for multi-node DP)",
    "--headless": "(generated for multi-node DP)",
    "--api-server-count": "(generated: 1 when DP > 1, so one front end carries the dev routes)",
}
WIDE_BINDS = ("0.0.0.0", "::", "[::]", "*")


def vllm_flag(arg: str) -> str:
    """The option an extra_args word sets, spelled as vLLM's parser reads it: `--max_model_len=8` and
    `--weight_transfer_config.backend x` are `--max-model-len` and `--weight-transfer-config` (vLLM turns `_`
    into `-` in long options and reads `.key` as a field of a config option)."""
    word = arg.strip().split(None, 1)[0] if arg.strip() else ""
    flag = word.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].split(".", 1)[0].replace("_", "-")
    return flag
