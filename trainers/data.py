"""Prompt data: local files (read by `datafiles`: .jsonl/.json/.parquet, a save_to_disk folder) or a Hub data set,
chat templates, seeded resumable order.

The prompt column holds either text or a list of chat messages. With a chat template, text becomes one user
message (after `system_prompt`, when set) and message lists are used as they are; the template is applied with
`add_generation_prompt=True`. Without a template, text is used as is (the system prompt, if any, is prepended
with a blank line) and message lists are an error.

`PromptSampler` draws prompt indices in a seeded permutation per epoch; its state (epoch, index) is part of every
checkpoint, so a resumed run continues with exactly the prompts the interrupted run would have used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from launchgen.trainers.declarations.config import DataSection
from launchgen.trainers.declarations.datafiles import LOCAL_SUFFIXES, local_path, mapped, read_local
from launchgen.trainers.declarations.errors import TrainerSetupError


def load_rows(data: DataSection) -> list[dict[str, Any]]:
    """All rows, after `column_mapping`; the prompt column must exist."""
    rows = read_rows(data)
    if data.prompt_column not in rows[0]:
        raise TrainerSetupError(
            f"data.prompt_column {data.prompt_column!r} not in the data (columns: {', '.join(sorted(rows[0]))}); "
            "set data.prompt_column or data.column_mapping"
        )
    return rows


def read_rows(data: DataSection) -> list[dict[str, Any]]:
    """All rows, after `column_mapping`, at least one; which columns are needed is the caller's business."""
    path = local_path(data.path)
    if path is None:
        rows = _load_hub(data)
    elif not path.exists():
        raise TrainerSetupError(f"data.path {data.path}: file not found")
    else:
        rows = read_local(path, data.split)
    rows = [mapped(r, data) for r in rows]
    if not rows:
        raise TrainerSetupError(f"data.path {data.path}: no rows")
    return rows


def _load_hub(data: DataSection) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as e:
        raise TrainerSetupError(
            f"data.path {data.path!r} is not a local file; loading a Hub data set needs `datasets`: "
            f"pip install 'launchgen[data]' (or point data.path at a {'/'.join(LOCAL_SUFFIXES)} file)"
        ) from e
    try:
        ds = datasets.load_dataset(data.path, name=data.config_name, split=data.split)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerSetupError(
            f"data.path {data.path!r} (split {data.split!r}, config_name {data.config_name!r}) could not be loaded: "
            f"{first}; on offline nodes pre-download it into the shared HF cache"
        ) from e
    return [dict(r) for r in ds]


def is_conversational(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def build_prompt(prompt: Any, tokenizer: Any, system_prompt: str | None) -> str:
    """Prompt text as the model sees it (chat template applied when the tokenizer has one)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if is_conversational(prompt):
        if not has_template:
            raise TrainerSetupError(
                "data: the prompts are chat messages but the tokenizer has no chat template; use text prompts "
                "or a model with a chat template"
            )
        messages = list(prompt)
        if system_prompt and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    if not isinstance(prompt, str):
        raise TrainerSetupError(f"data: a prompt must be text or a list of messages, got {type(prompt).__name__}")
    if has_template:
        messages = [{"role": "user", "content": prompt}]
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}, *messages]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return f"{system_prompt}\n\n{prompt}" if system_prompt else prompt


def tokenize_prompt(text: str, tokenizer: Any, max_prompt_length: int | None) -> list[int]:
    # Chat templates already carry the special tokens they need; adding BOS again would double it.
    ids = tokenizer(text, add_special_tokens=getattr(tokenizer, "chat_template", None) is None)["input_ids"]
    if max_prompt_length is not None and len(ids) > max_prompt_length:
        ids = ids[-max_prompt_length:]  # keep the end, next to where the completion starts
    return list(ids)


@dataclass
class PromptSampler:
    """Seeded order over `n` rows; `(epoch, index)` is the resumable position."""

    n: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    index: int = 0

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        order = self._order(self.epoch)
        while len(out) < k:
            if self.index >= self.n:
                self.epoch += 1
                self.index = 0
                order = self._order(self.epoch)
            take = min(k - len(out), self.n - self.index)
            out.extend(order[self.index : self.index + take])
            self.index += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("n") != self.n:
            raise TrainerSetupError(
                f"resume: the checkpoint was taken over {state.get('n')} prompts, the data now has {self.n}; "
                "resume with the same data, or set resume: never with a fresh output_dir"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def pad_rows(
    rows: Sequence[Sequence[float]], value: float, left: bool, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """Ragged rows as one (len(rows), longest) tensor padded with `value` on the left or the right."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            t = torch.tensor(r, dtype=dtype)
            if left:
                out[i, width - len(r) :] = t
            else:
                out[i, : len(r)] = t
    return out
