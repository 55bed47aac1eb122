"""Environment variables launchgen sets for each role itself, so `slurm.env` may not set them (LG807).

The checks refuse them in the spec; the plan asserts they are absent before it adds the user's variables.
"""

from __future__ import annotations

from launchgen.shared.jobdir import (
    RESERVED_ENV_PREFIXES,  # the job-directory contract owns the LAUNCHGEN_* names
)

RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "VLLM_SERVER_DEV_MODE", "VLLM_HOST_IP"})


def is_reserved(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)
