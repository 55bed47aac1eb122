"""`slurm.extra_directives` read the way sbatch reads an `#SBATCH` line, so reserved options cannot slip through.

sbatch splits the line into words (quotes group, `\\` escapes, an unquoted `#` ends the line), then parses them
with getopt_long: short options take an attached value (`-N3`, `-pdebug`, `-o/dev/null`) and cluster (`-HN3`),
and a long option may be abbreviated to any unambiguous prefix (`--signa=`, `--partit=`, `--no-req`). A literal
comparison with the reserved names misses all of those. sbatch never expands `$VAR` in these lines either.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

Arg = Literal["none", "required", "optional"]

#: sbatch's long options (Slurm 20.11-25.11) and whether they take a value; prefixes resolve against this. Read
#: from SchedMD's src/common/slurm_opt.c at each release tag (the options of `common_options` sbatch sets).
LONG_OPTIONS: dict[str, Arg] = {
    **dict.fromkeys((
        "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster", "cluster-constraint",
        "clusters", "comment", "constraint", "container", "container-id", "context", "core-spec", "cores-per-socket",
        "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution",
        "error", "export", "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
        "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input", "job-name",
        "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind",
        "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist", "nodes", "ntasks",
        "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres",
        "open-mode", "output", "exclude", "partition", "power", "prefer", "priority", "profile", "qos",
        "reservation", "resources", "segment", "signal", "sockets-per-node", "switches", "tasks-per-node",
        "thread-spec", "threads-per-core", "time", "time-min", "tmp", "tres-bind", "tres-per-task", "uid",
        "wait-all-nodes", "wckey", "wrap", "autocomplete",
    ), "required"),
    **dict.fromkeys(("exclusive", "get-user-env", "nice", "no-kill", "propagate", "oom-kill-step", "resv-ports"),
                    "optional"),
    **dict.fromkeys((
        "contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable",
        "quiet", "reboot", "requeue", "spread-job", "spread-segments", "test-only", "usage", "use-min-nodes",
        "verbose", "version", "wait", "stepmgr", "external", "consolidate-segments",
    ), "none"),
}
#: The release that introduced each option newer than 20.11 (the others are older): an older sbatch refuses the
#: whole script for one of them (`unrecognized option`), as this cluster's 22.05 does for --tres-per-task.
SINCE: dict[str, str] = {
    "container": "21.08", "context": "21.08", "prefer": "22.05",
    "autocomplete": "23.02", "container-id": "23.02", "extra": "23.02", "tres-per-task": "23.02",
    "tres-bind": "23.11", "resv-ports": "24.05", "segment": "24.05", "stepmgr": "24.05", "oom-kill-step": "24.11",
    "external": "25.05", "consolidate-segments": "25.11", "resources": "25.11", "spread-segments": "25.11",
}
#: The release `check` assumes where neither the spec (slurm.version) nor `check --live` (sbatch --version) says.
ASSUMED_RELEASE = "22.05"

#: sbatch's short options -> the long option they are.
SHORT_OPTIONS: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "h": "help", "H": "hold",
    "i": "input", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "M": "clusters",
    "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "u": "usage", "v": "verbose", "V": "version",
    "w": "nodelist", "W": "wait", "x": "exclude",
}
_SHORT_NO_ARG = frozenset("hHkOQsuvVW")

_GPUS = "set slurm.gpus_per_node, slurm.gpu_type and slurm.gpu_request instead"
_ONE_TASK = "the plan runs one task per node and starts each role with srun"
_LOG = "the batch log is written under job.output_dir"
_REQUEUE = "set slurm.max_restarts instead"
#: Options launchgen writes itself (or that would break what it writes) -> what to do instead.
RESERVED: dict[str, str] = {
    "nodes": "set train.nodes and vllm.nodes instead", "ntasks": _ONE_TASK, "ntasks-per-node": _ONE_TASK,
    "gres": _GPUS, "gpus-per-node": _GPUS, "gpus": _GPUS, "gpus-per-task": _GPUS, "gpus-per-socket": _GPUS,
    "cpus-per-task": "set slurm.cpus_per_task instead", "mem": "set slurm.mem instead",
    "job-name": "set job.name instead", "output": _LOG, "error": _LOG,
    "open-mode": "the batch log is appended across requeues", "signal": "set slurm.signal_grace instead",
    "requeue": _REQUEUE, "no-requeue": _REQUEUE, "time": "set slurm.time instead",
    "partition": "set slurm.partition instead", "account": "set slurm.account instead",
    "qos": "set slurm.qos instead", "exclusive": "set slurm.exclusive instead",
    "export": "the steps need the batch environment; set variables in slurm.env",
    "chdir": "relative paths are relative to the submit directory; run sbatch from the directory you want",
    "array": "one spec is one job (the requeue and the %j paths assume it)",
    "wrap": "the generated script is the job",
    # the batch shell's and the steps' environment, working directory and I/O are launchgen's (the supervisor,
    # the step scripts and `launchgen status` depend on them): every sbatch option that changes one is refused
    "export-file": "it adds variables to the batch shell and every step; set variables in slurm.env",
    "get-user-env": "it replaces the environment with a login shell's; set variables in slurm.env or slurm.setup",
    "input": "the batch script reads no input; the steps' stdin is /dev/null",
    "uid": "the job runs as the submitting user (the job directory, the pid files and scancel assume it)",
    "gid": "the job runs with the submitting user's group (the job directory assumes it)",
    "ntasks-per-gpu": "sbatch refuses it beside the --ntasks-per-node=1 launchgen writes (one task per node)",
    "ntasks-per-tres": "it is --ntasks-per-gpu: sbatch refuses it beside the --ntasks-per-node=1 launchgen writes",
    # other spellings of what launchgen writes
    "tasks-per-node": "it is --ntasks-per-node: " + _ONE_TASK,
    "tres-per-task": "it sets --cpus-per-task (cpu=N) and --gpus-per-task (gres/gpu:N): set slurm.cpus_per_task "
                     "and the GPU fields instead",
    # an OCI container (runc/crun) around the batch script and every step: the supervisor's signals, pid files
    # and the watcher would cross a PID namespace, the hazard LG262 refuses for apptainer's --pid
    **dict.fromkeys(("container", "container-id"), "it runs the batch script and every step in an OCI container "
                    "with a PID namespace of its own (the hazard LG262 refuses): use the container section"),
    **dict.fromkeys(("help", "usage", "version", "test-only", "autocomplete"), "sbatch would not submit the job at all"),
}
#: Options that conflict only when a typed field is set: option -> (field, predicate on the section's values).
CONFLICTS: dict[str, tuple[str, str]] = {
    "mem-per-cpu": ("mem", "slurm.mem"), "mem-per-gpu": ("mem", "slurm.mem"),
    "cpus-per-gpu": ("cpus_per_task", "slurm.cpus_per_task"), "oversubscribe": ("exclusive", "slurm.exclusive"),
}
#: The reserved options launchgen does not write itself (it refuses what they would change).
_NOT_GENERATED = frozenset({"export-file", "get-user-env", "input", "uid", "gid", "ntasks-per-gpu", "ntasks-per-tres",
                            "tasks-per-node", "tres-per-task", "container", "container-id"})
#: Options sbatch refuses beside an option launchgen writes when the plan needs it ("mutually exclusive"):
#: option -> the generated option it clashes with.
REFUSED_BESIDE: dict[str, str] = {"cpus-per-gpu": "cpus-per-task", "mem-per-cpu": "mem", "mem-per-gpu": "mem"}
_VARIABLE = re.compile(r"\$(?:\{?[A-Za-z_][A-Za-z0-9_]*\}?|\(|\d)")


class DirectiveError(ValueError):
    pass


@dataclass(frozen=True)
class Option:
    written: str  # as the user wrote it, e.g. `-N3` or `--partit=debug`
    name: str  # the long option sbatch reads it as, e.g. `nodes`


def words(directive: str) -> list[str]:
    """Split like sbatch: whitespace separates, quotes group, backslash escapes, an unquoted `#` ends it."""
    lexer = shlex.shlex(directive, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as exc:
        raise DirectiveError(f"{directive!r}: {exc} (sbatch would read the rest of the line differently)") from None


def resolve_long(written: str) -> str:
    """A long option name (without `--`) or an unambiguous prefix -> its full name; unknown names are kept."""
    if written in LONG_OPTIONS:
        return written
    matches = sorted(o for o in LONG_OPTIONS if o.startswith(written))
    if len(matches) > 1:
        raise DirectiveError(f"--{written} is ambiguous to sbatch (--{', --'.join(matches)}); sbatch refuses it: "
                             "write the full option name")
    return matches[0] if matches else written


def options(directive: str) -> Iterator[Option]:
    """The options one extra directive sets, as sbatch's getopt_long would see them."""
    ws = words(directive)
    i = 0
    while i < len(ws):
        w = ws[i]
        i += 1
        if w.startswith("--") and len(w) > 2:
            name = resolve_long(w[2:].split("=", 1)[0])
            yield Option(w, name)
            if "=" not in w and LONG_OPTIONS.get(name) == "required":
                _value_follows(ws, i, w)
                i += 1  # the next word is its value
        elif w.startswith("-") and len(w) > 1:
            for j, ch in enumerate(w[1:], start=1):
                name = SHORT_OPTIONS.get(ch, ch)
                yield Option(w, name)
                if ch in SHORT_OPTIONS and ch not in _SHORT_NO_ARG:
                    if j == len(w) - 1:
                        _value_follows(ws, i, w)
                        i += 1  # `-N 3`: the value is the next word
                    break  # `-N3`: the rest of the word is the value
        else:
            raise DirectiveError(f"{w!r} in {directive!r} is not an sbatch option (options start with `-`)")


