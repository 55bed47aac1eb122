"""Heterogeneous jobs: the vLLM server on a partition, account, QOS or GPU type of its own.

When `vllm.partition` / `account` / `qos` / `gpu_type` differ from `slurm`'s, the job is a SLURM heterogeneous
job (`#SBATCH hetjob`): component 0 holds the trainer nodes (node positions 0..T-1, as the layout places them),
component 1 the dedicated server nodes (positions T..). The batch script runs in component 0; it lists the nodes
of both components in that order (`SLURM_JOB_NODELIST_HET_GROUP_<k>`), so every position means what it means in
a plain job; a step runs in its component (`srun --het-group=<k>`), and a component-1 step is signalled under
that component's job id (`SLURM_JOB_ID_HET_GROUP_1.<step>`: the leader's id does not reach it, measured on
Slurm 22.05). The checks (LG260-LG261) refuse what SLURM cannot express.
"""

from __future__ import annotations

from launchgen.input.spec import Spec

#: the component of each role (the batch script runs in the trainers' one)
TRAINER_GROUP = 0
SERVER_GROUP = 1
#: the `vllm` fields that may give the server a component of its own, and the `slurm` field each overrides
SERVER_FIELDS = ("partition", "account", "qos", "gpu_type")


def server_overrides(spec: Spec) -> dict[str, str]:
    """The server's own values (`vllm.<field>` set and different from `slurm.<field>`)."""
    v = spec.vllm
    if v is None:
        return {}
    out = {}
    for name in SERVER_FIELDS:
        value = getattr(v, name)
        if value is not None and value != getattr(spec.slurm, name):
            out[name] = value
    return out


def is_hetjob(spec: Spec) -> bool:
    """The spec renders a heterogeneous job (the checks make sure the server then has nodes of its own)."""
    return spec.vllm is not None and spec.vllm.mode == "server" and bool(server_overrides(spec))
