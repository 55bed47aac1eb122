"""Named cross-field checks: each a function registered under stable codes, returning Issues.

Field rules (types, ranges, syntax) live in the pydantic models and are reported by the loader (LG000-LG004).
Everything that relates several fields, or the spec to the model's config.json, is a check, so it gets a
code users can grep for, the dotted path of the field to change, its YAML line and a one-sentence fix.

Where a check goes is decided by what it reads (its stage), one folder each:

* `spec/`: the spec alone (with the layout, the trainer's resolved config and the model's config.json where the
  cache has it); every verb runs these. A check of the built plan (`stage="plan"`) is a spec check too: the plan
  is derived from the spec alone.
* `files/`: what the spec names on disk (data, reward modules, the model directory, the user's accelerate and
  DeepSpeed files); `stage="files"`, run by `check` only, so a script renders on a machine without the data.
* `live/`: `check --live`, probes of this cluster (sinfo, versions, GPUs, ports, caches, what slurm.setup sources).

Inside a folder, one module per subject; `registry` holds `@check` and `_doc`, `context` the `Ctx` a check
reads, `runner` the stages and `run_checks`, `constants` what checks share with docs and tests. A check module
imports those leaf modules, never this package; this package imports every module of the three folders, so a
new module needs no line anywhere. `docs/check-codes.md` lists every code; a test keeps the two in sync.

Checks run in stages. Spec checks see only the validated Spec (so they still run, and report everything at
once, when the spec is too broken to plan). If none of them is an error the plan is built and the plan checks
run on it. Each check is written so that it never raises on odd input: a value of the wrong type in the free
form `train.args` is the trainer config's problem (LG901), not a crash here.
"""

from __future__ import annotations

import importlib
import pkgutil

from launchgen.checks import files as _files
from launchgen.checks import live as _live
from launchgen.checks import spec as _spec
from launchgen.checks.constants import (
    GENERATED_SERVER_FLAGS,
    MIN_HEALTH_TIMEOUT,
    MIN_SIGNAL_GRACE,
    PORT_OFFSET_MAX,
    PORT_OFFSET_STEP,
    WIDE_BINDS,
    vllm_flag,
)
from launchgen.checks.context import Ctx, _set
from launchgen.checks.registry import CHECKS, CODES, Check, CodeDoc, Stage, _doc, check
from launchgen.checks.runner import apply_strict, codes_markdown, has_errors, run_checks, sort_issues

#: The check modules, by stage folder; importing one registers its checks and documents its codes (the order is
#: the run order, which the issues do not depend on: tests/test_layout.py shuffles it).
CHECK_MODULES: tuple[str, ...] = tuple(
    importlib.import_module(f"{pkg.__name__}.{m.name}").__name__
    for pkg in (_spec, _files, _live) for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
)

__all__ = [
    "CHECKS", "CHECK_MODULES", "CODES", "GENERATED_SERVER_FLAGS", "MIN_HEALTH_TIMEOUT", "MIN_SIGNAL_GRACE",
    "PORT_OFFSET_MAX", "PORT_OFFSET_STEP", "WIDE_BINDS", "Check", "CodeDoc", "Ctx", "Stage", "_doc", "_set",
    "apply_strict", "check", "codes_markdown", "has_errors", "run_checks", "sort_issues", "vllm_flag",
]
