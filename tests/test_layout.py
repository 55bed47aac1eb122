"""The layout resolver is total and agrees with the plan; the checks' verdict does not depend on their order.

`resolve_layout` must return values for every spec the loader accepts (the checks read it to find the
mistakes), and a spec the checks accept must never trip one of `build_plan`'s invariants. Each check is an
independent function of the spec, so running them in any order gives the same issues: that is what makes
"one message per mistake" a property of the rules rather than of their order.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_checks import CASES, base, merge, model_dir, render  # noqa: F401  (model_dir: the fixture)
from test_property import _dump, mutated_specs

import launchgen.checks.registry as registry
from launchgen import checks
from launchgen.input.loader import LoadedSpec, load_spec_text
from launchgen.shared.issues import Issue, SpecError
from launchgen.shared.layout import Layout, resolve_layout, tp_divides

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _loaded(spec: dict[str, Any]) -> LoadedSpec | None:
    try:
        return load_spec_text(_dump(spec), "spec.yaml")
    except SpecError:
        return None  # the loader's field rules refused it: nothing for the resolver to see


def _touch(lay: Layout) -> None:
    """Evaluate every derived value (a property that raises would fail here)."""
    for name in dir(Layout):
        if isinstance(getattr(Layout, name), property):
            getattr(lay, name)
    for pos in range(lay.num_nodes):
        lay.slots(pos)


@SETTINGS
@given(mutated_specs())
def test_resolver_is_total(spec: dict[str, Any]) -> None:
    loaded = _loaded(spec)
    if loaded is None:
        return
    lay = resolve_layout(loaded.spec)
    _touch(lay)
    assert lay.num_nodes == len(set(lay.trainer_positions) | set(lay.server_positions))
    assert lay.world_size == lay.num_machines * lay.processes_per_node


@SETTINGS
@given(mutated_specs())
def test_a_checked_plan_is_the_layout(spec: dict[str, Any]) -> None:
    """run_checks never raises (a PlanInvariantError would propagate), and the plan it returns places every GPU
    slot where the resolver says."""
    loaded = _loaded(spec)
    if loaded is None:
        return
    plan, _ = checks.run_checks(loaded, env={})
    if plan is None:
        return
    lay = resolve_layout(loaded.spec)
    assert plan.num_nodes == lay.num_nodes
    assert [n.slots for n in plan.nodes] == [lay.slots(p) for p in range(lay.num_nodes)]
    assert plan.trainer.num_processes == lay.world_size
    if plan.server is not None:
        assert plan.server.data_parallel_size_local * len(plan.server.positions) == lay.data_parallel_size


def _issues(loaded: LoadedSpec, order: list[checks.Check], monkeypatch: pytest.MonkeyPatch) -> list[Issue]:
    monkeypatch.setattr(registry, "CHECKS", order)  # what run_checks reads
    _, issues = checks.run_checks(loaded, env={}, files=True)
    return issues


@SETTINGS
@given(mutated_specs(), st.randoms(use_true_random=False))
def test_check_order_does_not_change_the_issues(spec: dict[str, Any], rnd: random.Random) -> None:
    loaded = _loaded(spec)
    if loaded is None:
        return
    registered = list(checks.CHECKS)
    shuffled = rnd.sample(registered, len(registered))
    with pytest.MonkeyPatch.context() as mp:
        assert _issues(loaded, shuffled, mp) == _issues(loaded, registered, mp)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_fixtures_give_the_same_issues_in_every_stage_order(
        request: pytest.FixtureRequest, case: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    model: Path = request.getfixturevalue("model_dir")  # test_checks' local model with a config.json
    loaded = load_spec_text(render(merge(base(model), case[1])), "spec.yaml")
    registered = list(checks.CHECKS)
    want = _issues(loaded, registered, monkeypatch)
    assert case[0] in {i.code for i in want}
    for seed in range(5):
        assert _issues(loaded, random.Random(seed).sample(registered, len(registered)), monkeypatch) == want
    assert _issues(loaded, registered[::-1], monkeypatch) == want


@pytest.mark.parametrize(("processes", "tp", "ok"), [(8, 1, True), (8, 4, True), (8, 3, False), (3, 2, False),
                                                     (0, 1, True), (4, 0, False)])
def test_tp_divides_is_the_one_tp_rule(processes: int, tp: int, ok: bool) -> None:
    from launchgen.trainers.generation.vllm_colocate import tp_groups

    assert tp_divides(processes, tp) is ok
    if ok and tp:
        assert [r for g in tp_groups(processes, tp) for r in g] == list(range(processes))
    else:
        with pytest.raises(ValueError, match="must divide"):
            tp_groups(processes, tp)


def test_slots_carry_tp_and_dp_ranks() -> None:
    text = ("job: {name: t}\nmodel: {name_or_path: m}\nvllm: {nodes: 2, tensor_parallel_size: 4, "
            "data_parallel_size: 4}\ntrain: {args: {data: {path: d}}}\n")
    lay = resolve_layout(load_spec_text(text).spec)
    assert lay.server_positions == (1, 2) and lay.data_parallel_size_local == 2 and lay.multi_node_dp
    second = [(s.global_rank, s.tp_rank, s.dp_rank) for s in lay.slots(2)]
    assert second == [(8 + j, j % 4, 2 + j // 4) for j in range(8)]
