"""Supervised fine-tuning (`trainer: sft`): its data, tokenization, loss masks and batch source.

The loop is the shared one (`core.Trainer`) with `objectives.sft.SFTObjective`: what differs from the online
trainers is only the batch source (`ExampleSource`: the next `gradient_accumulation_steps` micro-batches of
examples instead of a rollout), no reference model, no generation backend and the loss. Precision, attention/Hub kernels,
Liger patching, accelerate/DDP/FSDP/DeepSpeed, checkpoints (atomic, pruned, bit-identical resume), USR2/TERM ->
checkpoint + exit 75, metrics.jsonl/TensorBoard, the progress bar, `final/` and `launchgen-complete.json` are the
core's.

Data (local .jsonl/.json/.parquet, or a Hub data set with `datasets`), one of three row formats, detected from the
first row (rename columns with `data.column_mapping`):

* `messages`: a chat (list of `{role, content}`), rendered with the tokenizer's chat template (`data.system_prompt`
  is prepended when the chat has no system message). With `completion_only_loss` (default) only the assistant
  turns are trained on: the character span of each assistant turn is where the rendered chat grows when that turn
  is appended (template(messages[:i], add_generation_prompt) -> template(messages[:i+1])), which includes the
  turn's end-of-turn token. Templates that re-render earlier turns differently (e.g. dropping reasoning of old
  turns) fall back to locating each assistant message's content in the rendered chat.
* `prompt` (`data.prompt_column`) + `completion`: text, or chat messages (then rendered as above); loss on the
  completion only with `completion_only_loss`. Text completions get the EOS token appended (as TRL).
* `text`: plain language modelling on every token (EOS appended).

Examples are truncated to `max_length` tokens (the end is cut). The loss is the token-level cross entropy summed
over the trained tokens of the optimizer step on all processes and divided by their number (TRL/transformers'
`num_items_in_batch` normalisation), so gradient accumulation and DDP give the same loss as one big batch. It is
computed through the fused, chunked log-prob head of `modeling` (fp32 log-softmax, logits never held whole; equal
to the model's own `labels=` loss, tested) or, with `use_liger_kernel`, Liger's fused linear cross entropy.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from launchgen.trainers.data import PromptSampler, is_conversational, pad_rows, read_rows
from launchgen.trainers.declarations.config import TrainerConfig
from launchgen.trainers.declarations.datafiles import detect_sft_format as detect_format
from launchgen.trainers.declarations.errors import TrainerSetupError
from launchgen.trainers.passes import RowLayout

if TYPE_CHECKING:
    from launchgen.trainers.objectives.base import Geometry

FORMATS = ("messages", "prompt_completion", "text")
IGNORE_INDEX = -100


def _messages(value: Any, what: str) -> list[dict[str, Any]]:
    if not is_conversational(value):
        raise TrainerSetupError(f"data: {what} must be a list of {{role, content}} messages, got {type(value).__name__}")
    return list(value)


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
    if not messages:
        return ""
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt))


def assistant_spans(tokenizer: Any, messages: list[dict[str, Any]], full: str) -> list[tuple[int, int]]:
    """Character spans of `full` (the rendered chat) that belong to assistant turns (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    prefix_ok = True
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1])
        if not (full.startswith(upto) and upto.startswith(before)):
            prefix_ok = False
            break
        spans.append((len(before), len(upto)))
    if prefix_ok:
        return spans
    # The template renders a chat's prefix differently from the chat's start: find each assistant content in order.
    spans, cursor = [], 0
    eos = getattr(tokenizer, "eos_token", None) or ""
    for msg in messages:
        if msg.get("role") != "assistant":
            continue
        content = str(msg.get("content") or "")
        at = full.find(content, cursor) if content else -1
        if at < 0:
            raise TrainerSetupError(
                "data: cannot locate an assistant turn in the chat template's output (the template rewrites it); "
                "set completion_only_loss: false to train on every token"
            )
        end = at + len(content)
        if eos and full.startswith(eos, end):
            end += len(eos)  # the model must learn to end its turn
        spans.append((at, end))
        cursor = end
    return spans