def no_variables(value: str) -> str:
    """sbatch reads `#SBATCH` lines as they are: a `$VAR` there is never expanded."""
    m = _VARIABLE.search(value)
    if m:
        raise DirectiveError(f"sbatch does not expand `{m.group()}` in #SBATCH lines (it would arrive literally); "
                             "write the value itself")
    return value


def _value_follows(ws: list[str], i: int, option: str) -> None:
    if i >= len(ws):
        raise DirectiveError(f"{option} needs a value (sbatch refuses the script without one)")


def validate(directive: str) -> str:
    """One `slurm.extra_directives` entry: syntax, `$VAR`, and no option launchgen owns (any spelling)."""
    if "\n" in directive or "\r" in directive:
        raise DirectiveError("one option per entry, no line breaks (a new line would be read as a new line of "
                             "the script)")
    s = directive.strip()
    if s.startswith("#"):
        raise DirectiveError(f"{directive!r}: write the option only, without `#SBATCH`")
    if not s.startswith("-"):
        raise DirectiveError(f"{directive!r}: an sbatch option starts with `-`")
    no_variables(s)
    for opt in options(s):
        if opt.name in RESERVED:
            spelled = "" if opt.written.lstrip("-").startswith(opt.name) else f" (sbatch reads it as --{opt.name})"
            what = "is refused" if opt.name in _NOT_GENERATED else "is generated by launchgen"
            raise DirectiveError(f"{opt.written}{spelled} {what}: {RESERVED[opt.name]}")
    return directive


