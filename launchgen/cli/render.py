"""`launchgen render SPEC [--bash] [-o FILE] [--force]`: the job script, self-contained."""

from __future__ import annotations

import click

from launchgen.cli.common import (
    EXIT_SPEC_ERROR,
    check_or_exit,
    load_any,
    print_issues,
    spec_argument,
    strict_option,
    sweep_option,
    write_scripts,
)
from launchgen.input.loader import LoadedSpec

HELP = """\
Render SPEC into a job script: an sbatch script (default) or, with --bash, a bash script for one machine with
the same lifecycle (server, health wait, trainer, teardown, logs). The script is self-contained: the resolved
spec, trainer config and accelerate config are embedded and written into the job directory when it starts.

Runs the same checks as `launchgen check` first and refuses (exit 2) when there is an error. Only the script
goes to stdout, and nothing at all on failure; warnings go to stderr.

Write the script with -o FILE, the safe form: FILE is replaced only by a complete script (atomically), and an
existing FILE is kept unless --force. With `> FILE` the shell empties FILE before launchgen even starts, so a
failed render leaves an empty job script behind.

\b
Examples:
  launchgen render topology.yaml -o job.sbatch && sbatch job.sbatch
  launchgen render topology.yaml -o job.sbatch --force  # replace job.sbatch
  launchgen render topology.yaml --bash -o job.sh && bash job.sh
  launchgen render topology.yaml | less       # stdout: the script only
"""


@click.command("render", help=HELP)
@spec_argument
@click.option("--bash", "bash_mode", is_flag=True, help="A bash script for one machine instead of sbatch.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the script to FILE (made executable) instead of stdout.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@strict_option
@sweep_option
def command(spec: str, bash_mode: bool, output: str | None, force: bool, strict: bool, sweeps: tuple[str, ...]
            ) -> None:
    from launchgen.planning.plan import bash_issues
    from launchgen.script.render import render_script

    loaded = load_any(spec, sweeps)
    if not isinstance(loaded, LoadedSpec):
        from launchgen.cli import sweeps as sweep_verbs

        write_scripts(sweep_verbs.render(loaded, "bash" if bash_mode else "sbatch", strict=strict), output, force)
        return
    _loaded, plan = check_or_exit(loaded, strict=strict)
    if bash_mode:
        problems = bash_issues(plan)
        if problems:
            print_issues(problems)
            raise click.exceptions.Exit(EXIT_SPEC_ERROR)
    write_scripts([render_script(plan, "bash" if bash_mode else "sbatch")], output, force)
