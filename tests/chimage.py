"""A small charliecloud image directory for the container tests, built in milliseconds from this machine.

The image is a bare root (the directories `ch-run` needs, `/bin` and `/lib` as links into `/usr`, the `/etc`
files it binds over) whose `/usr` and Python installation come from the host through the spec's `mounts`, so
the very interpreter, venv and project the tests run (torch included) run inside, with nothing copied or
downloaded. Everything the job writes lives below /tmp, which `ch-run` binds from the host; every other mount
target exists in the image as an empty directory, since `ch-run` cannot create one in a read-only image.

`ch-run` comes from Debian's `charliecloud-runtime` package (`.ci/run` installs it); it needs `USER` set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def ch_run() -> str:
    """`ch-run`'s path; a missing runtime fails the test (CI installs it), it is never skipped."""
    path = shutil.which("ch-run")
    assert path, "ch-run is not on PATH: apt-get install -y charliecloud-runtime (.ci/run does)"
    return path


def host_mounts(python: str) -> list[str]:
    """What the image takes from the host: /usr, and the interpreter's prefix, base prefix and this repo (outside
    /usr and /tmp), outermost first so that no mount hides another."""
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    repo = str(Path(__file__).resolve().parents[1])
    paths = {"/usr"}
    for p in (*out, repo):
        real = os.path.realpath(p)
        if not real.startswith(("/usr/", "/tmp/")):
            paths.add(real)
    kept = sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))
    return kept


def build_image(dest: Path, mounts: list[str]) -> Path:
    """The image directory at `dest`, with a mount point for each of `mounts`."""
    for d in ("dev", "proc", "sys", "tmp", "etc", "home", "root", "run", "mnt", "usr"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if not (dest / link).is_symlink():
            (dest / link).symlink_to(target)
    for f in ("passwd", "group", "hosts", "resolv.conf", "nsswitch.conf"):
        (dest / "etc" / f).touch()
    # a marker only the image has: a process that sees it runs inside
    (dest / "etc" / "launchgen-test-image").write_text("inside\n")
    for m in mounts:
        (dest / m.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return dest
