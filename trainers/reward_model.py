"""A sequence-classification reward model as a reward function (`rewards: [{model: PATH}]`).

It scores each prompt + completion with the model's single output logit, as TRL's GRPOTrainer does with a
`PreTrainedModel` reward: conversational data goes through the reward tokenizer's chat template (prompt messages
plus the completion as an assistant turn), plain text is concatenated. Batches of `batch_size` are right-padded;
the model pools at the last non-pad token (`config.pad_token_id`, set from the tokenizer when missing). The model
lives on the trainer's device, frozen, in bf16 on CUDA (fp32 on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.errors import TrainerSetupError


def metric_name(path: str) -> str:
    """`rewards/<name>/mean`: the model folder's (or Hub repo's) last part."""
    return Path(path.rstrip("/")).name or "reward_model"


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        return str(x[-1].get("content", ""))
    return "" if x is None else str(x)


class ModelReward:
    def __init__(self, path: str, device: Any, batch_size: int, field: str) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = torch.device("cpu") if device is None else torch.device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainerSetupError(f"{field}: cannot load reward model {path!r}: {first}") from None
        if self.model.config.num_labels != 1:
            raise TrainerSetupError(
                f"{field}: reward model {path!r} has {self.model.config.num_labels} outputs; a reward model has one "
                "(num_labels: 1)"
            )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        self.model.to(self.device).eval().requires_grad_(False)
        self.batch_size = batch_size
        self.__name__ = metric_name(path)

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        out = []
        for p, c in zip(prompts, completions, strict=True):
            if isinstance(p, list) and getattr(self.tokenizer, "chat_template", None):
                msgs = [*p, {"role": "assistant", "content": _text(c)}]
                out.append(str(self.tokenizer.apply_chat_template(msgs, tokenize=False)))
            else:
                out.append(_text(p) + _text(c))
        return out

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        import torch

        texts = self.texts(prompts, completions)
        scores: list[float | None] = []
        with torch.no_grad():
            for s in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[s : s + self.batch_size], return_tensors="pt", padding=True,
                                     add_special_tokens=False).to(self.device)
                logits = self.model(**enc).logits[:, 0]
                scores.extend(float(v) for v in logits.float().tolist())
        return scores
