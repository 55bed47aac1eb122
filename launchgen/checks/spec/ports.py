"""LG4xx: ports (valid, distinct, and safe under `job.port_offset: job_id`; the rules are `launchgen.shared.ports`')."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launchgen.checks.constants import (
    PORT_OFFSET_MAX,
    PORT_OFFSET_STEP,
)
from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared import ports
from launchgen.shared.issues import Issue
from launchgen.shared.ports import EPHEMERAL_HIGH, EPHEMERAL_LOW, PORT_MAX, PORT_MIN

if TYPE_CHECKING:
    from launchgen.planning.plan import Port


# === LG4xx ports ==========================================================================================

_doc("LG401", "error", "A port is outside 1024-65535.",
     "Use a port from 1024 to 65535 (below 1024 needs root; above 65535 does not exist).")
_doc("LG402", "error", "Two ports that listen on the same host are equal.",
     "Give each port on a host its own number.")
_doc("LG403", "warning", "A port is inside the Linux ephemeral range 32768-60999.",
     "Pick a port below 32768 (outgoing connections can already hold one in the ephemeral range).")
_doc("LG404", "error", "With job.port_offset: job_id the shifted port can exceed 65535.",
     f"Keep every port <= {PORT_MAX - PORT_OFFSET_MAX} when job.port_offset is job_id.")
_doc("LG405", "warning", "With job.port_offset: job_id two ports on a host differ by a multiple of 10, so two "
     "jobs sharing the node can collide.", "Make the ports on a host differ in their last digit.")
_doc("LG406", "warning", "Nodes are shared (slurm.exclusive: false) but ports are fixed.",
     "Set job.port_offset: job_id so jobs sharing a node get distinct ports.")


PORT_NAMES = {
    "main_process": "accelerate main_process_port",
    "server_http": "vLLM HTTP port",
    "group": "weight-transfer group_port",
    "colocate_master": "colocate MASTER_PORT",
    "dp_rpc": "vLLM DP RPC port",
    "master": "vLLM master_port (a multi-node replica's rendezvous)",
}


def port_uses(ctx: Ctx) -> tuple[Port, ...]:
    """Every port the job listens on, with the node position that binds it (the plan's own resolver)."""
    from launchgen.planning.plan import resolve_ports

    return resolve_ports(ctx.spec)


def _pname(p: Port) -> str:
    return PORT_NAMES.get(p.name, p.name) + (f" of replica {p.replica}" if p.replica else "")


@check("LG401", "LG402", "LG403")
def ports_valid_and_distinct(ctx: Ctx) -> Iterator[Issue]:
    uses = port_uses(ctx)
    for u in uses:
        if not PORT_MIN <= u.base <= PORT_MAX:
            yield ctx.issue("LG401", u.spec_path, f"{_pname(u)} {u.base} is outside {PORT_MIN}-{PORT_MAX}")
        elif EPHEMERAL_LOW <= u.base <= EPHEMERAL_HIGH:
            yield ctx.issue("LG403", u.spec_path, f"{_pname(u)} {u.base} is inside the ephemeral range "
                            f"{EPHEMERAL_LOW}-{EPHEMERAL_HIGH}")
    seen: dict[tuple[int, int], Port] = {}
    for u in uses:
        other = seen.get((u.host_position, u.base))
        if other is not None:
            yield ctx.issue("LG402", u.spec_path,
                            f"{_pname(u)} {u.base} equals the {_pname(other)} ({other.spec_path}); both listen "
                            f"on node {u.host_position}")
        else:
            seen[(u.host_position, u.base)] = u
    if ctx.spec.job.port_offset == "job_id":
        yield from _shifted_equal(ctx, uses)


def _shifted_equal(ctx: Ctx, uses: tuple[Port, ...]) -> Iterator[Issue]:
    """Two ports of a host that the job-id shift (with its wrap below the ephemeral range) can make equal."""
    for i, a in enumerate(uses):
        for b in uses[i + 1:]:
            o = ports.same_job_clash(a.base, b.base) if a.host_position == b.host_position else None
            if o is not None:
                yield ctx.issue("LG402", b.spec_path,
                                f"{_pname(b)} {b.base} and the {_pname(a)} {a.base} both become "
                                f"{ports.shift(b.base, o)} at job-id offset {o} (a port shifted to "
                                f"{EPHEMERAL_LOW} or above wraps down by {ports.WRAP})")


@check("LG404", "LG405", "LG406")
def port_offset_safe(ctx: Ctx) -> Iterator[Issue]:
    uses = [u for u in port_uses(ctx) if PORT_MIN <= u.base <= PORT_MAX]
    if ctx.spec.job.port_offset != "job_id":
        if not ctx.spec.slurm.exclusive and uses:
            yield ctx.issue("LG406", "job.port_offset",
                            "slurm.exclusive is false, so another job on the same node can hold "
                            f"{', '.join(str(u.base) for u in uses)}")
        return
    for u in uses:
        top = ports.shifted_range(u.base)[1]
        if top > PORT_MAX:
            yield ctx.issue("LG404", u.spec_path,
                            f"{_pname(u)} {u.base} + the job-id offset (up to {PORT_OFFSET_MAX}) can reach "
                            f"{top} > {PORT_MAX}")
    by_host: dict[int, list[Port]] = {}
    for u in uses:
        by_host.setdefault(u.host_position, []).append(u)
    for host_uses in by_host.values():
        for i, a in enumerate(host_uses):
            for b in host_uses[i + 1:]:
                clash = ports.cross_job_clash(a.base, b.base)
                if clash is not None and ports.same_job_clash(a.base, b.base) is None:
                    d = abs(clash[0] - clash[1]) // PORT_OFFSET_STEP
                    yield ctx.issue("LG405", b.spec_path,
                                    f"{_pname(b)} {b.base} and {_pname(a)} {a.base}: when two jobs' ids differ "
                                    f"by {d} (mod 1000) one's shifted port lands on the other's")
