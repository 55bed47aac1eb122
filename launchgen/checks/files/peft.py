"""LG343 (FSDP1 in the user's accelerate file), LG346: the files train.args.peft refers to (the files stage)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.peft import _section
from launchgen.planning.accelerate_config import read_user_config
from launchgen.shared.issues import Issue

_doc("LG346", "error", "train.args.peft.adapter_path is a local path without a saved adapter (adapter_config.json).",
     "Point it at a PEFT adapter directory (a previous run's final/), or remove it to start new adapters.")


@check("LG343", stage="files")
def peft_fsdp_version(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    path = t.distributed.accelerate_config
    if _section(ctx) is None or t.device != "cuda" or t.backend != "fsdp" or path is None:
        return
    try:
        fsdp = read_user_config(path).get("fsdp_config")
    except (OSError, ValueError):
        return  # LG633 reports the file
    if isinstance(fsdp, dict) and str(fsdp.get("fsdp_version", 2)) == "1":
        yield ctx.issue("LG343", "train.distributed.accelerate_config",
                        f"{path} sets fsdp_version: 1; LoRA (peft) under FSDP needs FSDP2")


@check("LG346", stage="files")
def peft_adapter_path(ctx: Ctx) -> Iterator[Issue]:
    p = _section(ctx)
    if p is None or p.adapter_path is None:
        return
    path = Path(p.adapter_path).expanduser()
    if not (path / "adapter_config.json").is_file():
        what = "is a directory without adapter_config.json" if path.is_dir() else "does not exist"
        yield ctx.issue("LG346", "train.args.peft.adapter_path", f"{p.adapter_path} ({path.absolute()}) {what}")
