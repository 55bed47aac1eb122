"""`launchgen plan SPEC`: the resolved plan as tables (node x GPU map, ports, addresses, env, commands)."""

from __future__ import annotations

import json

import click

from launchgen.cli.common import load_and_check, spec_argument, strict_option

HELP = """\
Print the plan SPEC resolves to: which role runs on which node and GPU (TP rank, trainer rank), every port and
the node that binds it, the addresses each side reaches, the environment per role and the exact commands.

Runs the same checks as `launchgen check` first and refuses (exit 2) when there is an error.

\b
Examples:
  launchgen plan topology.yaml
  launchgen plan topology.yaml --format json | jq '.nodes'
"""


@click.command("plan", help=HELP)
@spec_argument
@strict_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: the static plan (what the job saves as launchgen-plan.json, before run-time values).")
def command(spec: str, strict: bool, fmt: str) -> None:
    _loaded, plan = load_and_check(spec, strict=strict)
    if fmt == "json":
        click.echo(json.dumps(plan.to_json(), indent=2, sort_keys=True))
        return
    from launchgen.planview import print_plan

    print_plan(plan)
