"""Helpers every verb shares: load + check a spec, print issues, decide the exit status.

Issues go to stderr (`file:line: severity CODE [path] message`, then `Fix: ...`), wrapped at the terminal's width
(80 in a pipe: `Issue.lines`), so `render | less` shows the script alone. Any error (or, with --strict, any warning) ends the command with exit status 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launchgen.checks import apply_strict, has_errors, run_checks, sort_issues
from launchgen.input.loader import LoadedSpec, load_spec, read_spec_file
from launchgen.shared.issues import Issue, SpecError
from launchgen.shared.textwidth import line_width
from launchgen.shared.visible import visible

if TYPE_CHECKING:
    from launchgen.input.sweep import Sweep
    from launchgen.planning.estimate_spec import Estimate, Measured
    from launchgen.planning.plan import Plan

EXIT_SPEC_ERROR = 2

spec_argument = click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
strict_option = click.option("--strict", is_flag=True, help="Treat warnings as errors (exit 2).")
sweep_option = click.option(
    "--sweep", "sweeps", multiple=True, metavar="PATH=V1,V2",
    help="Run the spec once per value of PATH (a dotted spec path; the values are YAML, comma-separated); "
    "repeated: every combination. Adds to the spec's sweep: section (replacing the same path).")


def print_issues(issues: Iterable[Issue], *, infos: bool = True) -> None:
    width = line_width(sys.stderr)
    for i in issues:
        if infos or i.severity != "info":
            click.echo("\n".join(i.lines(width)), err=True)


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


def load_any(path: str, sweeps: tuple[str, ...] = ()) -> LoadedSpec | Sweep:
    """One job, or a sweep (a `sweep:` section or --sweep options); a SpecError propagates."""
    from launchgen.input import sweep

    return sweep.load(read_spec_file(path), sweeps)


def load_and_check(path: str, *, strict: bool = False, infos: bool = False) -> tuple[LoadedSpec, Plan]:
    """For verbs that need a valid plan (plan, render): load, check, print issues, exit 2 on errors.

    Infos are not printed by default (render's stderr is for what needs attention); `check` shows them.
    """
    return check_or_exit(load(path), strict=strict, infos=infos)


def check_or_exit(loaded: LoadedSpec, *, strict: bool = False, infos: bool = False) -> tuple[LoadedSpec, Plan]:
    """A loaded spec's plan; its issues printed, exit 2 on errors."""
    plan, issues = run_checks(loaded, strict=strict)
    print_issues(issues, infos=infos)
    if plan is None or has_errors(issues):
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    return loaded, plan


def write_scripts(texts: list[str], output: str | None, force: bool) -> None:
    """Scripts to stdout (one only) or to `-o FILE`, each replaced only by a complete script (atomically) and an
    existing one kept unless `force`; several go to `stem.1.suffix`, `stem.2.suffix`, ..."""
    if output is None:
        if len(texts) > 1:
            click.echo(f"launchgen: this renders {len(texts)} scripts: pass -o FILE", err=True)
            raise click.exceptions.Exit(EXIT_SPEC_ERROR)
        click.echo(texts[0], nl=False)
        return
    path = Path(output)
    paths = [path] if len(texts) == 1 else [path.with_name(f"{path.stem}.{k}{path.suffix}")
                                            for k in range(1, len(texts) + 1)]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        click.echo(visible(f"launchgen: {', '.join(existing)} exists; pass --force to overwrite it"), err=True)
        raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    for p, text in zip(paths, texts, strict=True):
        tmp = p.with_name(f".{p.name}.launchgen-tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, p)
        click.echo(visible(f"launchgen: wrote {output if len(texts) == 1 else p}"), err=True)


def load_or_issues(path: str, sweeps: tuple[str, ...] = ()) -> LoadedSpec | Sweep | list[Issue]:
    """For `check`: the spec or sweep, or the issues that stop it loading."""
    try:
        return load_any(path, sweeps)
    except SpecError as exc:
        return list(exc.issues)


def collect(path: str, *, strict: bool = False, live: bool = False, files: bool = True,
            loaded: LoadedSpec | list[Issue] | None = None) -> tuple[LoadedSpec | None, Plan | None, list[Issue]]:
    """For `check`: every issue, including load errors, without exiting; `files=False` skips the checks that
    read what the spec names (`check --no-files`). `loaded`: the spec (or its load errors) already read."""
    if loaded is None:
        try:
            loaded = load(path)
        except SpecError as exc:
            return None, None, list(exc.issues)
    if isinstance(loaded, list):
        return None, None, loaded
    limit_issues: list[Issue] = []
    script_limit = None
    if live:
        from launchgen.checks.live.probes import cluster_script_limit

        script_limit, limit_issues = cluster_script_limit()
    plan, issues = run_checks(loaded, strict=strict, files=files, script_limit=script_limit)
    if live:
        from launchgen.checks.live.probes import live_checks

        extra = live_checks(loaded) + [i.located(loaded.path, None) for i in limit_issues]
        # what the cluster answered replaces the spec-only guess for the same field (LG813: the release)
        answered = {(i.code, i.path) for i in extra}
        issues = [i for i in issues if i.severity != "warning" or (i.code, i.path) not in answered]
        issues = sort_issues([*issues, *(apply_strict(extra) if strict else extra)])
        if has_errors(issues):
            plan = None
    return loaded, plan, issues


def emit_json(payload: dict[str, Any]) -> None:
    click.echo(json.dumps(payload, indent=2, sort_keys=False))


def spec_estimate(loaded: LoadedSpec, measured: Measured | None) -> Estimate:
    """The memory / weight-sync / GPU-hour estimate of a checked spec (`plan`'s, for one spec or each point)."""
    from launchgen.checks.context import Ctx
    from launchgen.planning.estimate_spec import estimate

    ctx = Ctx(loaded)
    return estimate(ctx.spec, ctx.model_config, ctx.trainer_cfg, ctx.layout, measured=measured)