def _tokenize_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]] | None) -> tuple[list[int], list[int]]:
    """Token ids of `text` (its template already has the special tokens) and a 0/1 mask of tokens overlapping `spans`
    (every token when `spans` is None)."""
    if spans is None:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids, [1] * len(ids)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as e:
        raise TrainerSetupError(
            "completion_only_loss with chat data needs a fast tokenizer (character offsets); this model's tokenizer "
            "is a slow one: set completion_only_loss: false"
        ) from e
    ids = list(enc["input_ids"])
    mask = [int(any(max(s, a) < min(e, b) for a, b in spans)) for s, e in enc["offset_mapping"]]
    return ids, mask


def tokenize_example(
    row: dict[str, Any], fmt: str, tokenizer: Any, cfg: TrainerConfig
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one row, truncated to `max_length`; loss_mask[t] = 1 where token t is a target."""
    only = cfg.completion_only_loss
    has_template = getattr(tokenizer, "chat_template", None) is not None
    eos = tokenizer.eos_token_id

    def chat(messages: list[dict[str, Any]], completion_from: int | None) -> tuple[list[int], list[int]]:
        if not has_template:
            raise TrainerSetupError("data: the rows are chat messages but the tokenizer has no chat template")
        system = cfg.data.system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}, *messages]
            completion_from = None if completion_from is None else completion_from + 1
        full = _render(tokenizer, messages)
        if not only:
            return _tokenize_spans(tokenizer, full, None)
        if completion_from is None:
            return _tokenize_spans(tokenizer, full, assistant_spans(tokenizer, messages, full))
        before = _render(tokenizer, messages[:completion_from], generation_prompt=True)
        if not full.startswith(before):
            raise TrainerSetupError(
                "data: the chat template renders the prompt differently inside the full chat, so the completion "
                "cannot be located; set completion_only_loss: false"
            )
        return _tokenize_spans(tokenizer, full, [(len(before), len(full))])

    if fmt == "messages":
        ids, mask = chat(_messages(row["messages"], "`messages`"), None)
    elif fmt == "prompt_completion":
        prompt, completion = row[cfg.data.prompt_column], row["completion"]
        if is_conversational(prompt):
            comp = completion if is_conversational(completion) else [{"role": "assistant", "content": str(completion)}]
            msgs = _messages(prompt, "the prompt")
            ids, mask = chat([*msgs, *comp], len(msgs))
        else:
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise TrainerSetupError("data: `prompt` and `completion` must both be text, or chat messages")
            p_ids = list(tokenizer(prompt)["input_ids"])
            c_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
            if eos is not None and (not c_ids or c_ids[-1] != eos):
                c_ids.append(eos)
            ids = p_ids + c_ids
            mask = [0 if only else 1] * len(p_ids) + [1] * len(c_ids)
    elif fmt == "text":
        text = row["text"]
        if not isinstance(text, str):
            raise TrainerSetupError(f"data: `text` must be a string, got {type(text).__name__}")
        ids = list(tokenizer(text)["input_ids"])
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        mask = [1] * len(ids)
    else:
        raise ValueError(f"unknown sft format {fmt!r} (one of {FORMATS})")
    if cfg.max_length is not None:
        ids, mask = ids[: cfg.max_length], mask[: cfg.max_length]
    return ids, mask


def make_liger_ce_loss() -> Any:
    """Liger's fused linear cross entropy (sum over targets != -100), called by the log-prob head's liger mode."""
    from launchgen.trainers.modeling import _import_liger

    _import_liger()
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    flce = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")

    def loss_fn(
        hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return flce(weight, hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1), bias), []

    return loss_fn


def sequence_nll(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
    liger_loss: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed negative log-likelihood of the tokens where `loss_mask` is 1 (token 0 is never a target), and the
    (B, T-1) per-token entropies (None with Liger)."""
    from launchgen.trainers.modeling import get_logp_head

    head = get_logp_head(model)
    targets = input_ids[:, 1:]
    m = loss_mask[:, 1:].bool()
    width = input_ids.size(1)
    if liger_loss is not None:
        with head.liger_mode(targets.masked_fill(~m, IGNORE_INDEX), liger_loss):
            out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width, use_cache=False)
        return out.logits, None
    with head.logp_mode(targets, 1.0) as st:
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width, use_cache=False)
        entropy = st.entropy
    return -(out.logits * m.to(out.logits.dtype)).sum(), entropy


