"""Checks of `container`, `vllm.container` and `train.container` (LG250-LG259), and the `check --live` probe of
each runtime.

The runtimes' syntax is `launchgen.planning.containers`; these checks say what a runtime cannot take (an image kind, a
mount option), what is missing on disk (the files stage: a local image, a mount's source, a charliecloud image
directory's mount points) and, live, whether the runtime is there. The spec already refuses what no runtime takes
(relative or blank-holding mount paths, `:` or `,` inside a path).
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.input.spec import ContainerSection, Spec
from launchgen.planning.containers import REGISTRY_SCHEMES, RUNTIMES, RoleName, role_container
from launchgen.shared.issues import Issue

_doc("LG252", "error", "The container image is of a kind its runtime cannot run (a `.sif` under pyxis or "
     "charliecloud, a registry URI under charliecloud, enroot's `registry#image` under apptainer).",
     "pyxis: an enroot URI or a `.sqsh` file; apptainer/singularity: a `.sif`, a sandbox directory or "
     "`docker://...`; charliecloud: an image directory or SquashFS file (`ch-image pull` then `ch-convert`).")
_doc("LG253", "error", "A container mount has a `ro`/`rw` option, which charliecloud's `ch-run --bind` does not take.",
     "Write the mount as SRC or SRC:DST (ch-run binds read-write), or use a runtime that takes the option.")
_doc("LG254", "error", "A pyxis container in a script rendered with --bash: pyxis runs containers only through "
     "`srun` (raised by `render --bash`).",
     "Render without --bash, or use apptainer or charliecloud for a run on this machine.")
_doc("LG255", "warning", "container.gpus is false for a role that runs on CUDA under apptainer/singularity: "
     "without `--nv` the container sees no NVIDIA driver.",
     "Remove `gpus: false` (the default adds `--nv` for a CUDA role).")
_doc("LG259", "warning", "vllm.container is set but no server step runs (vllm.mode colocate: vLLM runs inside the "
     "trainer processes, in train.container).",
     "Remove vllm.container, or give the trainer's image vLLM.")


_doc("LG262", "error", "container.extra_args give apptainer/singularity a PID namespace (`--pid`, `-p`, "
     "`--containall`, `-C`): the trainer's pid files would name processes the host-side signal step cannot reach, "
     "so USR2 (checkpoint before the time limit) and a graceful stop would miss them.",
     "Remove the option; launchgen relies on the host's PID namespace (`--contain` alone is fine).")

#: apptainer/singularity options that start a PID namespace (`--containall` implies `--pid`)
PID_NAMESPACE_OPTIONS = ("--pid", "-p", "--containall", "-C")


def roles(spec: Spec) -> list[RoleName]:
    """The roles that run a step: the trainer, and the server in server mode."""
    server: list[RoleName] = ["server"] if spec.vllm is not None and spec.vllm.mode == "server" else []
    return [*server, "trainer"]


def _role_uses_cuda(spec: Spec, role: RoleName) -> bool:
    if role == "server":
        return spec.vllm is not None and spec.vllm.device == "cuda"
    return spec.train.device == "cuda"


def containers_of(spec: Spec) -> list[tuple[RoleName, ContainerSection, str]]:
    """(role, its container, the spec path the container comes from) for every role that runs in one."""
    out = []
    for role in roles(spec):
        c, source = role_container(spec, role)
        if c is not None:
            out.append((role, c, source))
    return out


def image_is_path(c: ContainerSection) -> bool:
    """The image names a file or directory (as opposed to a registry reference or charliecloud storage name)."""
    img = c.image
    if img.startswith(REGISTRY_SCHEMES):
        return False
    if c.runtime == "pyxis":
        return img.startswith(("/", "."))  # pyxis' own rule: anything else is an enroot URI
    if c.runtime == "charliecloud":
        return "/" in img or img.startswith(".")  # a bare name is an image in ch-image's storage
    return True  # apptainer: anything without a scheme is a file or sandbox directory


def _uniq(items: list[tuple[RoleName, ContainerSection, str]]) -> Iterator[tuple[ContainerSection, str]]:
    """Each container once (the job-wide one serves both roles)."""
    seen: set[str] = set()
    for _, c, source in items:
        if source not in seen:
            seen.add(source)
            yield c, source


@check("LG252", "LG253")
def runtime_takes_image_and_mounts(ctx: Ctx) -> Iterator[Issue]:
    for c, source in _uniq(containers_of(ctx.spec)):
        img, why = c.image, None
        if c.runtime == "pyxis" and (img.endswith(".sif") or (img.startswith(REGISTRY_SCHEMES)
                                                               and not img.startswith("docker://"))):
            why = "pyxis (enroot) runs an enroot URI or a .sqsh file"
        elif c.runtime == "charliecloud" and (img.startswith(REGISTRY_SCHEMES) or img.endswith(".sif")):
            why = "ch-run runs an image directory or SquashFS file (pull it with ch-image first)"
        elif c.runtime in ("apptainer", "singularity") and "#" in img and not img.startswith(REGISTRY_SCHEMES):
            why = f"{c.runtime} reads a registry image as docker://REGISTRY/IMAGE, not enroot's REGISTRY#IMAGE"
        if why:
            yield ctx.issue("LG252", f"{source}.image", f"image {img!r} under runtime {c.runtime}: {why}")
        if not RUNTIMES[c.runtime].read_only_mounts:
            for k, m in enumerate(c.mounts):
                if m.count(":") == 2:
                    yield ctx.issue("LG253", f"{source}.mounts.{k}", f"mount {m!r}: ch-run --bind takes SRC[:DST]")


@check("LG255")
def apptainer_gpus_off(ctx: Ctx) -> Iterator[Issue]:
    for role, c, source in containers_of(ctx.spec):
        if c.gpus is False and RUNTIMES[c.runtime].gpu_flags and _role_uses_cuda(ctx.spec, role):
            yield ctx.issue("LG255", f"{source}.gpus", f"the {role} runs on CUDA but {source}.gpus is false")


@check("LG259")
def server_container_unused(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.container is not None and v.mode != "server":
        yield ctx.issue("LG259", "vllm.container", f"vllm.mode is {v.mode}: there is no server step to contain")


@check("LG262")
def no_pid_namespace(ctx: Ctx) -> Iterator[Issue]:
    for c, source in _uniq(containers_of(ctx.spec)):
        if c.runtime not in ("apptainer", "singularity"):
            continue
        for k, arg in enumerate(c.extra_args):
            if arg in PID_NAMESPACE_OPTIONS or (arg.startswith("-") and not arg.startswith("--")
                                                and ("p" in arg[1:] or "C" in arg[1:]) and len(arg) > 2):
                yield ctx.issue("LG262", f"{source}.extra_args.{k}", f"{arg!r} starts a PID namespace")
