"""LG815: the sbatch script must fit SLURM's `max_script_size`.

slurmctld refuses a batch script larger than `max_script_size` (SchedulerParameters; 4 MB, 4,194,304 bytes,
when unset), and sbatch says only "Batch job submission failed". The script's size no longer grows with the
trainer node count (runs of alike nodes are folded: launchgen.shared.noderuns), but it still grows with what
is per server rank (one `vllm serve` command line each, for a replica over thousands of nodes) and with what the
spec embeds. This plan-stage check renders the sbatch script and compares its bytes with the default limit, or
with the cluster's own where `check --live` read it (`launchgen.checks.live.probes.cluster_script_limit`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.script.schedulers import SBATCH_MAX_SCRIPT_SIZE
from launchgen.shared.issues import Issue

_MAX_SCRIPT_SIZE = re.compile(r"(?:^|,)\s*max_script_size=(\d+)\s*(?:,|$)")

_doc("LG815", "error", "The sbatch script is larger than SLURM's max_script_size (4,194,304 bytes unless "
     "SchedulerParameters sets it): slurmctld refuses the job at submission. `check --live` reads this cluster's "
     "limit from `scontrol show config`.",
     "Fewer server nodes per replica (each server rank has its own command line in the script), fewer "
     "vllm.replicas, or less embedded text (trainer args, setup lines); or ask the administrators to raise "
     "max_script_size in SchedulerParameters.")


def script_bytes(ctx: Ctx) -> int | None:
    """The size of the sbatch script `render` writes for this plan (None before a plan is built)."""
    if ctx.plan is None:
        return None
    from launchgen.script.render import render_script  # deferred: the spec checks load without the templates

    return len(render_script(ctx.plan, "sbatch").encode())


def max_script_size(scheduler_parameters: str) -> int | None:
    """`max_script_size=N` from SchedulerParameters' value (None where it is not set)."""
    m = _MAX_SCRIPT_SIZE.search(scheduler_parameters.strip())
    return int(m.group(1)) if m else None


def max_script_size_of(config: str) -> int | None:
    """max_script_size from `scontrol show config`'s output (None where SchedulerParameters does not set it)."""
    for line in config.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() == "SchedulerParameters":
            return max_script_size(value)
    return None


def size_field(ctx: Ctx) -> str:
    """The field the finding names: what makes this spec's script large."""
    if ctx.spec.vllm is not None and ctx.spec.vllm.replicas > 1:
        return "vllm.replicas"
    return "vllm.nodes" if len(ctx.layout.server_positions) > 1 else "train.nodes"


@check("LG815", stage="plan")
def script_fits_max_script_size(ctx: Ctx) -> Iterator[Issue]:
    size = script_bytes(ctx)
    limit = SBATCH_MAX_SCRIPT_SIZE if ctx.script_limit is None else ctx.script_limit
    whose = "SLURM's default" if ctx.script_limit is None else "this cluster's (scontrol show config)"
    if size is None or size <= min(limit, SBATCH_MAX_SCRIPT_SIZE):
        return
    if size > limit:
        yield ctx.issue("LG815", size_field(ctx),
                        f"the sbatch script is {size:,} bytes ({size / 2**20:.1f} MiB); {whose} max_script_size is "
                        f"{limit:,} bytes, and slurmctld refuses a larger script at submission")
    else:
        yield ctx.issue("LG815", size_field(ctx),
                        f"the sbatch script is {size:,} bytes, over SLURM's default max_script_size "
                        f"({SBATCH_MAX_SCRIPT_SIZE:,}) but within this cluster's {limit:,} (scontrol show config); "
                        "another cluster may refuse it", severity="info")