def conflicts(directives: list[str], set_fields: dict[str, object]) -> Iterator[str]:
    """Messages for directives that contradict a typed slurm field that is set (e.g. --mem-per-cpu with mem)."""
    for i, d in enumerate(directives):
        for opt in options(d.strip()):
            if opt.name in CONFLICTS:
                attr, path = CONFLICTS[opt.name]
                if set_fields.get(attr):
                    yield f"entry {i} ({opt.written}) contradicts {path}, which launchgen writes as a directive"


def refused_beside(directive: str, generated: list[str]) -> list[tuple[str, str]]:
    """(option as written, generated directive) pairs of one entry that sbatch refuses beside a directive the plan
    writes, e.g. --cpus-per-gpu beside the --cpus-per-task a shared-node plan asks for."""
    have = {name: d for d in generated for name in (o.name for o in options(d))}
    return [(o.written, have[REFUSED_BESIDE[o.name]]) for o in options(directive.strip())
            if o.name in REFUSED_BESIDE and REFUSED_BESIDE[o.name] in have]


def unknown(directive: str) -> list[str]:
    """The options of one (valid) entry that no sbatch 20.11-25.11 knows, as written: sbatch refuses the whole
    script for one of them (`sbatch: unrecognized option`)."""
    return [o.written for o in options(directive.strip()) if o.name not in LONG_OPTIONS]


def release_key(release: str) -> tuple[int, int]:
    """`23.11` (or `23.11.4`, or sbatch --version's `slurm 23.11.4`) -> (23, 11)."""
    m = re.search(r"(\d+)\.(\d+)", release)
    if m is None:
        raise ValueError(f"not a Slurm release: {release!r}")
    return int(m[1]), int(m[2])


def newer_than(directive: str, release: str) -> list[tuple[str, str]]:
    """(option as written, the release that introduced it) for the options of one entry that `release` lacks."""
    have = release_key(release)
    return [(o.written, SINCE[o.name]) for o in options(directive.strip())
            if o.name in SINCE and release_key(SINCE[o.name]) > have]


def node_count(hostlist: str) -> int | None:
    """Hosts a SLURM hostlist names (`gpu[01-04,07],login1` = 6); None where it cannot be counted."""
    total = 0
    for part in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", hostlist):
        if not part:
            continue
        n = 1
        for ranges in re.findall(r"\[([^\]]*)\]", part):
            size = 0
            for r in ranges.split(","):
                lo, _, hi = r.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    return None
                size += int(hi) - int(lo) + 1 if hi else 1
            n *= size
        total += n
    return total


def _option_values(directive: str, long: str, short: str) -> Iterator[tuple[str, str]]:
    """(option as written, its value) for each `--<long>` (or a prefix of it) and `-<short>` of one entry."""
    ws = words(directive.strip())
    for i, w in enumerate(ws):
        if w.startswith("--") and resolve_long(w[2:].split("=", 1)[0]) == long:
            yield w, w.split("=", 1)[1] if "=" in w else (ws[i + 1] if i + 1 < len(ws) else "")
        elif w.startswith("-" + short):
            yield w, w[2:] or (ws[i + 1] if i + 1 < len(ws) else "")


def nodelists(directive: str) -> Iterator[tuple[str, str]]:
    """(option as written, its hostlist) for each --nodelist / -w of one entry (a value with a `/` names a file:
    `nodefiles`)."""
    return ((w, v) for w, v in _option_values(directive, "nodelist", "w") if "/" not in v)


def nodefiles(directive: str) -> Iterator[tuple[str, str]]:
    """(option as written, the file it names) for each -F/--nodefile of one entry, and each --nodelist / -w whose
    value has a `/`: sbatch reads a node list with a `/` from that file."""
    yield from _option_values(directive, "nodefile", "F")
    yield from ((w, v) for w, v in _option_values(directive, "nodelist", "w") if "/" in v)


def node_count_of_file(text: str) -> int | None:
    """Hosts a node file names: hostlists separated by commas, spaces or line breaks (None where one cannot be
    counted)."""
    return node_count(",".join(text.split()))
