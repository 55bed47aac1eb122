"""LG250, LG251, LG258: the container images and mount sources that are local paths (the files stage)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.containers import _uniq, containers_of, image_is_path
from launchgen.shared.issues import Issue

_doc("LG250", "error", "A container image that is a local path does not exist or cannot be read here.",
     "Fix the path (relative paths start at the submit directory), build or copy the image there, or name a "
     "registry image (pyxis: `registry#image:tag`, apptainer: `docker://...`).")


_doc("LG251", "warning", "A container mount's source does not exist here (it may exist only on the compute nodes).",
     "Fix the path in `mounts`, or make sure it exists on every node the role runs on.")


_doc("LG258", "error", "A charliecloud image directory lacks the mount point of a mount (one of `mounts`, the "
     "submit directory, the HF cache) or the job directory lies outside the submit directory and /tmp: `ch-run` "
     "cannot create a mount point in a read-only image.",
     "Create the directory in the image (`mkdir -p IMAGE/DST` when building it), use a relative job.output_dir, "
     "or keep the path below /tmp, which ch-run binds from the host.")


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
