"""Built-in rewards, `module:function` loading and the scoring table."""

from __future__ import annotations

import math

import pytest
from launchgen.trainers.declarations import rewards as rw
from launchgen.trainers.declarations.config import RewardSpec
from launchgen.trainers.declarations.errors import TrainerSetupError


def test_accuracy_boxed_and_last_number() -> None:
    comps = ["so \\boxed{\\frac{1}{2}}", "The answer is 42.", "I think 41", "\\boxed{1,000}", "nothing"]
    golds = ["1/2", "42", "42", "1000", "3"]
    assert rw.accuracy([""] * 5, comps, answer=golds) == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_accuracy_solution_column_with_boxed_and_missing_gold() -> None:
    out = rw.accuracy(["", ""], ["\\boxed{x^{2}}", "7"], solution=["we get \\boxed{x^{2}}", None])
    assert out == [1.0, None]


def test_accuracy_conversational_completion() -> None:
    assert rw.accuracy([[{"role": "user", "content": "q"}]], [[{"role": "assistant", "content": "=5"}]], answer=["5"]) == [1.0]


def test_accuracy_needs_a_column() -> None:
    with pytest.raises(ValueError, match="answer"):
        rw.accuracy([""], ["1"])


def test_format_default_and_custom() -> None:
    comps = ["<think>a\nb</think> <answer>1</answer>", "<answer>1</answer>"]
    assert rw.format_reward(["", ""], comps) == [1.0, 0.0]
    assert rw.format_reward(["", ""], comps, pattern=r"<answer>\d</answer>", match="search") == [1.0, 1.0]


def test_length() -> None:
    assert rw.length(["", ""], ["x" * 10, "x" * 25], target=20) == pytest.approx([0.5, 0.75])
    assert rw.length([""], ["a b c"], target=3, unit="words") == [1.0]
    assert rw.length([""], ["abc"], target=2, unit="tokens", completion_ids=[[1, 2]]) == [1.0]


def test_load_custom_and_names() -> None:
    loaded = rw.load_rewards(
        [RewardSpec(name="accuracy"), RewardSpec(name="os.path:join", weight=0.5), RewardSpec(name="accuracy")]
    )
    assert [x.name for x in loaded] == ["accuracy", "join", "accuracy_2"]
    assert loaded[1].weight == 0.5


@pytest.mark.parametrize("name,msg", [("nope", "neither a built-in"), ("no_such_mod_xyz:f", "cannot import"),
                                      ("os:nothing_here", "no callable"),
                                      ("my_rewards.brevity", "write `my_rewards:brevity`")])
def test_load_errors(name: str, msg: str) -> None:
    with pytest.raises(TrainerSetupError, match=msg):
        rw.load_rewards([RewardSpec(name=name)])


def test_score_table_none_to_nan_and_columns_and_kwargs() -> None:
    seen: dict[str, object] = {}

    def f(prompts, completions, completion_ids, answer, scale, **kw):
        seen.update(answer=answer, ids=completion_ids)
        return [None if c == "skip" else scale * len(c) for c in completions]

    table = rw.score([rw.LoadedReward("f", f, 1.0, {"scale": 2.0})], ["p", "p"], ["ab", "skip"], [[1], [2]], {"answer": ["1", "2"]})
    assert table[0] == [4.0] and math.isnan(table[1][0])
    assert seen == {"answer": ["1", "2"], "ids": [[1], [2]]}


def test_score_rejects_bad_return() -> None:
    with pytest.raises(TypeError, match="expected a list of 2"):
        rw.score([rw.LoadedReward("bad", lambda **k: [1.0], 1.0, {})], ["", ""], ["a", "b"], [[], []], {})
    with pytest.raises(TypeError, match="'x' at index 0"):
        rw.score([rw.LoadedReward("bad", lambda **k: ["x"], 1.0, {})], [""], ["a"], [[]], {})
