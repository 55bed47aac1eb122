"""File checks of `launchgen check`: what the spec names on disk (rewards' modules, data, the model directory).

These run in the `files` stage (`checks.run_checks(files=True)`, which `check` uses): `plan` and `render` do not
read the user's files, so a script can be rendered on a machine that lacks the data. Relative paths are resolved
from the current directory, which is where the job runs when it is submitted from the same place.
`setup` is the `check --live` probe of what slurm.setup sources; `staleness` holds the spec-stage checks of
generation.max_staleness (LG350-LG353), `grpo_options` those of GRPO's loss options (LG612-LG616), `replicas`
those of vllm.replicas (LG220-LG223) and `peft` the LoRA/PEFT checks. Nothing here imports torch, transformers or
datasets; data files are peeked at, never read whole.
"""

from __future__ import annotations

from launchgen.preflight import data, grpo_options, model, peft, replicas, rewards, setup, staleness

__all__ = ["data", "grpo_options", "model", "peft", "replicas", "rewards", "setup", "staleness"]
