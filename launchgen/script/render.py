"""Plan -> script text. Rendering is a pure function of the plan and the scheduler's profile: every decision is in
`plan.py` or a field of `launchgen.script.schedulers.SchedulerProfile` (the templates never test the scheduler's name).

Spec text reaches shell only through the `q` filter (shlex.quote) or inside quoted heredocs (files written
verbatim), except `slurm.setup` lines, which are shell code by design. Run-time values are `Ref`s, rendered as
double-quoted variable expansions of variables the templates set (see `plan.RUNTIME_VARS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache

from launchgen.jobside import allocprobe
from launchgen.planning.plan import Plan, Ref, Word, bash_issues
from launchgen.script import preflightfacts, scriptvars
from launchgen.script.schedulers import SchedulerName, SchedulerProfile, profile
from launchgen.shared import jobdir, noderuns, ports
from launchgen.shared.issues import SpecError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "templates"
#: The script shows what the job runs (its role steps, the resolved configs and spec) under the first rule, right
#: after the `#SBATCH` block, and launchgen's own machinery under the second (the goldens are cut there).
REQUEST_RULE = "# ======== what this job runs ".ljust(80, "=")
MACHINERY_RULE = "# ======== launchgen's machinery ".ljust(80, "=")


def _template_dir() -> Path:
    # installed: launchgen.templates is a package next to launchgen; editable: the repo's templates/
    try:
        import launchgen.templates as pkg

        return Path(pkg.__file__).resolve().parent
    except ImportError:  # pragma: no cover - the package is always installed with launchgen
        return TEMPLATE_DIR


def q(value: object) -> str:
    """Shell-quote one word (the only way spec text becomes shell syntax)."""
    return shlex.quote(str(value))


def word(w: Word) -> str:
    if isinstance(w, Ref):
        return (q(w.prefix) if w.prefix else "") + f'"${{{w.var}}}"'
    return q(w)


def words(argv: tuple[Word, ...] | list[Word]) -> str:
    return " ".join(word(w) for w in argv)


def comment(value: object) -> str:
    """Text safe inside a `#` comment line: no line breaks or control characters."""
    text = str(value)
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def heredoc_delimiter(content: str) -> str:
    # derived from the content, so the content cannot contain its own terminator line
    return scriptvars.EOF_PREFIX + hashlib.sha256(content.encode()).hexdigest()[:16].upper()


def heredoc(path_expr: str, content: str) -> str:
    """`cat >PATH <<'DELIM'` ... `DELIM`: writes `content` byte for byte, nothing expanded."""
    delim = heredoc_delimiter(content)
    body = content if content.endswith("\n") else content + "\n"
    return f"cat >{path_expr} <<'{delim}'\n{body}{delim}\n"


#: a run of more consecutive positions than this is one slice of LG_NODES in `nodes_expr`, not one word a node
NODES_EXPR_RUN = 8


def nodes_expr(positions: tuple[int, ...], sep: str) -> str:
    """`${LG_NODES[i]}<sep>...`: a node list picked from the allocation by position (inside double quotes). A long
    run of positions is an array slice joined by `sep` (one character), so the script does not grow with it."""
    parts: list[str] = []
    for lo, hi in noderuns.ranges(list(positions)):
        if hi - lo < NODES_EXPR_RUN:
            parts.extend(f"${{LG_NODES[{p}]}}" for p in range(lo, hi + 1))
            continue
        joined = f'"${{LG_NODES[*]:{lo}:{hi - lo + 1}}}"'
        parts.append(joined[1:-1] if sep == " " else f"$(IFS={q(sep)}; echo {joined})")
    return sep.join(parts)


def gpu_ranges(gpus: tuple[int, ...]) -> str:
    return noderuns.ranges_text(list(gpus)) or "-"


def layout_lines(plan: Plan) -> list[str]:
    """The header's `# layout` lines: one per run of alike nodes (noderuns.fold_nodes), so the header does not
    grow with the node count. A multi-node server's leader keeps a line of its own."""
    runs: list[dict[str, Any]] = []
    leads = plan.server is not None and len(plan.server.positions) > 1
    for run in noderuns.fold_nodes([n.to_json() for n in plan.nodes]):
        count = run.pop("count", 1)
        if leads and run["server_rank"] == 0 and count > 1:
            runs.append({**run, "count": 1})
            run = {**run, "position": run["position"] + 1, "server_rank": 1,
                   "machine_rank": None if run["machine_rank"] is None else run["machine_rank"] + 1}
            count -= 1
        runs.append({**run, "count": count})
    lines = []
    for r in runs:
        n = r["count"]
        text = f"node {r['position']}:" if n == 1 else f"nodes {noderuns.span_text(r['position'], r['position'] + n - 1)}:"
        if r["server_rank"] is not None:
            assert plan.server is not None
            leader = " leader" if leads and r["server_rank"] == 0 else ""
            text += (f" server{leader} GPUs {gpu_ranges(tuple(r['server_gpus']))} "
                     f"(TP {plan.server.tensor_parallel_size})")
        if r["machine_rank"] is not None:
            where = "CPU" if plan.device == "cpu" else "GPUs " + gpu_ranges(tuple(r["trainer_gpus"]))
            text += (" +" if r["server_rank"] is not None else "") + \
                f" trainer machine rank{'s' if n > 1 else ''} {noderuns.span_text(r['machine_rank'], r['machine_rank'] + n - 1)}, {where}"
        lines.append(text)
    return lines


