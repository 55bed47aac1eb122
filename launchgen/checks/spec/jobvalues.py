"""LG907, LG910, LG911: spec values the job script takes verbatim (the `#SBATCH` values, `job.output_dir`).

They were the plan's errors and keep their codes; `build_plan` asserts them with the same predicates
(`sbatch_value_problems`, `output_dir_problems`), since a value that breaks a `#SBATCH` line or the job
directory's expansion must never reach a script.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen import outdir
from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.issues import Issue
from launchgen.spec import Spec

#: `slurm.<field>` values that become one word of an `#SBATCH` line.
SBATCH_VALUE_FIELDS = ("partition", "account", "qos", "gpu_type", "mem")

_doc("LG907", "error", "A slurm value (partition, account, qos, gpu_type, mem) is empty or contains whitespace, "
     "which would corrupt its #SBATCH line.", "Use the name without spaces or line breaks.")
_doc("LG910", "error", "job.output_dir is empty or contains a line break or another control character.",
     "Use a plain path (the trainer receives it verbatim).")
_doc("LG911", "error", "job.output_dir uses syntax the run-time expansion does not do ($(...), ${X:-y}, a "
     "backtick, ~user, % other than %j %x %A %u %%).",
     "Write a path with only a leading ~, $NAME or ${NAME} (expanded on the node at run time; an unset "
     "variable stops the job), %j (job id), %x (job name), %A (array job id), %u (user), %% (a %).")


def sbatch_value_problems(spec: Spec) -> list[tuple[str, str]]:
    """(field path, value) of each `#SBATCH` value that is empty or has whitespace."""
    s = spec.slurm
    return [(f"slurm.{name}", val) for name in SBATCH_VALUE_FIELDS
            if (val := getattr(s, name)) is not None and (not val or any(c.isspace() for c in val))]


def output_dir_problems(path: str) -> tuple[str, list[str]] | None:
    """The code and what is wrong with `job.output_dir` (LG910: not a plain line; LG911: the run-time expansion's
    own refusals, `launchgen.outdir.problems`), or None."""
    if any(not c.isprintable() for c in path) or not path.strip():
        return "LG910", []
    bad = outdir.problems(path)
    return ("LG911", bad) if bad else None


@check("LG907")
def sbatch_values_plain(ctx: Ctx) -> Iterator[Issue]:
    for path, val in sbatch_value_problems(ctx.spec):
        yield ctx.issue("LG907", path, f"{val!r} is not a valid sbatch value (empty or whitespace)")


@check("LG910", "LG911")
def output_dir_expandable(ctx: Ctx) -> Iterator[Issue]:
    path = ctx.spec.job.output_dir
    found = output_dir_problems(path)
    if found is None:
        return
    code, bad = found
    if code == "LG910":
        yield ctx.issue("LG910", "job.output_dir", "the job directory is empty or contains a line break or "
                        "another control character")
    else:
        yield ctx.issue("LG911", "job.output_dir",
                        f"{path!r} uses what the job script does not expand: " + "; ".join(bad))
