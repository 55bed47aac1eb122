"""LG256, LG257: `check --live` finds the container runtimes the spec uses."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc
from launchgen.checks.spec.containers import _uniq, containers_of
from launchgen.planning.containers import RUNTIMES
from launchgen.shared.issues import Issue

_doc("LG256", "warning", "`check --live`: the container runtime was not found here (the probe is named).",
     "Run the check where the jobs run (a login node of the cluster), load the runtime's module, or pick the "
     "runtime the cluster has.")


_doc("LG257", "info", "`check --live`: the container runtime was found (the probe is named).", "")


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
