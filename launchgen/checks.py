"""Named cross-field checks: each a function registered under stable codes, returning Issues.

Field rules (types, ranges, syntax) live in the pydantic models and are reported by the loader (LG000-LG004).
Everything that relates several fields, or the spec to the model's config.json, is a check, so it gets a
code users can grep for, the dotted path of the field to change, its YAML line and a one-sentence fix.

This module is the one callers import (`run_checks`, `CHECKS`, `CODES`, `Ctx`, `check`, `_doc`); the checks
live in `launchgen/rules/`, one module per code range: `gpus` LG1xx GPUs/topology, `tp` LG2xx TP/DP/model,
`world` LG3xx trainer world/backend/batch, `ports` LG4xx, `modes` LG5xx mode rules, `kernels` LG6xx
kernels/precision, `versions` LG7xx versions (`check --live` in `launchgen/live.py`), `security` LG8xx
security and SLURM misc; `registry` holds `@check` and `_doc`, `context` the `Ctx` a check reads, `runner`
the stages and `run_checks`. LG9xx are plan-resolution errors raised by `plan.py`, except LG902-LG904 and
LG908, rules that moved into the checks from the plan with their codes (the plan now only asserts them). The
layout every check reads is `launchgen.layout`'s. `docs/check-codes.md` lists every code; a test keeps the two
in sync.

Checks run in two stages. Spec checks see only the validated Spec (so they still run, and report everything at
once, when the spec is too broken to plan). If none of them is an error the plan is built and the plan checks
run on it. Each check is written so that it never raises on odd input: a value of the wrong type in the free
form `train.args` is the trainer config's problem (reported when the plan validates it), not a crash here.
A third stage, `files` (`launchgen/preflight/`), reads what the spec names on disk; only `check` runs it.
"""

from __future__ import annotations

# Not sorted: the registry and Ctx come first, since the check modules imported after them (preflight and
# static_checks in particular) import them from here.
# isort: off
from launchgen.rules.registry import CHECKS, CODES, Check, CodeDoc, Stage, _doc, check
from launchgen.rules.context import Ctx, _set
from launchgen.rules.constants import (
    GENERATED_SERVER_FLAGS,
    MIN_HEALTH_TIMEOUT,
    MIN_SIGNAL_GRACE,
    PORT_OFFSET_MAX,
    PORT_OFFSET_STEP,
    WIDE_BINDS,
    vllm_flag,
)

# The checks, by code range; importing a module registers its checks (the order is the run order, which the
# issues do not depend on: tests/test_layout.py shuffles it).
from launchgen.rules import (
    gpus, tp, world, ports, kernels, modes, versions, security, jobvalues, cpuserver, trainerargs, runner,
)
from launchgen.rules.kernels import (
    FLASH_ATTN2_REPO,
    attn_setting,
    cuda_is_128,
    is_hub_kernel,
    liger_enabled,
    split_kernel,
)
from launchgen.rules.modes import trainer_args_not_owned
from launchgen.rules.ports import PORT_NAMES, port_uses
from launchgen.rules.runner import apply_strict, codes_markdown, has_errors, run_checks, sort_issues

# Checks kept in their own modules register themselves on import, with the `check` and `_doc` above (one import
# a module: add yours on its own line).
from launchgen import preflight as _preflight  # noqa: F401
from launchgen import static_checks as _static_checks  # noqa: F401
from launchgen import loopchecks as _loopchecks  # noqa: F401
from launchgen import distchecks as _distchecks  # noqa: F401
from launchgen import trlchecks as _trlchecks  # noqa: F401
# isort: on

__all__ = [
    "CHECKS", "CODES", "FLASH_ATTN2_REPO", "GENERATED_SERVER_FLAGS", "MIN_HEALTH_TIMEOUT", "MIN_SIGNAL_GRACE",
    "PORT_NAMES", "PORT_OFFSET_MAX", "PORT_OFFSET_STEP", "WIDE_BINDS", "Check", "CodeDoc", "Ctx", "Stage", "_doc",
    "_set", "apply_strict", "attn_setting", "check", "codes_markdown", "cpuserver", "cuda_is_128", "gpus", "has_errors",
    "is_hub_kernel", "jobvalues", "kernels", "liger_enabled", "modes", "port_uses", "ports", "run_checks", "runner",
    "security", "sort_issues", "split_kernel", "tp", "trainer_args_not_owned", "trainerargs", "versions", "vllm_flag", "world",
]
