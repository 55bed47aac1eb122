"""`launchgen check SPEC`: everything that can be known before the queue wait."""

from __future__ import annotations

import click

from launchgen.checks import has_errors
from launchgen.cli.common import (
    EXIT_SPEC_ERROR,
    collect,
    emit_json,
    issue_dict,
    print_issues,
    spec_argument,
    strict_option,
    summary,
)

HELP = """\
Check SPEC: field rules, cross-field checks (GPUs, TP/DP, ports, modes, kernels, precision, versions) and the plan.

Each problem is one line on stderr: `file:line: severity CODE [field] message Fix: ...`
(docs/check-codes.md explains every code). Exit 0 when there is no error (warnings allowed), 2 otherwise.

\b
Examples:
  launchgen check topology.yaml
  launchgen check topology.yaml --strict            # warnings fail too (CI)
  launchgen check topology.yaml --live              # also ask sinfo, nvidia-smi, the installed packages
  launchgen check topology.yaml --explain           # print the plan (node x GPU map, ports) when it is valid
  launchgen check topology.yaml --format json | jq '.issues[].code'
"""


@click.command("check", help=HELP)
@spec_argument
@click.option("--live", is_flag=True,
              help="Also probe this host and cluster: sinfo GPUs per node, installed versions, bf16 support, "
              "free ports, offline caches. Probes that cannot run are reported as skipped.")
@strict_option
@click.option("--explain", is_flag=True, help="Print the resolved plan (per-node GPU map and port plan).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object on stdout with every issue and a summary.")
def command(spec: str, live: bool, strict: bool, explain: bool, fmt: str) -> None:
    _loaded, plan, issues = collect(spec, strict=strict, live=live)
    failed = has_errors(issues) or plan is None
    if fmt == "json":
        emit_json({"spec": spec, "ok": not failed, "summary": summary(issues),
                   "issues": [issue_dict(i) for i in issues]})
    else:
        print_issues(issues)
        counts = summary(issues)
        status = "FAILED" if failed else "ok"
        click.echo(f"{spec}: {status} ({counts['error']} error(s), {counts['warning']} warning(s), "
                   f"{counts['info']} info)", err=True)
        if explain and plan is not None:
            from launchgen.planview import print_plan

            print_plan(plan)
    if failed:
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)
