"""A rendered script reads as the request: what runs where comes first, launchgen's machinery after a rule."""

from __future__ import annotations

import pytest
from render_cases import EXAMPLES, SCHEDULERS, VARIANTS, plan_for, renderable

from launchgen.script.render import MACHINERY_RULE, REQUEST_RULE, render_script, words

CASES = [(n, s) for n in [*EXAMPLES, *VARIANTS] for s in SCHEDULERS if renderable(n, s)]


def test_single_node_split_shows_its_two_commands_on_the_first_screens() -> None:
    lines = render_script(plan_for("single-node-split"), "sbatch").splitlines()
    first = "\n".join(lines[:150])
    assert "\n    exec vllm serve Qwen/Qwen2.5-7B " in first
    assert "\naccelerate launch --config_file " in first


@pytest.mark.parametrize(("name", "sched"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_the_request_comes_before_the_machinery(name: str, sched: str) -> None:
    plan = plan_for(name)
    text = render_script(plan, sched)  # type: ignore[arg-type]
    request, machinery = text.split(MACHINERY_RULE)
    assert text.count(REQUEST_RULE) == 1 and request.index(REQUEST_RULE) < request.index("lg_write_request() {")
    commands = [words(plan.trainer.argv)]
    if plan.server is not None:
        commands += [words(c.argv) for r in plan.server.replicas for c in r.commands]
    for command in commands:
        assert command in request and command not in machinery
    for name_ in ("launchgen-plan.static.json", "steps/preflight.py", "steps/vllmprobe.py", "steps/lib.sh", "steps/signal.sh"):
        assert f'"$LG_JOB_DIR"/{name_} ' not in request
    # the machinery writes the request's files where it wrote them before: after keeping a used directory's records
    assert machinery.index("\nlg_write_request\n") > machinery.index("lg_keep_records \"$LG_JOB_DIR\"")
