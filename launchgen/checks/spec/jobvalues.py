"""LG907, LG910, LG911: spec values the job script takes verbatim (the `#SBATCH` values, `job.output_dir`).

They were the plan's errors and keep their codes; `build_plan` asserts them with the same predicates
(`invariants.sbatch_value_problems`, `invariants.output_dir_problems`), since a value that breaks a `#SBATCH` line or the job
directory's expansion must never reach a script.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.planning.invariants import output_dir_problems, sbatch_value_problems
from launchgen.shared.issues import Issue

_doc("LG907", "error", "A slurm value (partition, account, qos, gpu_type, mem) is empty or contains whitespace, "
     "which would corrupt its #SBATCH line.", "Use the name without spaces or line breaks.")
_doc("LG910", "error", "job.output_dir is empty or contains a line break or another control character.",
     "Use a plain path (the trainer receives it verbatim).")
_doc("LG911", "error", "job.output_dir uses syntax the run-time expansion does not do ($(...), ${X:-y}, a "
     "backtick, ~user, % other than %j %x %A %u %%).",
     "Write a path with only a leading ~, $NAME or ${NAME} (expanded on the node at run time; an unset "
     "variable stops the job), %j (job id), %x (job name), %A (array job id), %u (user), %% (a %).")


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
