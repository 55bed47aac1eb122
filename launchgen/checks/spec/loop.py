"""LG36x: the trainers' training-loop settings in `train.args` that `check` can judge from the spec alone."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

_doc("LG360", "warning", "train.args sets both num_train_epochs and max_steps: num_train_epochs decides the step count.",
     "Keep one: num_train_epochs to count passes over the data, or max_steps to count optimizer steps.")


@check("LG360")
def epochs_and_max_steps(ctx: Ctx) -> Iterator[Issue]:
    # The trainer's max_steps has a default (100), so a resolved config always carries one: the trainer lets a set
    # num_train_epochs win, and only the user's own spec can show that both were meant.
    if ctx.arg("num_train_epochs") is not None and ctx.arg("max_steps") is not None:
        yield ctx.issue("LG360", "train.args.max_steps",
                        f"max_steps {ctx.arg('max_steps')} is ignored: num_train_epochs "
                        f"{ctx.arg('num_train_epochs')} decides how many optimizer steps run")


