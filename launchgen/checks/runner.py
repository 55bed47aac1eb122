"""Running the checks: the stages, locating issues in the YAML, strict mode, sorting, the codes' docs page;
and the codes the loader reports (documented here so the list is complete)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import launchgen.checks.registry as registry
from launchgen.checks.context import Ctx
from launchgen.checks.registry import CODES, Stage, _doc, check
from launchgen.checks.spec.trainerargs import without_echo
from launchgen.input.loader import LoadedSpec
from launchgen.shared.issues import Issue, Severity, SpecError

if TYPE_CHECKING:
    from launchgen.planning.plan import Plan


# === codes owned by others, documented here so the list is complete ========================================

for _code, _title, _fix in (
    ("LG000", "The spec file cannot be read.", "Pass the path of an existing, readable spec file."),
    ("LG001", "The spec is not valid YAML, not UTF-8 text, too large (over 1 MiB, or aliases expanding past "
     "100,000 values), recursive, or not a mapping.", "Fix the YAML syntax at that line."),
    ("LG002", "Unknown key.", "Remove the key or correct its spelling (`launchgen schema` lists every field)."),
    ("LG003", "A required field is missing.", "Add the field; `launchgen init` writes a commented starter spec."),
    ("LG004", "A value has the wrong type or is out of range.",
     "Give the field a value of the documented type and range (`launchgen schema`)."),
    ("LG006", "A key appears twice in one mapping (YAML would keep only the last).", "Keep one of the two entries."),
):
    _doc(_code, "error", _title, _fix)
_doc("LG005", "warning", "The vllm section is present but empty (its keys commented out), so there is no vLLM.",
     "Delete the `vllm:` line, or write `vllm: {}` for the server-mode defaults.")
# sweeps (launchgen.input.sweep expands the section; launchgen.script.sweep renders the points)
_SWEEP_CODES: tuple[tuple[str, Severity, str, str], ...] = (
    ("LG020", "error", "A sweep path names no field of the spec (or one that cannot be swept), or a `--sweep` "
     "option is not PATH=V1,V2.", "Write the path as the spec nests it (`train.args.learning_rate`); "
     "`launchgen schema` lists every field."),
    ("LG021", "error", "A sweep sets a path both in its grid and in a point, repeats a point, or sets nothing.",
     "Set each path in one place, and each point once."),
    ("LG022", "error", "A sweep has more points than one SLURM job array holds by default (1000).",
     "Sweep fewer values, or split the sweep into several specs."),
    ("LG023", "info", "A sweep's points and which of them share a job array (points whose #SBATCH lines differ, "
     "or that are heterogeneous jobs, get scripts of their own).", "Nothing to fix."),
    ("LG024", "warning", "A sweep's array script is over 4 MiB, which sbatch refuses unless the cluster raises "
     "SchedulerParameters=max_script_size.", "Split the sweep, or ask for a larger max_script_size."),
    ("LG025", "info", "A sweep renders several scripts: one job array per set of #SBATCH lines, one script per "
     "heterogeneous point.", "Submit each script."),
)
for _code, _severity, _title, _fix in _SWEEP_CODES:
    _doc(_code, _severity, _title, _fix)


@check("LG005")
def loader_warnings(ctx: Ctx) -> Iterator[Issue]:
    yield from ctx.loaded.warnings


# === running ==============================================================================================


def _locate(issue: Issue, loaded: LoadedSpec) -> Issue:
    line = issue.line if issue.line is not None else loaded.line_of(issue.path)
    return issue.located(issue.file or loaded.path, line)


def _run_stage(ctx: Ctx, stage: Stage) -> list[Issue]:
    out: list[Issue] = []
    for c in registry.CHECKS:  # read at call time: tests run the checks in shuffled orders
        if c.stage == stage:
            out.extend(_locate(i, ctx.loaded) for i in c.fn(ctx))
    return out


def _without_moot(issues: list[Issue]) -> list[Issue]:
    """With LG503 (a vllm section for a trainer that does not generate) the fix is to delete the section, so
    what else is wrong inside it is noise."""
    if not any(i.code == "LG503" for i in issues):
        return issues
    return [i for i in issues if i.path != "vllm" and not i.path.startswith("vllm.")]


def apply_strict(issues: list[Issue]) -> list[Issue]:
    """`--strict`: every warning becomes an error (infos stay infos)."""
    return [Issue(i.code, i.path, i.message, i.fix, "error", i.line, i.file) if i.severity == "warning" else i
            for i in issues]


_ORDER = {"error": 0, "warning": 1, "info": 2}


def sort_issues(issues: Iterable[Issue]) -> list[Issue]:
    return fold_alike(sorted(issues, key=lambda i: (i.line if i.line is not None else 0, _ORDER[i.severity], i.code,
                                                    i.path)))


#: this many findings that differ only in their numbers (a replica, a node, a list index) are shown as one line
FOLD_FROM = 4
_NUMBER = re.compile(r"\d+")


def fold_alike(issues: list[Issue]) -> list[Issue]:
    """Findings that repeat per replica, node or list entry (the same code, severity and fix, their message and
    path alike but for numbers) become the first of them with a count: 20,000 replicas give one LG403 line, not
    20,000. Fewer than FOLD_FROM alike stay as they are."""
    def key(i: Issue) -> tuple[str, ...]:
        return (i.code, i.severity, i.fix, i.file or "", _NUMBER.sub("#", i.path), _NUMBER.sub("#", i.message))

    groups: dict[tuple[str, ...], list[Issue]] = {}
    for i in issues:
        groups.setdefault(key(i), []).append(i)
    out: list[Issue] = []
    for i in issues:
        alike = groups[key(i)]
        if len(alike) < FOLD_FROM:
            out.append(i)
        elif alike[0] is i:
            out.append(replace(i, message=f"{i.message} (and {len(alike) - 1} more like it)"))
    return out


def has_errors(issues: Iterable[Issue]) -> bool:
    return any(i.severity == "error" for i in issues)


def run_checks(loaded: LoadedSpec, *, strict: bool = False, env: Mapping[str, str] | None = None,
               files: bool = False, script_limit: int | None = None) -> tuple[Plan | None, list[Issue]]:
    """Spec checks (and with `files` the checks of the files the spec names, which need only the Spec), then,
    if no spec check is an error, the plan and the plan checks.

    Returns the plan (None when there are errors, strict included) and every issue, sorted by line.
    Plan-resolution SpecErrors become issues; nothing a spec can contain makes this raise. `script_limit`: the
    cluster's max_script_size where `check --live` read it.
    """
    ctx = Ctx(loaded, dict(os.environ) if env is None else env, script_limit=script_limit)
    found = _without_moot(_run_stage(ctx, "spec") + (_run_stage(ctx, "files") if files else []))
    issues = without_echo(found)
    if strict:
        issues = apply_strict(issues)
    file_codes = {c for chk in registry.CHECKS if chk.stage == "files" for c in chk.codes}
    # decided on what was found, echo included: a config that does not validate builds no plan even where its
    # LG901 echo is not shown (a files-stage error on a train field takes its place)
    if any(i.severity == "error" and i.code not in file_codes for i in (*found, *issues)):
        return None, sort_issues(issues)
    from launchgen.planning.plan import build_plan  # deferred: checks load even where plan cannot be built

    try:
        plan = build_plan(loaded, ctx.resolved_config)  # the config the checks read, not a second resolution
    except SpecError as exc:
        return None, sort_issues([*issues, *(_locate(i, loaded) for i in exc.issues)])
    ctx.plan = plan
    plan_issues = [_locate(i, loaded) for i in plan.warnings] + _run_stage(ctx, "plan")
    if strict:
        plan_issues = apply_strict(plan_issues)
    issues.extend(plan_issues)
    return (None if has_errors(issues) else plan), sort_issues(issues)


_RANGES = (
    ("LG0", "Loading the spec (`launchgen/input/loader.py`)"),
    ("LG1", "GPUs and topology"),
    ("LG2", "Tensor/data parallelism and the model"),
    ("LG3", "Trainer world size, backend, batch, rewards, data"),
    ("LG4", "Ports"),
    ("LG5", "Mode rules (server, colocate, no vLLM)"),
    ("LG6", "Kernels and precision"),
    ("LG7", "Versions and `check --live`"),
    ("LG8", "Security and SLURM"),
)


def codes_markdown() -> str:
    """The LG0xx-LG8xx part of docs/check-codes.md, generated from CODES (a test keeps the file in sync)."""
    out = ["<!-- generated by launchgen.checks.codes_markdown(); edit the _doc() calls beside the checks (launchgen/checks/) -->"]
    for prefix, title in _RANGES:
        out.append(f"\n## {prefix}xx: {title}\n")
        out.append("| code | severity | meaning | fix |\n| --- | --- | --- | --- |")
        for code in sorted(c for c in CODES if c.startswith(prefix)):
            d = CODES[code]
            out.append(f"| `{code}` | {d.severity} | {d.title.replace('|', '/')} | {d.fix.replace('|', '/')} |")
    return "\n".join(out) + "\n"
