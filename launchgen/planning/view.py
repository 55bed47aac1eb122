"""The plan as tables (rich): per-node GPU map, ports, addresses, env per role, commands.

Used by `launchgen plan SPEC` and `launchgen check --explain`. Reads only the Plan. A table wider than the
terminal (or than COLUMNS, or 80 columns in a pipe) is printed one record a line (`launchgen.tables`), never
cut short; the GPU map then as runs of GPUs per node (`gpu_map_compact`).
"""

from __future__ import annotations

import re
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launchgen import tables
from launchgen.planning.plan import EnvVar, GpuSlot, Plan, Ref, Word
from launchgen.shared.jobdir import ENV_PID_DIR
from launchgen.shared.visible import visible
from launchgen.tables import print_table, print_text


def _word(w: Word) -> str:
    return str(w) if isinstance(w, Ref) else visible(shlex.quote(w))


def command_line(argv: tuple[Word, ...]) -> str:
    return " ".join(_word(w) for w in argv)


def _slot_text(slot: GpuSlot, plan: Plan) -> str:
    if slot.role == "server":
        text = f"server TP{slot.tp_rank}"
        if plan.server is not None and plan.server.multi_replica:
            text = f"replica {slot.replica} TP{slot.tp_rank}"
        if plan.server is not None and plan.server.data_parallel_size > 1:
            text += f" DP{slot.dp_rank}"
        return text
    text = f"trainer r{slot.global_rank}"
    if plan.trainer.colocate:
        text += f" +vLLM TP{slot.tp_rank}"
    return text


def gpu_map(plan: Plan) -> Table:
    table = Table(title="GPU map (node position x GPU -> role / rank)", title_justify="left")
    table.add_column("node", justify="right")
    table.add_column("roles")
    if plan.device == "cpu":
        table.add_column("devices")
        for n in plan.nodes:
            table.add_row(str(n.position), ", ".join(n.roles), f"CPU (machine rank {n.machine_rank})")
        return table
    for g in range(plan.gpus_per_node):
        table.add_column(f"GPU {g}")
    for n in plan.nodes:
        by_gpu = {s.gpu: s for s in n.slots}
        cells = []
        for g in range(plan.gpus_per_node):
            slot = by_gpu.get(g)
            if slot is None:
                cells.append("[dim]idle[/dim]")
            elif slot.role == "server":
                cells.append(f"[cyan]{_slot_text(slot, plan)}[/cyan]")
            else:
                cells.append(f"[green]{_slot_text(slot, plan)}[/green]")
        roles = ", ".join(n.roles)
        if n.machine_rank is not None:
            roles += f" (machine rank {n.machine_rank})"
        if n.server_rank is not None and plan.server is not None and plan.server.multi_replica:
            roles += " (replicas " + ", ".join(
                f"{r.index}" + ("" if len(r.positions) == 1 else " leader" if r.positions[0] == n.position
                                 else " headless") for r in plan.server.replicas if n.position in r.positions) + ")"
        elif n.server_rank is not None and plan.server is not None and len(plan.server.positions) > 1:
            roles += " (server leader)" if n.server_rank == 0 else f" (server rank {n.server_rank}, headless)"
        table.add_row(str(n.position), roles, *cells)
    return table


def port_table(plan: Plan) -> Table:
    title = "Ports" + (" (+ (SLURM_JOB_ID % 1000) * 10 at run time, -10000 where that reaches 32768)" if plan.port_offset else "")
    table = Table(title=title, title_justify="left")
    for col in ("port", "base", "bound on node", "bound by", "reached by", "spec field"):
        table.add_column(col)
    for p in plan.ports:
        table.add_row(p.name, str(p.base), str(p.host_position), p.bound_by, p.reached_by, p.spec_path)
    return table


def endpoint_table(plan: Plan) -> Table:
    table = Table(title="Addresses each side must reach", title_justify="left")
    for col in ("who", "connects to node", "port", "address", "why"):
        table.add_column(col)
    for e in plan.endpoints:
        table.add_row(e.who, str(e.position), e.port, escape(_word(e.host)), e.why)
    return table


def _env_value(e: EnvVar) -> str:
    value = visible(shlex.quote(e.value) if e.literal else e.value)
    return escape(value) if e.literal else f"{escape(value)}  [dim](run time)[/dim]"


def env_table(plan: Plan) -> Table:
    table = Table(title="Environment per role", title_justify="left")
    for col in ("role", "variable", "value", "from"):
        table.add_column(col)
    if plan.server is not None:
        for r in plan.server.replicas:
            role = "server" if not plan.server.multi_replica else f"server replica {r.index}"
            for e in r.env:
                table.add_row(role, e.name, _env_value(e), e.source)
    for e in plan.trainer.env:
        table.add_row("trainer", e.name, _env_value(e), e.source)
    for name in plan.trainer.unset_env:
        table.add_row("trainer", name, "[dim](unset)[/dim]", "launchgen")
    table.add_row("all steps", ENV_PID_DIR, "$LG_JOB_DIR/" + plan.layout.pid_dir + "  [dim](run time)[/dim]",
                  "launchgen")
    return table


