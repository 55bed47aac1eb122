"""The estimate as `launchgen plan` prints it: one narrow table of per-GPU memory, then weight-sync time and
GPU-hours as lines (`launchgen.tables` prints records instead where a terminal is too narrow)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from launchgen.planning.estimate_spec import Estimate
from launchgen.shared.estimate import RoleEstimate
from launchgen.tables import print_table, print_text

_VERDICT = {"fits": "[green]fits[/green]", "tight": "[yellow]tight[/yellow]",
            "does not fit": "[red]does not fit[/red]", "unknown": "[dim]GPU memory unknown[/dim]"}


def _rows(table: Table, e: RoleEstimate) -> None:
    for p in e.parts:
        label = p.name
        if p.name == "KV cache" and e.full_sequences is not None:
            label = f"KV cache: {e.full_sequences} x {e.max_model_len}-token seqs"
        table.add_row("", label, ("~" if p.rough else "") + f"{p.gib:.1f}")
    allowed = "" if e.budget_gib is None else f" of {e.budget_gib:.1f} allowed"
    table.add_row("", f"[b]total[/b]{allowed}: {_VERDICT[e.verdict]}", f"[b]{e.total_gib:.1f}[/b]")


def memory_table(est: Estimate) -> Table:
    gpu = f"{est.gpu_gib:.1f} GiB GPUs" if est.gpu_gib is not None else "GPU memory unknown"
    table = Table(title=f"Memory per GPU (estimate, {gpu}; ~ rough bound)", title_justify="left")
    table.add_column("role")
    table.add_column("what")
    table.add_column("GiB", justify="right")
    for role in (est.server, est.trainer):
        if role is not None:
            table.add_row(f"[b]{role.role}[/b]", f"[dim]{role.setup}[/dim]", "")
            _rows(table, role)
    return table


def summary_lines(est: Estimate) -> list[str]:
    lines = []
    if est.shape is not None:
        total, active = est.shape.parameter_count(), est.shape.active_parameter_count()
        moe = f", {active / 1e9:.2f}B active per token (mixture of experts)" if active != total else ""
        lines.append(f"model: {total / 1e9:.2f}B parameters{moe} ({est.sources.get('model')})")
    for role in (est.server, est.trainer):
        if role is not None:
            lines.extend(f"{role.role}: {n}" for n in role.notes)
    if est.sync is not None:
        s = est.sync
        lines.append(f"weight sync: {s.bytes_per_sync / 1e9:.1f} GB per optimizer step ({s.what}) over {s.link} "
                     f"at {s.gb_per_s:g} GB/s: about {s.seconds:.2f} s")
    if est.gpu_hours is not None and est.step_seconds is not None:
        lines.append(f"cost: {est.steps} steps x {est.step_seconds:.2f} s x {est.gpus} GPUs = "
                     f"{est.gpu_hours:,.1f} GPU-hours ({est.step_seconds * (est.steps or 0) / 3600:.1f} h wall; "
                     f"step time from {est.sources.get('step time')})")
    elif est.steps is not None:
        lines.append(f"cost: {est.steps} steps on {est.gpus} GPUs; GPU-hours need a step time "
                     "(`plan --from-run JOBDIR` or estimate.step_time_s)")
    if est.trainer is not None:
        lines.append("activations are a rough bound; prompt tokens: " + est.sources.get("prompt tokens", "?"))
    lines.extend(f"not estimated: {m}" for m in est.missing)
    return lines


def print_estimate(est: Estimate, console: Console) -> None:
    if est.server is not None or est.trainer is not None:
        print_table(console, memory_table(est))
    for line in summary_lines(est):
        print_text(console, line)
