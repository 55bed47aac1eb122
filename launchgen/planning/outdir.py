"""`job.output_dir` expansion: the one owner of what the job script expands there, at run time on the node.

A leading `~` (or `~/`) is $HOME; `$NAME` / `${NAME}` an environment variable (unset: the job stops with a
message); `%j` the job id (`local` under --bash), `%x` the job name, `%A` the array job id (the job id outside
arrays), `%u` the user, `%%` a `%`. Nothing else is interpreted: no eval, no globbing, no command substitution.
Variable values are inserted as they are (their own `%` or `$` are not expanded again).

`problems` lists the syntax the script does not expand (check: LG911); `expand` is the same rule in Python, the
reference the tests hold the rendered script (templates/partials/jobdir.j2) to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PERCENT = {"j": "job id", "x": "job name", "A": "array job id", "u": "user", "%": "a literal %"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_PCT = re.compile(r"%(.?)")


def problems(path: str) -> list[str]:
    """What in `path` the run-time expansion would not do (each as a short phrase); empty when it is fine."""
    bad = []
    rest = _VAR.sub("", path)
    if "$" in rest or "`" in rest:
        bad.append("`$` other than $NAME / ${NAME} (no defaults, no command substitution) or a backtick")
    if path.startswith("~") and not (path == "~" or path.startswith("~/")):
        bad.append("`~user` (only a leading `~` or `~/`, for $HOME)")
    odd = sorted({m.group(1) or "(end)" for m in _PCT.finditer(path) if m.group(1) not in PERCENT})
    if odd:
        bad.append("`%` followed by " + ", ".join(odd) + " (only %j, %x, %A, %u and %%)")
    return bad


def _percent(text: str, codes: Mapping[str, str]) -> str:
    return _PCT.sub(lambda m: codes.get(m.group(1), m.group(0)), text)


class UnsetVariable(KeyError):
    """`$NAME` in job.output_dir names a variable that is not set."""


def expand(path: str, *, job_id: str, job_name: str, user: str, env: Mapping[str, str],
           array_job_id: str | None = None) -> str:
    """The directory the job script makes of `path` (a path `problems` accepts)."""
    codes = {"j": job_id, "x": job_name, "A": array_job_id or job_id, "u": user, "%": "%"}
    out = ""
    if path == "~" or path.startswith("~/"):
        out, path = env["HOME"], path[1:]
    pos = 0
    for m in _VAR.finditer(path):
        name = m.group(1) or m.group(2)
        if name not in env:
            raise UnsetVariable(name)
        out += _percent(path[pos:m.start()], codes) + env[name]
        pos = m.end()
    return out + _percent(path[pos:], codes)


def for_point(path: str, point: str) -> str:
    """A sweep point's `job.output_dir`: the sweep's directory (`path` with `%j` read as the array's job id, `%A`,
    which every task of an array and every attempt of a requeued task share) and the point's name below it."""
    swept = _PCT.sub(lambda m: "%A" if m.group(1) == "j" else m.group(0), path)
    return f"{swept.rstrip('/')}/{point}" if swept.rstrip("/") else f"/{point}"
