"""Helpers every verb shares: load + check a spec, print issues, decide the exit status.

Issues go to stderr, one line each (`file:line: severity CODE [path] message Fix: ...`), so `render | less` shows
the script alone. Any error (or, with --strict, any warning) ends the command with exit status 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from launchgen.checks import apply_strict, has_errors, run_checks, sort_issues
from launchgen.input.loader import LoadedSpec, load_spec
from launchgen.shared.issues import Issue, SpecError

if TYPE_CHECKING:
    from launchgen.planning.plan import Plan

EXIT_SPEC_ERROR = 2

spec_argument = click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
strict_option = click.option("--strict", is_flag=True, help="Treat warnings as errors (exit 2).")


def print_issues(issues: Iterable[Issue], *, infos: bool = True) -> None:
    for i in issues:
        if infos or i.severity != "info":
            click.echo(i.format(), err=True)


def issue_dict(i: Issue) -> dict[str, Any]:
    return {"code": i.code, "severity": i.severity, "path": i.path, "file": i.file, "line": i.line,
            "message": i.message, "fix": i.fix}


def summary(issues: Iterable[Issue]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for i in issues:
        out[i.severity] += 1
    return out


def load(path: str) -> LoadedSpec:
    """Load a spec; a SpecError propagates (the group prints its issues and exits 2)."""
    return load_spec(path)


def load_and_check(path: str, *, strict: bool = False, infos: bool = False) -> tuple[LoadedSpec, Plan]:
    """For verbs that need a valid plan (plan, render): load, check, print issues, exit 2 on errors.

    Infos are not printed by default (render's stderr is for what needs attention); `check` shows them.
    """
    loaded = load(path)
    plan, issues = run_checks(loaded, strict=strict)
    print_issues(issues, infos=infos)
    if plan is None or has_errors(issues):
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    return loaded, plan


def collect(path: str, *, strict: bool = False, live: bool = False, files: bool = True
            ) -> tuple[LoadedSpec | None, Plan | None, list[Issue]]:
    """For `check`: every issue, including load errors, without exiting; `files=False` skips the checks that
    read what the spec names (`check --no-files`)."""
    try:
        loaded = load(path)
    except SpecError as exc:
        return None, None, list(exc.issues)
    plan, issues = run_checks(loaded, strict=strict, files=files)
    if live:
        from launchgen.checks.live.probes import live_checks

        extra = live_checks(loaded)
        issues = sort_issues([*issues, *(apply_strict(extra) if strict else extra)])
        if has_errors(issues):
            plan = None
    return loaded, plan, issues


def emit_json(payload: dict[str, Any]) -> None:
    click.echo(json.dumps(payload, indent=2, sort_keys=False))
