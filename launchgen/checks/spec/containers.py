"""Checks of `container`, `vllm.container` and `train.container` (LG250-LG259), and the `check --live` probe of
each runtime.

The runtimes' syntax is `launchgen.containers`; these checks say what a runtime cannot take (an image kind, a
mount option), what is missing on disk (the files stage: a local image, a mount's source, a charliecloud image
directory's mount points) and, live, whether the runtime is there. The spec already refuses what no runtime takes
(relative or blank-holding mount paths, `:` or `,` inside a path).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.containers import REGISTRY_SCHEMES, RUNTIMES, RoleName, role_container
from launchgen.issues import Issue
from launchgen.spec import ContainerSection, Spec

_doc("LG250", "error", "A container image that is a local path does not exist or cannot be read here.",
     "Fix the path (relative paths start at the submit directory), build or copy the image there, or name a "
     "registry image (pyxis: `registry#image:tag`, apptainer: `docker://...`).")
_doc("LG251", "warning", "A container mount's source does not exist here (it may exist only on the compute nodes).",
     "Fix the path in `mounts`, or make sure it exists on every node the role runs on.")
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
_doc("LG256", "warning", "`check --live`: the container runtime was not found here (the probe is named).",
     "Run the check where the jobs run (a login node of the cluster), load the runtime's module, or pick the "
     "runtime the cluster has.")
_doc("LG257", "info", "`check --live`: the container runtime was found (the probe is named).", "")
_doc("LG258", "error", "A charliecloud image directory lacks the mount point of a mount (one of `mounts`, the "
     "submit directory, the HF cache) or the job directory lies outside the submit directory and /tmp: `ch-run` "
     "cannot create a mount point in a read-only image.",
     "Create the directory in the image (`mkdir -p IMAGE/DST` when building it), use a relative job.output_dir, "
     "or keep the path below /tmp, which ch-run binds from the host.")
_doc("LG259", "warning", "vllm.container is set but no server step runs (vllm.mode colocate: vLLM runs inside the "
     "trainer processes, in train.container).",
     "Remove vllm.container, or give the trainer's image vLLM.")


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


def _local(path: str) -> Path:
    return Path(os.path.expanduser(path))


@check("LG250", "LG251", "LG258", stage="files")
def container_files_exist(ctx: Ctx) -> Iterator[Issue]:
    for c, source in _uniq(containers_of(ctx.spec)):
        image = _local(c.image)
        if image_is_path(c):
            if not image.exists():
                yield ctx.issue("LG250", f"{source}.image", f"image {c.image} does not exist")
            elif not os.access(image, os.R_OK | (os.X_OK if image.is_dir() else 0)):
                yield ctx.issue("LG250", f"{source}.image", f"image {c.image} is not readable here")
        for k, m in enumerate(c.mounts):
            src, _, rest = m.partition(":")
            if not Path(src).exists():
                yield ctx.issue("LG251", f"{source}.mounts.{k}", f"mount source {src} does not exist here")
            dst = rest.partition(":")[0] or src
            if c.runtime == "charliecloud" and image.is_dir() and image_is_path(c) and _no_mount_point(image, dst):
                yield ctx.issue("LG258", f"{source}.mounts.{k}",
                                f"the image directory {c.image} has no {dst} to mount {src} on")
        if c.runtime == "charliecloud" and image.is_dir() and image_is_path(c):
            yield from _standard_mount_points(ctx, image, source)


def _no_mount_point(image: Path, dst: str) -> bool:
    return not (dst == "/tmp" or dst.startswith("/tmp/")) and not (image / dst.lstrip("/")).is_dir()


def _standard_mount_points(ctx: Ctx, image: Path, source: str) -> Iterator[Issue]:
    """The submit directory (here: the current one) and the HF cache (as this environment names it) need their
    mount points in a charliecloud image directory; the job directory, named per job, is covered only inside the
    submit directory or below /tmp."""
    env = ctx.env
    home = env.get("HOME", os.path.expanduser("~"))
    hf = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "huggingface")
    for what, path in (("the submit directory", os.getcwd()), ("the HF cache (HF_HOME)", hf)):
        real = os.path.realpath(path)
        if _no_mount_point(image, real):
            yield ctx.issue("LG258", f"{source}.image", f"the image directory has no {real} to mount {what} on")
    out = ctx.spec.job.output_dir
    if out.startswith(("/", "~", "$")) and not out.startswith("/tmp/"):
        yield ctx.issue("LG258", "job.output_dir", f"job.output_dir {out} lies outside the submit directory: ch-run "
                        "cannot create the job directory's mount point in the image")


# --- check --live ---------------------------------------------------------------------------------------------

class ProbeUnavailable(Exception):
    """The probe's command could not run (missing, timed out); the message says why."""


#: (argv, timeout) -> (returncode, stdout + stderr); raises ProbeUnavailable
ProbeRunner = Callable[[list[str], float], tuple[int, str]]


def probe_runtimes(ctx: Ctx, run: ProbeRunner, which: Callable[[str], str | None]) -> Iterator[Issue]:
    """Is each runtime the spec uses there? pyxis: `srun --help` lists --container-image (the plugin's option);
    the others: their program on PATH (apptainer also answers to `singularity` on clusters that kept the name)."""
    probed: set[str] = set()
    for c, source in _uniq(containers_of(ctx.spec)):
        rt = RUNTIMES[c.runtime]
        if rt.name in probed:
            continue  # one probe and one message per runtime
        probed.add(rt.name)
        path = f"{source}.runtime"
        if rt.name == "pyxis":
            probe = "`srun --help`"
            if which("srun") is None:
                yield ctx.issue("LG256", path, f"pyxis: probed {probe}, but `srun` is not on PATH")
                continue
            try:
                code, out = run(["srun", "--help"], 10.0)
            except ProbeUnavailable as exc:
                yield ctx.issue("LG256", path, f"pyxis: probed {probe}, which did not run: {exc}")
                continue
            if "--container-image" in out:
                yield ctx.issue("LG257", path, f"pyxis: probed {probe}: it lists --container-image")
            else:
                yield ctx.issue("LG256", path, f"pyxis: probed {probe} (exit {code}): no --container-image "
                                "option, so the pyxis plugin is not loaded here")
            continue
        found = which(rt.program)
        if found:
            yield ctx.issue("LG257", path, f"{rt.name}: probed PATH for `{rt.program}`: {found}")
            continue
        other = {"apptainer": "singularity", "singularity": "apptainer"}.get(rt.name)
        alt = which(other) if other else None
        hint = f"; `{other}` is ({alt}): set runtime: {other}" if alt else ""
        yield ctx.issue("LG256", path, f"{rt.name}: probed PATH for `{rt.program}`: not found{hint}")
