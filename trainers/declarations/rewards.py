"""Reward functions: built-ins and `package.module:function`, with TRL's call convention.

A reward function is called once per generation batch on one process's completions:

    f(prompts=[...], completions=[...], completion_ids=[[...]], **columns, **spec.kwargs) -> list[float | None]

`prompts` / `completions` are strings for plain-text prompts, and message lists (`[{"role": ..., "content":
...}]`, the completion as one assistant message) for conversational prompts, as in TRL. Every other data set column
arrives as a keyword list aligned with the completions, so functions must accept `**kwargs`. `None` means "cannot
score this one": a completion that every function scores None is excluded from the advantage statistics.

Built-ins: `accuracy` (math answer vs an `answer`/`solution` column: last `\\boxed{}` or else last number),
`format` (regex, default `<think>...</think><answer>...</answer>`), `length` (closeness to a target length).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launchgen.trainers.declarations.config import RewardSpec
from launchgen.trainers.declarations.errors import TrainerSetupError

RewardFn = Callable[..., list[float | None]]

#: Data columns a built-in reward reads, by reward: it needs one of them (after data.column_mapping). `check`
#: reads this to refuse data that lacks them; a test keeps it equal to the functions' own parameters.
BUILTIN_COLUMNS: dict[str, tuple[str, ...]] = {"accuracy": ("answer", "solution")}

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _text(x: Any) -> str:
    """The text of a completion/prompt in either TRL format (string, or a list of messages)."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        return str(x[-1].get("content", ""))
    if isinstance(x, dict):
        return str(x.get("content", ""))
    return "" if x is None else str(x)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces may nest), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def _normalize(ans: str) -> str:
    s = ans.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace(" ", "").rstrip(".")
    s = re.sub(r"^\\d?frac\{([^}]*)\}\{([^}]*)\}$", r"\1/\2", s)
    return s.lower()


def _as_number(s: str) -> float | None:
    t = s.replace(",", "")
    try:
        if re.fullmatch(r"-?\d+/\d+", t):
            num, den = t.split("/")
            return float(num) / float(den)
        return float(t)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(pred: str, gold: str) -> bool:
    p, g = _normalize(pred), _normalize(gold)
    if p == g:
        return True
    pn, gn = _as_number(p), _as_number(g)
    return pn is not None and gn is not None and math.isclose(pn, gn, rel_tol=1e-6, abs_tol=1e-9)


def accuracy(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    solution: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the completion's final answer equals the reference; None when there is no usable reference."""
    golds = answer if answer is not None else solution
    if golds is None:
        cols = " or ".join(f"`{c}`" for c in BUILTIN_COLUMNS["accuracy"])
        raise ValueError(f"the accuracy reward needs an {cols} column (see data.column_mapping)")
    out: list[float | None] = []
    for comp, gold in zip(completions, golds, strict=True):
        gold_text = extract_answer(str(gold)) if gold is not None and last_boxed(str(gold)) else (
            None if gold is None else str(gold)
        )
        if gold_text is None or not gold_text.strip():
            out.append(None)
            continue
        pred = extract_answer(_text(comp))
        out.append(1.0 if pred is not None and answers_match(pred, gold_text) else 0.0)
    return out


DEFAULT_FORMAT = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def format_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    pattern: str = DEFAULT_FORMAT,
    match: str = "full",
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the completion matches `pattern` (DOTALL); `match`: full (default) or search."""
    rx = re.compile(pattern, re.DOTALL)
    fn = rx.fullmatch if match == "full" else rx.search
    return [1.0 if fn(_text(c)) else 0.0 for c in completions]


def length(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    target: int = 200,
    unit: str = "chars",
    completion_ids: Sequence[Sequence[int]] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1 - |len - target| / target, floored at 0; `unit`: chars, words or tokens."""
    if target <= 0:
        raise ValueError("the length reward needs target > 0")
    out: list[float | None] = []
    for i, c in enumerate(completions):
        if unit == "tokens":
            if completion_ids is None:
                raise ValueError("length reward with unit tokens needs completion_ids")
            n = len(completion_ids[i])
        elif unit == "words":
            n = len(_text(c).split())
        else:
            n = len(_text(c))
        out.append(max(0.0, 1.0 - abs(n - target) / target))
    return out


BUILTINS: dict[str, RewardFn] = {"accuracy": accuracy, "format": format_reward, "length": length}


@dataclass
class LoadedReward:
    name: str  # metric name: rewards/<name>/mean
    fn: RewardFn
    weight: float
    kwargs: dict[str, Any]


def resolve(name: str) -> RewardFn:
    if name in BUILTINS:
        return BUILTINS[name]
    if ":" not in name:
        package, dot, func = name.rpartition(".")
        hint = f"; write `{package}:{func}` (a colon before the function)" if dot and package and func else ""
        raise TrainerSetupError(
            f"rewards: {name!r} is neither a built-in ({', '.join(BUILTINS)}) nor `package.module:function`{hint}"
        )
    mod_name, _, attr = name.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise TrainerSetupError(
            f"rewards: cannot import module {mod_name!r} for {name!r} ({e}); make it importable (PYTHONPATH or pip install)"
        ) from e
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise TrainerSetupError(f"rewards: {mod_name} has no callable {attr!r}")
    return fn


def load_rewards(specs: Sequence[RewardSpec], device: Any = None) -> list[LoadedReward]:
    """The reward functions; reward models (`model:`) are loaded onto `device` (default: CPU)."""
    if not specs:
        raise TrainerSetupError("rewards: at least one reward function is needed")
    out: list[LoadedReward] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        fn: RewardFn
        if spec.model is not None:
            from launchgen.trainers.reward_model import ModelReward, metric_name

            fn = ModelReward(spec.model, device, spec.batch_size, f"rewards.{i}.model")
            base = spec.name or metric_name(spec.model)
        else:
            assert spec.name is not None  # RewardSpec's validator: a name or a model
            fn = resolve(spec.name)
            base = spec.name if spec.name in BUILTINS else getattr(fn, "__name__", spec.name.rpartition(":")[2])
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        out.append(LoadedReward(name=name, fn=fn, weight=spec.weight, kwargs=dict(spec.kwargs)))
    return out


def score(
    rewards: Sequence[LoadedReward],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: dict[str, Sequence[Any]],
) -> list[list[float]]:
    """(N, K) rewards as floats, NaN for None; a malformed return value is an error naming the function."""
    n = len(completions)
    table: list[list[float]] = [[math.nan] * len(rewards) for _ in range(n)]
    for k, r in enumerate(rewards):
        extra = {c: v for c, v in columns.items() if c not in ("prompts", "completions", "completion_ids")}
        vals = r.fn(prompts=list(prompts), completions=list(completions), completion_ids=[list(c) for c in completion_ids], **extra, **r.kwargs)
        if not isinstance(vals, (list, tuple)) or len(vals) != n:
            got = f"{type(vals).__name__} of length {len(vals)}" if isinstance(vals, (list, tuple)) else type(vals).__name__
            raise TypeError(f"reward {r.name!r} returned {got}; expected a list of {n} floats or None")
        for i, v in enumerate(vals):
            if v is None:
                continue
            try:
                table[i][k] = float(v)
            except (TypeError, ValueError) as e:
                raise TypeError(f"reward {r.name!r} returned {v!r} at index {i}; expected a float or None") from e
    return table
