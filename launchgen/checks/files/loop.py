"""LG361: train.args.eval_data's local file, read as the trainer would (the files stage)."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.trainer_args import eval_data_section
from launchgen.shared.issues import Issue

_doc("LG361", "error", "train.args.eval_data cannot be used: its local file does not exist, cannot be read, or lacks "
     "the prompt column.", "Fix train.args.eval_data (the same fields as data; relative paths start at the "
     "directory you submit from).")


@check("LG361", stage="files")
def eval_data_readable(ctx: Ctx) -> Iterator[Issue]:
    from launchgen.trainers.declarations.datafiles import PeekUnavailable, local_path, mapped, peek_local
    from launchgen.trainers.declarations.errors import TrainerSetupError

    data = eval_data_section(ctx)
    if data is None:
        return
    p = local_path(data.path)
    if p is None:
        return  # a Hub data set: loaded on the node
    if not p.exists():
        yield ctx.issue("LG361", "train.args.eval_data.path", f"eval_data.path {p} does not exist")
        return
    try:
        peek = peek_local(p, data.split)
    except PeekUnavailable:
        return
    except (TrainerSetupError, OSError, UnicodeDecodeError) as e:
        yield ctx.issue("LG361", "train.args.eval_data.path", f"eval_data.path {p}: {e}")
        return
    columns = list(mapped(peek.rows[0], data)) if peek.rows else [data.column_mapping.get(c, c) for c in peek.columns]
    if not columns:
        yield ctx.issue("LG361", "train.args.eval_data.path", f"eval_data.path {p} has no rows")
    elif data.prompt_column not in columns:
        yield ctx.issue("LG361", "train.args.eval_data",
                        f"the first row of {p} has no prompt column {data.prompt_column!r} "
                        f"(columns: {', '.join(sorted(columns))})")
