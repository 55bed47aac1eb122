"""LG814 of a node file: `-F/--nodefile` in slurm.extra_directives, or a `--nodelist`/`-w` value with a `/`
(sbatch reads such a value as a file). sbatch reads the file at submission, from the directory it runs in: a
relative path starts there, as every file the spec names does for `check`. The file goes through the regular-file
guard (`launchgen.input.specfiles`): a FIFO or a device there cannot hold `check`; one that cannot be read is a
warning naming it. The count is judged as `--nodelist`'s (launchgen.checks.spec.static)."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import check
from launchgen.checks.spec.static import node_count_differs
from launchgen.input import directives, specfiles
from launchgen.shared.issues import Issue


@check("LG814", stage="files")
def nodefile_matches_the_plan(ctx: Ctx) -> Iterator[Issue]:
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written, path in directives.nodefiles(d):
            try:
                text = specfiles.read_text(path)
            except (OSError, ValueError) as exc:
                yield ctx.issue("LG814", f"slurm.extra_directives.{i}",
                                f"{written}: cannot read the node file {path} ({exc}); its node count is not "
                                "checked against the plan's", severity="warning")
                continue
            yield from node_count_differs(ctx, i, f"{written} (the node file {path})",
                                          directives.node_count_of_file(text))
