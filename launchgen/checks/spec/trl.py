"""TRL's own trainers: LG741-LG742, the TRL release and its vLLM window (`launchgen.shared.compat.TRL_VLLM_WINDOWS`);
LG922-LG923, `train.script`, the user's own TRL script (run by `launchgen.trainers.trl.script`; the file is read
by `launchgen.checks.files.trl_script`).

`check` finds the script and refuses one that does not exist; where it cannot see that the script parses TRL's
flags (no TrlParser / HfArgumentParser in its source) it warns that the job passes launchgen's values only as
LAUNCHGEN_TRL_* environment variables. A module name is looked up on the nodes, not here.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared import compat
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.declarations.trl.entries import PREFIX, TRL_ENTRIES, TRL_VERSION
from launchgen.trainers.declarations.trl.rules import TRL_RULES, broken_rules

_doc("LG922", "error", "train.script cannot run: the file does not exist, or train.trainer is not a trl.* trainer "
     "(which names the TRL config the script parses).",
     "Fix the path (relative to the directory you submit from), or set train.trainer: trl.<name>.")
_doc("LG923", "warning", "train.script's source shows no TrlParser / HfArgumentParser: launchgen's values reach it "
     "only as LAUNCHGEN_TRL_* environment variables (no command-line flags).",
     "Parse TRL's config with TrlParser (as TRL's own scripts do), or read the LAUNCHGEN_TRL_* variables.")


@check("LG922")
def script_needs_a_trl_trainer(ctx: Ctx) -> Iterator[Issue]:
    if ctx.spec.train.script is not None and ctx.trainer_facts.trl_config is None:
        same = ctx.spec.train.trainer if ctx.spec.train.trainer in TRL_ENTRIES else "grpo"
        yield ctx.issue("LG922", "train.trainer",
                        f"train.script runs a TRL script, but train.trainer is {ctx.spec.train.trainer!r}, a bundled "
                        f"trainer; name the TRL config the script parses: "
                        f"{', '.join(PREFIX + n for n in TRL_ENTRIES)}",
                        f"Set train.trainer: {PREFIX}{same} (or the trl.* config your script's TrlParser reads).")


_doc("LG741", "warning", "--live: a trl.* trainer, but the installed trl is missing (info) or not the release whose "
     "config fields check validated train.args against.", "Install launchgen[trl] (trl==1.16.0) in the job's "
     "environment.")
_doc("LG742", "warning", "The vLLM version (declared, or installed with --live) is outside the window of the TRL "
     "release a trl.* trainer runs (TRL's own client talks to the server).",
     "Run a vLLM inside TRL's window (trl 1.16: 0.22.0-0.31.0), or run a short job first.")


@check("LG742")
def declared_vllm_in_trl_window(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.version is None or ctx.trainer_facts.trl_config is None:
        return
    for i in compat.trl_issues(TRL_VERSION, v.version, table_version=TRL_VERSION, source="the spec"):
        yield ctx.issue(i.code, i.path, i.message, i.fix)


for _rule in TRL_RULES:
    _doc(_rule.code, "error", _rule.title + f" TRL {TRL_VERSION}'s {_rule.stage} refuses it.", _rule.fix)


@check(*(r.code for r in TRL_RULES))
def trl_refusals(ctx: Ctx) -> Iterator[Issue]:
    """What TRL's config or trainer would raise at the start of the job, from the values the spec holds
    (launchgen.trainers.declarations.trl.rules)."""
    cfg = ctx.resolved_config
    if not isinstance(cfg, TrlRunConfig) or ctx.world_size == 0:
        return  # a run config that does not validate is LG901's
    # a script brings its own reward functions: only the config's rules are known to hold there
    stages = ("config",) if cfg.script is not None else ("config", "trainer")
    written = ctx.spec.train.args
    for rule, message in broken_rules(cfg.entry.name, cfg.args, ctx.world_size, len(cfg.rewards), stages):
        field = next((f for f in rule.fields if f in written), None)
        yield ctx.issue(rule.code, f"train.args.{field}" if field else "train.args",
                        f"trl.{cfg.entry.name}: {message}")