class _QuietCache(jinja2.FileSystemBytecodeCache):
    """A cache that cannot be written (read-only home, full disk) only costs the compile, never the render."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept between runs: compiling them is ~80 ms of every `render` on a login node, more
    than the rest of rendering. Entries are keyed by template path and checked against the source's checksum, so
    an edited template is recompiled. `LAUNCHGEN_CACHE_DIR` (empty: no cache), else `$XDG_CACHE_HOME/launchgen`,
    else `~/.cache/launchgen`."""
    configured = os.environ.get("LAUNCHGEN_CACHE_DIR")
    if configured == "":
        return None
    base = Path(configured) if configured else \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "launchgen"
    folder = base / f"jinja-{jinja2.__version__}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return _QuietCache(str(folder))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        # shell has `${#array[@]}`: Jinja's default `{#` comment marker would swallow it
        comment_start_string="{##",
        comment_end_string="##}",
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = q
    env.filters["word"] = word
    env.filters["words"] = words
    env.filters["comment"] = comment
    env.filters["gpu_ranges"] = gpu_ranges
    env.filters["ranges"] = lambda v: noderuns.ranges_text(list(v))
    env.filters["has_quotes"] = lambda v: any(c in str(v) for c in "'\"\\")
    env.globals["nodes_expr"] = nodes_expr
    env.globals["port_expr"] = ports.shell_expr
    env.globals["heredoc"] = heredoc
    env.globals["layout_lines"] = layout_lines
    return env


def _context(plan: Plan, sched: SchedulerProfile) -> dict[str, Any]:
    # the job-directory contract's names (events, time format, run-record writer) come from launchgen.shared.jobdir
    return {"plan": plan, "sched": sched, "Ref": Ref, "preflight_timeout": allocprobe.STEP_TIMEOUT_S,
            "request_rule": REQUEST_RULE, "machinery_rule": MACHINERY_RULE, **jobdir.template_context()}


def render_steps(plan: Plan, scheduler: SchedulerName) -> dict[str, str]:
    """The step scripts the job writes into $LG_JOB_DIR/steps/ (relative path -> text)."""
    env = environment()
    ctx = _context(plan, profile(scheduler))
    steps = {"steps/trainer.sh": env.get_template("steps/trainer.sh.j2").render(ctx),
             "steps/lib.sh": env.get_template("steps/lib.sh.j2").render(ctx),
             "steps/signal.sh": env.get_template("steps/signal.sh.j2").render(ctx)}
    if plan.preflight:
        steps["steps/preflight.sh"] = env.get_template("steps/preflight.sh.j2").render(ctx)
    if plan.server is not None:
        for r in plan.server.replicas:  # one step script per replica (steps/server.sh, steps/server-r1.sh, ...)
            steps[r.step] = env.get_template("steps/server.sh.j2").render({**ctx, "replica": r})
    return steps


def render_files(plan: Plan, scheduler: SchedulerName) -> dict[str, str]:
    """Every file the script embeds and writes into the job directory at start (relative path -> text)."""
    files = {
        plan.layout.spec: plan.spec_yaml,
        plan.layout.trainer_config: plan.trainer.config_yaml,
        plan.layout.accelerate_config: plan.trainer.accelerate_config_yaml,
        plan.layout.plan_static_json: json.dumps(plan.static_record(), indent=2, sort_keys=True) + "\n",
    }
    files.update(render_steps(plan, scheduler))
    if plan.preflight:  # Python, beside the step scripts: the preflight step runs it with the node's python3
        files.update(allocprobe.sources())
        files["steps/preflight.json"] = preflightfacts.facts_json(plan)
    return files


def request_paths(plan: Plan) -> list[str]:
    """The files that say what the job runs, in the order the script shows them: the server step of each replica,
    the trainer step, the trainer's and accelerate's configs, the resolved spec."""
    servers = [r.step for r in plan.server.replicas] if plan.server is not None else []
    return [*servers, "steps/trainer.sh", plan.layout.trainer_config, plan.layout.accelerate_config, plan.layout.spec]


def render_script(plan: Plan, scheduler: SchedulerName, extra_files: Mapping[str, str] | None = None) -> str:
    """The self-contained job script. Raises SpecError (LG909) for a multi-node plan under a one-machine scheduler.
    `extra_files` (relative path -> text) are written into the job directory beside the plan's (a sweep's record)."""
    sched = profile(scheduler)
    if sched.loopback:
        problems = bash_issues(plan)
        if problems:
            raise SpecError(problems)
    ctx = _context(plan, sched)
    files = {**render_files(plan, scheduler), **(extra_files or {})}
    request = request_paths(plan)
    ctx["files"] = files  # every file, for the records a re-run keeps aside
    ctx["request_files"] = {path: files[path] for path in request}
    ctx["program_files"] = {path: text for path, text in files.items() if path not in request}
    return environment().get_template(sched.template).render(ctx)