#: Examples are right-padded: a pass keeps the columns up to its longest example.
SFT_LAYOUT = RowLayout(ids_key="input_ids", mask_key="attention_mask",
                       trim_keys=("input_ids", "attention_mask", "loss_mask"))


class ExampleSource:
    """SFT's batch source: the next optimizer step's `gradient_accumulation_steps` micro-batches of examples."""

    layout = SFT_LAYOUT
    progress_keys = ("loss",)
    backend = None  # sft does not generate
    needs_weight_sync = False

    def __init__(self, cfg: TrainerConfig, accelerator: Any, geometry: Geometry) -> None:
        self.cfg, self.accelerator, self.geometry = cfg, accelerator, geometry
        self.rows_per_batch = geometry.global_gen  # examples one "generation batch" draws
        self.rows = read_rows(cfg.data)
        self.format = detect_format(self.rows[0], cfg.data.prompt_column)
        self.sampler = PromptSampler(len(self.rows), cfg.seed, cfg.data.shuffle)
        self._examples: dict[int, tuple[list[int], list[int]]] = {}
        self.num_tokens = 0.0

    def after_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._example(0)  # a malformed first row or an unusable template fails before the model loads

    def start(self, model: Any, ref_model: Any, compiled_layers: bool) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "num_tokens": self.num_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.num_tokens = float(state.get("num_tokens", 0.0))

    def weight_push(self, version: int) -> AbstractContextManager[None]:
        return nullcontext()  # needs_weight_sync is False: never called

    def close(self) -> None:
        return None

    def _example(self, idx: int) -> tuple[list[int], list[int]]:
        ex = self._examples.get(idx)
        if ex is None:
            try:
                ex = tokenize_example(self.rows[idx], self.format, self.tokenizer, self.cfg)
            except KeyError as e:
                raise TrainerSetupError(f"data: row {idx} has no {e.args[0]!r} column (row 0 has it)") from e
            if len(ex[0]) < 2:
                raise TrainerSetupError(f"data: row {idx} tokenizes to fewer than 2 tokens")
            self._examples[idx] = ex
        return ex

    def next_batches(self) -> tuple[list[dict[str, Any]], dict[str, float]]:
        acc, g = self.accelerator, self.geometry
        dev = acc.device
        idx = self.sampler.take(g.global_gen)  # identical on every rank
        local = idx[acc.process_index * g.local_gen : (acc.process_index + 1) * g.local_gen]
        pad = self.tokenizer.pad_token_id
        batches: list[dict[str, Any]] = []
        for s in range(g.spg):
            exs = [self._example(i) for i in local[s * g.B : (s + 1) * g.B]]
            batches.append({
                "input_ids": pad_rows([e[0] for e in exs], pad, left=False).to(dev),
                "attention_mask": pad_rows([[1] * len(e[0]) for e in exs], 0, left=False).to(dev),
                "loss_mask": pad_rows([e[1] for e in exs], 0, left=False).to(dev),
            })
        counts = torch.tensor(
            [sum(float(b["loss_mask"][:, 1:].sum()) for b in batches), sum(float(b["attention_mask"].sum()) for b in batches)],
            dtype=torch.float64, device=dev,
        )
        if acc.num_processes > 1:
            counts = acc.reduce(counts, reduction="sum")
        n_items = counts[0].clamp(min=1.0)
        for b in batches:
            b["num_items_in_batch"] = n_items
        self.num_tokens += float(counts[1].item())
        return batches, {"num_tokens": self.num_tokens}
