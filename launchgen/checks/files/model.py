"""LG210-LG211: a local model path exists and is a model directory (the Hub id rule decides what is local).

transformers treats `name_or_path` as a directory when one exists there, else as a Hub repo id, which is at most
`org/name` of word characters, `-` and `.`. So a name that cannot be a repo id (`./m`, `/abs/m`, `runs/a/final`)
is a local path whatever happens, and a missing one fails only on the node, after the queue wait.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

#: huggingface_hub's repo id rule (validate_repo_id): optional namespace, a name, no `--` or `..`.
_REPO_ID_RE = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]+$")

_doc("LG210", "error", "model.name_or_path is a local path (it cannot be a Hub id) that does not exist, or a "
     "directory without config.json.", "Fix the path (relative paths start at the submit directory), or build or "
     "download the model there first.")
_doc("LG211", "warning", "model.name_or_path looks like a Hub id but its first part is a local directory: "
     "probably a local path that does not exist yet.",
     "Create the model directory first, or use ./ to mark a local path (a Hub id is downloaded on the nodes).")


def is_repo_id(name: str) -> bool:
    return bool(_REPO_ID_RE.match(name)) and "--" not in name and ".." not in name and len(name) <= 96


@check("LG210", "LG211", stage="files")
def model_path_exists(ctx: Ctx) -> Iterator[Issue]:
    name = ctx.spec.model.name_or_path
    # os.path.expanduser leaves `~nosuchuser` as it is (pathlib's raises); a name no path can be is not local
    p = Path(os.path.expanduser(name))
    try:
        is_dir, exists = p.is_dir(), p.exists()
    except OSError:
        is_dir = exists = False
    if is_dir:
        if not (p / "config.json").is_file():
            yield ctx.issue("LG210", "model.name_or_path",
                            f"{name} is a directory without config.json, so transformers cannot load a model from it")
        return
    if exists:
        yield ctx.issue("LG210", "model.name_or_path", f"{name} is a file; a model is a directory with config.json")
    elif not is_repo_id(name):
        yield ctx.issue("LG210", "model.name_or_path",
                        f"{name} (= {p.absolute()}) does not exist, and it cannot be a Hub id (those are org/name)")
    elif "/" in name and Path(name.split("/")[0]).is_dir():
        yield ctx.issue("LG211", "model.name_or_path",
                        f"{name} is not a directory here, but {name.split('/')[0]}/ is: the nodes will try to "
                        f"download {name!r} from the Hub")
