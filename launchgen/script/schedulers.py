"""What each scheduler decides in the job script: one frozen profile per scheduler, read by the templates.

The templates never compare the scheduler's name; every place where an sbatch script and a `--bash` script
differ reads a field of the profile that `render` puts in the context as `sched`. A new scheduler is one
more `SchedulerProfile` in `PROFILES` (and its top-level template); a new difference is one more field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SchedulerName = Literal["sbatch", "bash"]

#: SLURM's default max_script_size (slurm.conf SchedulerParameters): slurmctld refuses a larger batch script
#: (LG815 for a job's script, LG024 for a sweep's array script)
SBATCH_MAX_SCRIPT_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class SchedulerProfile:
    name: SchedulerName
    """`LG_SCHEDULER` in the script (what `launchgen status` and the steps see)."""
    template: str
    """The top-level template: sbatch adds the `#SBATCH` block to the common body."""
    render_flag: str
    """The `launchgen render` option that picks this scheduler (the header's regenerate line)."""
    usage: str
    """How to run the script (the header's usage line)."""
    slurm_env: bool
    """Job and node identity come from SLURM's variables (`SLURM_JOB_ID`, `SLURM_JOB_NAME`,
    `SLURM_ARRAY_JOB_ID`, `SLURM_RESTART_COUNT`, `SLURMD_NODENAME`); without them the job id and the
    node are `local`, the restart count is the attempt and the port offset derives from the script's PID."""
    loopback: bool
    """Everything runs on this one machine: one node called `local`, every address 127.0.0.1 (no
    `scontrol show hostnames`, no name resolution); a multi-node plan is refused (LG909)."""
    srun_steps: bool
    """Roles run as SLURM job steps (`srun --overlap -w NODES`), signalled through `scancel --signal
    JOB.STEP` with each step recording its id; otherwise each role is a `setsid` process group on this
    machine, signalled as a group, whose leftover children are killed after it stops."""
    requeue: bool
    """The job can requeue itself (`scontrol requeue`) when `slurm.max_restarts` allows; otherwise a
    stopped run is resumed by running the script again."""
    batch_script_copy: bool
    """The job directory's copy of the script comes from `scontrol write batch_script` (the batch host's
    `$0` is not reliable across SLURM versions); otherwise from `${BASH_SOURCE[0]}`."""


PROFILES: dict[SchedulerName, SchedulerProfile] = {
    "sbatch": SchedulerProfile(
        name="sbatch", template="sbatch.j2", render_flag="", usage="sbatch FILE",
        slurm_env=True, loopback=False, srun_steps=True, requeue=True, batch_script_copy=True,
    ),
    "bash": SchedulerProfile(
        name="bash", template="bash.j2", render_flag="--bash", usage="bash FILE   (one machine, no SLURM)",
        slurm_env=False, loopback=True, srun_steps=False, requeue=False, batch_script_copy=False,
    ),
}


def profile(name: SchedulerName) -> SchedulerProfile:
    return PROFILES[name]
