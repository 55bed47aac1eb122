"""LG330-LG334: `data.path` exists, is a format the trainer reads, and its first rows have the columns it needs.

Peeks with the trainer's own readers (`launchgen.trainers.declarations.datafiles`): the first rows of JSON Lines / JSON /
Parquet or a `save_to_disk` folder, never the whole file. Needed columns: the prompt column for the online
trainers, one of each built-in reward's columns (`rewards.BUILTIN_COLUMNS`), an SFT row format for `sft`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.trainer_args import data_section, reward_specs
from launchgen.input import specfiles
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.config import DataSection
from launchgen.trainers.declarations.datafiles import (
    LOCAL_SUFFIXES,
    PeekUnavailable,
    local_path,
    mapped,
    peek_local,
)
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.declarations.rewards import BUILTIN_COLUMNS

#: Column names data sets commonly use for the prompt and for the reference answer, to suggest a mapping.
PROMPT_LIKE = ("question", "problem", "query", "instruction", "input", "prompt_text")
ANSWER_LIKE = ("gold", "solution", "target", "label", "final_answer", "ground_truth", "reference", "output")


def _guess(want: str, have: list[str], likely: tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(want, have, n=1, cutoff=0.5)
    return close[0] if close else next((c for c in likely if c in have), None)


_doc("LG330", "error", "data.path names a local file or folder that does not exist (from the current directory).",
     "Fix the path; relative paths are resolved from the directory you submit from (run check there).")
_doc("LG331", "error", "data.path cannot be read as training data (format, JSON syntax, no rows, split).",
     f"Use a {', '.join(LOCAL_SUFFIXES)} file or a datasets save_to_disk folder with at least one row.")
_doc("LG332", "error", "The data's first row lacks the column(s) the trainer needs (prompt column; SFT format).",
     "Set train.args.data.prompt_column, or rename columns with train.args.data.column_mapping.")
_doc("LG333", "error", "The data's first row lacks the column a built-in reward needs (accuracy: answer/solution).",
     "Rename the reference column with train.args.data.column_mapping (e.g. {gold: answer}), or drop the reward.")
_doc("LG334", "info", "The data was not peeked at (a Hub data set, pyarrow missing, a large JSON mapping).", "")


def _shown(p: Path) -> str:
    return str(p) if p.is_absolute() else f"{p} (= {Path(os.getcwd()) / p})"


def _near(p: Path) -> str | None:
    parent = p.parent if str(p.parent) else Path(".")
    try:
        names = [c.name for c in parent.iterdir()]
    except OSError:
        return None
    close = difflib.get_close_matches(p.name, names, n=1, cutoff=0.6)
    return str(parent / close[0]) if close else None


def _columns_issues(ctx: Ctx, data: DataSection, columns: list[str], what: str) -> Iterator[Issue]:
    have = sorted(columns)
    listed = ", ".join(have) or "none"
    facts = ctx.trainer_facts
    if facts.data == "pairs":  # offline preference rows (trl.dpo)
        missing = [c for c in ("prompt", "chosen", "rejected") if c not in columns]
        if missing:
            yield ctx.issue("LG332", "train.args.data", f"{what}: preference rows need prompt, chosen and rejected "
                            f"columns; missing {', '.join(missing)} (columns: {listed})",
                            "rename them with train.args.data.column_mapping")
        return
    if facts.data == "examples":
        from launchgen.trainers.declarations.datafiles import detect_sft_format

        try:
            detect_sft_format(dict.fromkeys(columns), data.prompt_column)
        except TrainerSetupError as e:
            yield ctx.issue("LG332", "train.args.data", f"{what}: {e}")
        return
    if facts.data != "prompts":
        return
    if data.prompt_column not in columns:
        path = "train.args.data.prompt_column" if "prompt_column" in data.model_fields_set else "train.args.data"
        guess = _guess(data.prompt_column, have, PROMPT_LIKE)
        fix = (f"set train.args.data.prompt_column: {guess} (or map it: column_mapping: {{{guess}: "
               f"{data.prompt_column}}})" if guess else None)
        yield ctx.issue("LG332", path, f"{what} has no prompt column {data.prompt_column!r} (columns: {listed})", fix)
    for path, spec in reward_specs(ctx):
        need = BUILTIN_COLUMNS.get(spec.name)
        if need and not any(c in columns for c in need):
            one = " or ".join(need)
            where = f"{path}.name" if path != "train.args.rewards" else "train.args.data"
            default = " (the default reward: train.args.rewards is unset)" if path == "train.args.rewards" else ""
            guess = _guess(need[0], have, ANSWER_LIKE) or "<your column>"
            yield ctx.issue("LG333", where, f"reward {spec.name!r}{default} reads a column {one}, but {what} has "
                            f"only: {listed}; its first generation step would fail",
                            f"map the reference column: train.args.data.column_mapping: {{{guess}: {need[0]}}}, "
                            "or choose rewards that need no reference")


@check("LG330", "LG331", "LG332", "LG333", "LG334", stage="files")
def data_readable(ctx: Ctx) -> Iterator[Issue]:
    data = data_section(ctx)
    if data is None:
        return
    p = local_path(data.path)
    if p is None:
        yield ctx.issue("LG334", "train.args.data.path",
                        f"data.path {data.path!r} is not a local path, so the trainer loads it as a Hub data set "
                        "with `datasets` (not checked here; on offline nodes it must be in the HF cache)")
        return
    if not p.exists():
        near = _near(p)
        yield ctx.issue("LG330", "train.args.data.path", f"data.path {_shown(p)} does not exist",
                        f"did you mean {near}?" if near else None)
        return
    try:
        if not p.is_dir():
            specfiles.check_regular(p)  # a FIFO or a device would block or never end
        peek = peek_local(p, data.split)
    except PeekUnavailable as e:
        yield ctx.issue("LG334", "train.args.data.path", f"columns not checked: {e}")
        return
    except (TrainerSetupError, OSError, UnicodeDecodeError) as e:
        path = "train.args.data.split" if "data.split" in str(e) else "train.args.data.path"
        yield ctx.issue("LG331", path, str(e) if isinstance(e, TrainerSetupError) else f"data.path {p}: {e}")
        return
    if not peek.rows and not peek.columns:
        yield ctx.issue("LG331", "train.args.data.path", f"data.path {p} has no rows")
        return
    columns = list(mapped(peek.rows[0], data)) if peek.rows else [data.column_mapping.get(c, c) for c in peek.columns]
    yield from _columns_issues(ctx, data, columns, f"the first row of {p}")
