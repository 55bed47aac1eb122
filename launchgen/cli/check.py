"""`launchgen check SPEC`: everything that can be known before the queue wait."""

from __future__ import annotations

from typing import Any

import click

from launchgen.checks import has_errors
from launchgen.cli.common import (
    EXIT_SPEC_ERROR,
    collect,
    emit_json,
    issue_dict,
    load_or_issues,
    print_issues,
    strict_option,
    summary,
    sweep_option,
)
from launchgen.input.sweep import Sweep
from launchgen.shared.visible import visible

HELP = """\
Check each SPEC (`-` reads the spec from stdin): field rules, cross-field checks (GPUs, TP/DP, ports, modes, kernels, precision, versions) and the plan.

Each problem goes to stderr as `file:line: severity CODE [field] message`, then `Fix: ...`, wrapped at the
terminal's width (80 in a pipe, COLUMNS when set), later lines indented (docs/check-codes.md explains every code). Exit 0 when no spec has an error (warnings allowed), 2 otherwise.
With several specs and --format json, stdout is one object {"ok": ..., "specs": [one object per spec]}.

\b
Examples:
  launchgen check topology.yaml
  launchgen check a.yaml b.yaml               # several at once
  launchgen init - | launchgen check --no-files -   # stdin, no data yet
  launchgen check topology.yaml --strict      # warnings fail too (CI)
  launchgen check topology.yaml --live        # and sinfo, nvidia-smi, pip
  launchgen check topology.yaml --no-files    # the spec alone, no data
  launchgen check topology.yaml --explain     # and print the plan when valid
  launchgen check topology.yaml --format json | jq '.issues[].code'
"""


@click.command("check", help=HELP)
@click.argument("specs", metavar="SPEC...", nargs=-1, required=True,
                type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option("--live", is_flag=True,
              help="Also probe this host and cluster: sinfo GPUs per node, installed versions, bf16 support, "
              "free ports, offline caches. Probes that cannot run are reported as skipped.")
@click.option("--no-files", is_flag=True,
              help="A spec-only pass: skip the checks that read the files the spec names (data rows, reward "
              "modules, a local model), e.g. where the data is not (plan and render never read them).")
@strict_option
@sweep_option
@click.option("--explain", is_flag=True, help="Print the resolved plan (per-node GPU map and port plan).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object on stdout with every issue and a summary.")
def command(specs: tuple[str, ...], live: bool, no_files: bool, strict: bool, sweeps: tuple[str, ...], explain: bool,
            fmt: str) -> None:
    if specs.count("-") > 1:
        raise click.UsageError("stdin (`-`) can be read only once")
    results = [_check_one(spec, live=live, files=not no_files, strict=strict, explain=explain, fmt=fmt,
                          sweeps=sweeps) for spec in specs]
    failed = not all(r["ok"] for r in results)
    if fmt == "json":
        emit_json(results[0] if len(results) == 1 else {"ok": not failed, "specs": results})
    if failed:
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)


def _check_one(spec: str, *, live: bool, files: bool, strict: bool, explain: bool, fmt: str,
               sweeps: tuple[str, ...] = ()) -> dict[str, Any]:
    loaded = load_or_issues(spec, sweeps)
    if isinstance(loaded, Sweep):
        from launchgen.cli import sweeps as sweep_verbs

        return sweep_verbs.check(loaded, strict=strict, files=files, fmt=fmt, explain=explain, live=live)
    _loaded, plan, issues = collect(spec, strict=strict, live=live, files=files, loaded=loaded)
    failed = has_errors(issues) or plan is None
    if fmt == "text":
        print_issues(issues)
        counts = summary(issues)
        status = "FAILED" if failed else "ok"
        name = "<stdin>" if spec == "-" else visible(spec)
        click.echo(f"{name}: {status} ({counts['error']} error(s), {counts['warning']} warning(s), "
                   f"{counts['info']} info)", err=True)
        if explain and plan is not None:
            from launchgen.planning.view import print_plan

            print_plan(plan)
    return {"spec": spec, "ok": not failed, "summary": summary(issues), "issues": [issue_dict(i) for i in issues]}
