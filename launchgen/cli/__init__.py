"""The `launchgen` command: one click group, one module per verb (`launchgen.cli.<verb>.command`).

Verbs are imported on demand, so `launchgen check` never pays for what `render` or `plan` import, and a verb
whose module is missing (status and logs arrive later) simply does not exist instead of breaking the CLI.
Every verb runs under one error policy (`LaunchgenGroup.invoke`): user errors are a message each (wrapped at
the terminal's width) and exit 2, an unexpected exception is one line plus how to get the traceback, exit 1.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any

import click

from launchgen import __version__

# The first model pydantic builds makes it scan every installed distribution's entry points for pydantic plugins
# (observability hooks): ~15-50 ms of every verb on a login node whose venv holds torch and its kin. launchgen's
# models use none; a user who wants one sets the variable to something else.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


def _skip_pydantic_plugin_loader() -> None:
    """With plugins disabled pydantic's loader returns none, but importing it imports `importlib.metadata` (email,
    zipfile, csv, ...): ~30 ms of every verb that builds a model. This stands in for it with the same answer; a
    user who enables plugins gets pydantic's own loader."""
    name = "pydantic.plugin._loader"
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] not in ("__all__", "1", "true") or name in sys.modules:
        return
    loader = types.ModuleType(name, "launchgen's stand-in: pydantic plugins are disabled (PYDANTIC_DISABLE_PLUGINS)")
    loader.__dict__.update(_plugins=None, get_plugins=lambda: ())
    sys.modules[name] = loader


_skip_pydantic_plugin_loader()

#: Verbs in help order, with the line `launchgen --help` shows for each. A verb is listed only when its module
#: exists. The lines live here, not in the verb modules, so that `--help` imports none of them (importing
#: `check` alone costs ~150 ms of pydantic models on a login node).
SUMMARIES = {
    "init": "Write a commented starter spec (four layouts).",
    "check": "Check specs: every problem knowable before the queue wait.",
    "plan": "Print the node x GPU map, ports, addresses, env and commands.",
    "render": "Render the sbatch (or --bash) job script.",
    "schema": "Print the spec schema (JSON Schema or Markdown).",
    "status": "Which role ended first and how, health, the log to read.",
    "logs": "Print or follow a role's log of a job.",
    "report": "Write the run's timeline and training curves as one HTML page.",
}
VERBS = tuple(SUMMARIES)

HELP = """\
launchgen: one YAML topology spec -> a validated plan -> an sbatch (or bash)
script that runs a vLLM server and accelerate trainers together, and leaves
nothing behind.

\b
Examples:
  launchgen init topology.yaml     # a commented starter spec
  launchgen check topology.yaml    # every problem knowable before the queue
  launchgen check topology.yaml --live   # ... and against this cluster
  launchgen plan topology.yaml     # node x GPU map and port plan
  launchgen render topology.yaml -o job.sbatch && sbatch job.sbatch
  launchgen render topology.yaml --bash -o job.sh   # one machine, no SLURM
  launchgen status 12345           # who ended first and how, and its log
  launchgen report 12345           # timeline and curves, one HTML page
  launchgen schema --format markdown               # the spec reference

Exit status: 0 ok (warnings allowed), 2 the spec has errors (or warnings with
--strict) or bad usage, 1 an internal error. LAUNCHGEN_DEBUG=1 shows tracebacks.
"""


def _module_name(verb: str) -> str:
    return f"launchgen.cli.{verb.replace('-', '_')}"


def _verb_exists(verb: str) -> bool:
    try:
        return importlib.util.find_spec(_module_name(verb)) is not None
    except (ImportError, ValueError):
        return False


class LaunchgenGroup(click.Group):
    """Lazily imported verbs plus the CLI-wide error policy."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [v for v in VERBS if _verb_exists(v)] + sorted(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(v, SUMMARIES[v]) for v in VERBS if _verb_exists(v)]
        rows += [(name, cmd.get_short_help_str(formatter.width)) for name, cmd in sorted(self.commands.items())]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in VERBS or not _verb_exists(cmd_name):
            return None
        module = importlib.import_module(_module_name(cmd_name))
        command = getattr(module, "command", None)
        return command if isinstance(command, click.Command) else None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # `launchgen schema | head`: the reader left; say nothing, and keep Python's exit flush quiet
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None
        except KeyboardInterrupt:
            click.echo("launchgen: interrupted", err=True)
            raise click.exceptions.Exit(130) from None
        except Exception as exc:
            from launchgen.shared.issues import SpecError
            from launchgen.shared.visible import visible

            if isinstance(exc, SpecError):
                from launchgen.shared.textwidth import line_width

                for issue in exc.issues:
                    click.echo("\n".join(issue.lines(line_width(sys.stderr))), err=True)
                raise click.exceptions.Exit(2) from None
            if os.environ.get("LAUNCHGEN_DEBUG"):
                raise
            if isinstance(exc, OSError):
                name = f" {exc.filename}" if exc.filename else ""
                click.echo(visible(f"launchgen: error:{name}: {exc.strerror or exc}"), err=True)
                raise click.exceptions.Exit(2) from None
            click.echo(visible(f"launchgen: internal error: {type(exc).__name__}: {exc}"), err=True)
            click.echo("launchgen: run with LAUNCHGEN_DEBUG=1 for the traceback", err=True)
            raise click.exceptions.Exit(1) from None


@click.group(cls=LaunchgenGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"],
                                                              "max_content_width": 80})
@click.version_option(__version__, "--version", prog_name="launchgen", message="%(prog)s %(version)s")
def main() -> None:
    pass


