"""LG320-LG323: every reward the trainer will load resolves, checked without importing it.

Built-in names come from the trainers' own registry (`launchgen.trainers.declarations.rewards.BUILTINS`, torch-free); a
`module:function` is located on the trainer's import path (`pypath`) and its source parsed for the function.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.files.pypath import find_module, module_source, search_path, top_level_names
from launchgen.checks.registry import _doc, check
from launchgen.checks.trainer_args import reward_specs
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.rewards import BUILTINS

#: Names users write for a built-in (its function's name in rewards.py, TRL habits).
ALIASES = {"format_reward": "format", "accuracy_reward": "accuracy", "length_reward": "length"}
FORM = "`package.module:function` (a colon before the function)"

_doc("LG320", "error", "A reward name is neither a built-in nor `module:function`.",
     f"Use a built-in ({', '.join(BUILTINS)}) or {FORM}.")
_doc("LG321", "error", "A reward is written TRL-style as a dotted path (`my_rewards.brevity`).",
     "Put a colon between the module and the function: `my_rewards:brevity`.")
_doc("LG322", "error", "A reward's module is not importable from the submit directory, PYTHONPATH or the job's "
     "virtualenv (a warning when slurm.setup may change the import path).",
     "Put the module in the directory you submit from, add its folder to slurm.env.trainer.PYTHONPATH, or pip "
     "install it into the job's environment.")
_doc("LG323", "error", "A reward's module does not define the function, or cannot be parsed.",
     "Name a function the module defines at top level (`module:function`), or fix the module's syntax.")


def _builtin_fix(name: str) -> str:
    if name in ALIASES:
        return f"write `{ALIASES[name]}` (the built-in's name)"
    close = difflib.get_close_matches(name.lower(), list(BUILTINS), n=1, cutoff=0.6)
    if close:
        return f"did you mean the built-in `{close[0]}`?"
    return f"use a built-in ({', '.join(BUILTINS)}) or {FORM} for a function of your own"


def _name_issue(ctx: Ctx, path: str, name: str) -> Issue | None:
    """LG320/LG321 for a name without a usable `module:function` shape; None when the shape is fine."""
    where = f"{path}.name" if path != "train.args.rewards" else path
    if ":" in name:
        mod, _, fn = name.partition(":")
        if not (mod and fn and ":" not in fn):
            return ctx.issue("LG320", where, f"reward {name!r} is not `module:function`",
                             f"write it as {FORM}, e.g. `my_rewards:brevity`")
        if not all(p.isidentifier() for p in mod.split(".")) or not fn.isidentifier():
            return ctx.issue("LG320", where, f"reward {name!r}: {mod!r} / {fn!r} cannot be imported by name "
                             "(Python names are letters, digits and _, dotted for packages)",
                             f"rename the file to a valid module name (e.g. `{mod.replace('-', '_')}.py`)")
        return None
    if "." in name and all(p.isidentifier() for p in name.split(".")):
        mod, _, fn = name.rpartition(".")
        return ctx.issue("LG321", where, f"reward {name!r} is a dotted path; launchgen loads `module:function`",
                         f"write `{mod}:{fn}` (TRL takes callables; here the module and the function are "
                         "separated by a colon)")
    return ctx.issue("LG320", where, f"reward {name!r} is not a built-in ({', '.join(BUILTINS)})",
                     _builtin_fix(name))


def _module_issues(ctx: Ctx, path: str, name: str) -> Iterator[Issue]:
    where = f"{path}.name"
    mod, _, fn = name.partition(":")
    sp = search_path(ctx)
    spec = find_module(mod, sp.paths)
    if spec is None:
        hint = (f"; slurm.setup line {sp.opaque_setup!r} may provide it in the job" if sp.opaque_setup else "")
        yield ctx.issue("LG322", where,
                        f"module {mod!r} of reward {name!r} is not found in the submit directory (here), "
                        f"PYTHONPATH or the job's virtualenv{hint}",
                        severity="warning" if sp.opaque_setup else None)
        return
    source = module_source(spec)
    if source is None:
        return  # a compiled or namespace module: nothing to read without importing it
    try:
        names = top_level_names(source)
    except SyntaxError as e:
        yield ctx.issue("LG323", where, f"{spec.origin}:{e.lineno}: the module of reward {name!r} has a syntax "
                        f"error ({e.msg}); the trainer's import would fail")
        return
    if names is None or fn in names:
        return
    close = difflib.get_close_matches(fn, sorted(n for n in names if not n.startswith("_")), n=1, cutoff=0.6)
    yield ctx.issue("LG323", where, f"{spec.origin} defines no {fn!r} (reward {name!r})",
                    f"did you mean `{mod}:{close[0]}`?" if close else None)


@check("LG320", "LG321", "LG322", "LG323", stage="files")
def rewards_resolve(ctx: Ctx) -> Iterator[Issue]:
    if not ctx.trainer_facts.online:
        return
    for path, spec in reward_specs(ctx):
        if spec.model is not None or spec.name is None or spec.name in BUILTINS:
            continue  # a reward model is loaded on the node (its path may only exist there)
        bad = _name_issue(ctx, path, spec.name)
        if bad is not None:
            yield bad
        else:
            yield from _module_issues(ctx, path, spec.name)