def command_table(plan: Plan) -> Table:
    table = Table(title="Commands (${LG_*}: set by the script at run time)", title_justify="left")
    table.add_column("role")
    table.add_column("nodes")
    table.add_column("command", overflow="fold")
    if plan.server is not None:
        for r in plan.server.replicas:
            for c in r.commands:
                label = "server" if len(r.commands) == 1 else f"server rank {c.server_rank}"
                if plan.server.multi_replica:
                    label = label.replace("server", f"server replica {r.index}", 1)
                table.add_row(label, str(c.position), escape(command_line(c.argv)))
    table.add_row("trainer", ",".join(str(p) for p in plan.trainer.positions),
                  escape(command_line(plan.trainer.argv)))
    return table


def summary_lines(plan: Plan) -> list[str]:
    t = plan.trainer
    lines = [
        f"job {plan.job_name}: {plan.num_nodes} node(s), vLLM {plan.vllm_mode}, spec sha256 {plan.spec_hash[:16]}",
        f"trainer: {t.module} via accelerate ({t.backend}), {t.num_processes} process(es) on "
        f"{t.num_machines} node(s)" + (" on CPU" if t.device == "cpu" else ""),
    ]
    if plan.server is not None:
        s = plan.server
        lines.append(f"server: {s.executable} serve, {s.parallel} on node(s) {','.join(str(p) for p in s.positions)}"
                     + (f", each replica one engine over {len(s.replicas[0].positions)} nodes (rank 0 the API, the "
                        "others --headless)" if s.multi_node else "")
                     + (f", {len(s.replicas)} replicas" if s.multi_replica else "") + ", binds "
                     f"{'the node address' if s.bind == 'node' else s.bind}, /health timeout {s.health_timeout} s")
    lines += _container_lines(plan)
    if plan.slurm.het_directives:
        own = ", ".join(d.removeprefix("--") for d in plan.slurm.het_directives
                        if d.startswith(("--partition", "--account", "--qos", "--gres", "--gpus-per-node")))
        lines.append(f"heterogeneous job: trainer nodes in component 0, server nodes in component 1 ({own})")
    lines.append(f"job dir: {plan.layout.output_dir} (logs: {plan.layout.server_log.split('/server')[0]}/"
                 "<role>-<node>.log)")
    if plan.slurm.signal_grace:
        lines.append(f"preemption: USR2 {plan.slurm.signal_grace} s before the time limit, requeue up to "
                     f"{plan.slurm.max_restarts} time(s)")
    return lines


def _container_lines(plan: Plan) -> list[str]:
    roles = [("server", plan.server.container if plan.server else None), ("trainer", plan.trainer.container)]
    return [f"{role} container: {c.image} ({c.runtime}, from {c.source})" for role, c in roles if c is not None]


def _run_length(parts: list[list[str]], g: int, k: int) -> int:
    """How many labels from `g` on differ only in their k-th number, which counts up by one."""
    first = parts[g]
    n = 1
    while g + n < len(parts):
        nxt = parts[g + n]
        if len(nxt) != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, nxt, strict=True))
                                         if i != k) or int(nxt[k]) != int(first[k]) + n:
            break
        n += 1
    return n


def _runs(labels: list[str]) -> list[str]:
    """Consecutive GPUs of one role whose ranks count up as one item: `GPU 0-3 server TP0-3`,
    `GPU 0-7 trainer r0-7 +vLLM TP0`; the same label repeated (idle) too."""
    parts = [re.split(r"(\d+)", lab) for lab in labels]  # numbers at the odd positions
    items: list[str] = []
    g = 0
    while g < len(labels):
        same = 1
        while g + same < len(labels) and labels[g + same] == labels[g] and not re.search(r"\d", labels[g]):
            same += 1
        best, at = same, None
        for k in range(1, len(parts[g]), 2):
            n = _run_length(parts, g, k)
            if n > best:
                best, at = n, k
        label = labels[g]
        if at is not None:
            lo = int(parts[g][at])
            label = "".join(f"{lo}-{lo + best - 1}" if i == at else x for i, x in enumerate(parts[g]))
        items.append(f"GPU {g} {label}" if best == 1 else f"GPU {g}-{g + best - 1} {label}")
        g += best
    return items


def gpu_map_compact(plan: Plan, table: Table | None = None) -> list[list[str]]:
    """The GPU map one node a record, runs of GPUs as whole items: what a narrow console gets instead of the
    table (a GPU column each does not fit 80 columns on an 8-GPU node). `table`: the plan's `gpu_map`."""
    table = table if table is not None else gpu_map(plan)
    cols = [[tables.plain_text(c) for c in col.cells] for col in table.columns]
    rows = []
    for r in range(len(cols[0]) if cols else 0):
        node, roles, gpus = cols[0][r], cols[1][r], [col[r] for col in cols[2:]]
        if plan.device == "cpu":
            rows.append([f"node {node}: {roles}", *gpus])
        else:
            rows.append([f"node {node}: {roles}", *_runs(gpus)])
    return rows


def print_plan(plan: Plan, console: Console | None = None) -> None:
    if console is None:
        console = tables.console()
    for line in summary_lines(plan):
        print_text(console, line)
    gpus = gpu_map(plan)
    print_table(console, gpus, compact=None if tables.fits(console, gpus) else gpu_map_compact(plan, gpus))
    for table in (port_table(plan), endpoint_table(plan), env_table(plan), command_table(plan)):
        print_table(console, table)
