"""Containers per role: each runtime's command-line syntax, and the container part of a role's plan.

The plan already gives each step an argv that its step script `exec`s (or runs), so a runtime that wraps a
command (apptainer/singularity `exec`, charliecloud `ch-run`) is a prefix on that argv: the host-side step keeps
the node discovery, CUDA_VISIBLE_DEVICES, pid files and logs, and the process inside is the step's own (neither
runtime starts a PID namespace by default, so pid files and `kill` reach it; `ch-run` execs in place and
apptainer's starter forwards signals). pyxis instead takes its options on the step's `srun` line and runs the
whole step script inside the image, which must then have `bash` (every NGC image does).

Whatever reaches a shell goes through the plan's words (`render.word` quotes them); this module only decides
which words. Nothing here reads files (the checks in `launchgen.checks.spec.containers` do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from launchgen.input.spec import ContainerSection, Spec
from launchgen.planning.model import Argv, ContainerPlan, EnvVar, Ref, Word
from launchgen.script import scriptvars as V

RoleName = Literal["server", "trainer"]

#: What every container mounts at the same path: the submit directory (relative paths in the spec), the Hugging
#: Face cache and the job directory (configs, logs, pid files, checkpoints); the batch script sets the variables.
#: The job directory comes last: under the default relative job.output_dir it lies inside the submit directory,
#: whose mount then already provides its mount point (ch-run cannot create one in a read-only image).
STANDARD_MOUNTS: tuple[Ref, ...] = (Ref(V.LG_SUBMIT_DIR), Ref(V.LG_HF_CACHE), Ref(V.LG_JOB_DIR))
#: URI schemes of registry images (apptainer's; enroot's `docker://`); pyxis also takes a bare `registry#image`.
REGISTRY_SCHEMES = ("docker://", "oras://", "library://", "shub://", "docker-daemon:", "dockerd://")


@dataclass(frozen=True)
class Runtime:
    """One runtime's syntax and where its options go."""

    name: str
    #: the program `check --live` looks for (pyxis: an `srun` whose --help shows --container-image)
    program: str
    #: True: a prefix on the step's command (the step script stays on the host); False: options on `srun`
    wraps: bool
    #: the runtime splits a mount list on commas (pyxis, apptainer), so a path must not hold one
    comma_lists: bool
    #: a mount may be read-only (`SRC:DST:ro`)
    read_only_mounts: bool
    #: `ENV_PREFIX<NAME>` in the host environment sets NAME inside, over the image's value ("" = no such rule)
    env_prefix: str
    #: the flag that gives the container the host's NVIDIA driver and devices (empty: the runtime takes none)
    gpu_flags: tuple[str, ...]
    needs_slurm: bool


RUNTIMES: dict[str, Runtime] = {
    "pyxis": Runtime("pyxis", "srun", wraps=False, comma_lists=True, read_only_mounts=True, env_prefix="",
                     gpu_flags=(), needs_slurm=True),
    "apptainer": Runtime("apptainer", "apptainer", wraps=True, comma_lists=True, read_only_mounts=True,
                         env_prefix="APPTAINERENV_", gpu_flags=("--nv",), needs_slurm=False),
    "singularity": Runtime("singularity", "singularity", wraps=True, comma_lists=True, read_only_mounts=True,
                           env_prefix="SINGULARITYENV_", gpu_flags=("--nv",), needs_slurm=False),
    "charliecloud": Runtime("charliecloud", "ch-run", wraps=True, comma_lists=False, read_only_mounts=False,
                            env_prefix="", gpu_flags=(), needs_slurm=False),
}


def role_container(spec: Spec, role: RoleName) -> tuple[ContainerSection | None, str]:
    """The role's own container, else the job-wide one, with the spec path it comes from."""
    own = spec.vllm.container if role == "server" and spec.vllm is not None else None
    if role == "trainer":
        own = spec.train.container
    if own is not None:
        return own, ("vllm" if role == "server" else "train") + ".container"
    return spec.container, "container"


def _mount_options(runtime: Runtime, mounts: tuple[Word, ...]) -> list[Word]:
    out: list[Word] = []
    for m in mounts:
        if runtime.name == "pyxis":
            # one option per mount: pyxis adds up repeated --container-mounts (args.c, add_mount)
            out.append(Ref(m.var, "--container-mounts=") if isinstance(m, Ref) else f"--container-mounts={m}")
        elif runtime.name == "charliecloud":
            out.append(Ref(m.var, "--bind=") if isinstance(m, Ref) else f"--bind={m}")
        else:
            out += ["--bind", m]
    return out


def container_plan(c: ContainerSection, source: str, *, uses_gpus: bool, command_env: tuple[EnvVar, ...]
                   ) -> ContainerPlan:
    """The container part of a role's plan; `command_env` is what the step exports for its command."""
    rt = RUNTIMES[c.runtime]
    # SRC[:DST[:ro]] is every runtime's own spelling of one bind; the checks refuse what one cannot take
    mounts: tuple[Word, ...] = (*STANDARD_MOUNTS, *c.mounts)
    gpus = uses_gpus if c.gpus is None else c.gpus
    opts = _mount_options(rt, mounts)
    env: tuple[EnvVar, ...] = ()
    if rt.env_prefix:
        names = [e.name for e in command_env] + [n for n in c.env if n not in {e.name for e in command_env}]
        # set from the step's own value at run time ("${NAME-}": a user's name may be unset on the node)
        env = tuple(EnvVar(rt.env_prefix + n, f'"${{{n}-}}"', False, source) for n in names)
    if rt.wraps:
        if rt.name == "charliecloud":
            prefix: Argv = ("ch-run", *opts, *c.extra_args, c.image, "--")
        else:
            prefix = (rt.program, "exec", *(rt.gpu_flags if gpus else ()), *opts, *c.extra_args, c.image)
        return ContainerPlan(c.runtime, c.image, mounts, gpus, prefix, (), env, source)
    srun: list[Word] = [f"--container-image={c.image}", *opts, Ref(V.LG_SUBMIT_DIR, "--container-workdir=")]
    if c.env:
        srun.append("--container-env=" + ",".join(c.env))
    srun += c.extra_args
    return ContainerPlan(c.runtime, c.image, mounts, gpus, (), tuple(srun), env, source)
