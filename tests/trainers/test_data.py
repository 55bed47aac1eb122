"""Prompt loading (jsonl/json/parquet), column mapping, chat templates and the resumable sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchgen.trainers.data import PromptSampler, build_prompt, load_rows, tokenize_prompt
from launchgen.trainers.declarations.config import DataSection
from launchgen.trainers.declarations.errors import TrainerSetupError

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


def _write(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"d.{kind}"
    if kind == "jsonl":
        p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    elif kind == "json":
        p.write_text(json.dumps({"data": ROWS}))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), p)
    return p


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
def test_local_formats_and_column_mapping(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path, kind)
    rows = load_rows(DataSection(path=str(path), column_mapping={"question": "prompt"}))
    assert rows == [{"prompt": r["question"], "answer": r["answer"]} for r in ROWS]


def test_columnar_json(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"prompt": ["a", "b"], "answer": ["1", "2"]}))
    assert load_rows(DataSection(path=str(p))) == [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]


def test_missing_prompt_column_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TrainerSetupError, match=r"data\.prompt_column 'prompt' not in the data"):
        load_rows(DataSection(path=str(_write(tmp_path, "jsonl"))))


def test_missing_file_and_bad_line(tmp_path: Path) -> None:
    with pytest.raises(TrainerSetupError, match="file not found"):
        load_rows(DataSection(path=str(tmp_path / "none.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(TrainerSetupError, match="line 2"):
        load_rows(DataSection(path=str(bad)))


def test_chat_template_text_messages_and_system(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = build_prompt("hi", tok, "be brief")
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert build_prompt(msgs, tok, None).count("<|im_start|>") == 4
    ids = tokenize_prompt(text, tok, max_prompt_length=3)
    assert ids == tok(text, add_special_tokens=False)["input_ids"][-3:]
    tok.chat_template = None
    assert build_prompt("hi", tok, "sys") == "sys\n\nhi"
    with pytest.raises(TrainerSetupError, match="no chat template"):
        build_prompt(msgs, tok, None)


def test_sampler_is_seeded_resumable_and_covers_each_epoch() -> None:
    a = PromptSampler(5, seed=3)
    first = a.take(3) + a.take(4)  # crosses into epoch 1
    assert sorted(first[:5]) == list(range(5))
    state = a.state_dict()
    rest = a.take(6)
    b = PromptSampler(5, seed=3)
    b.load_state_dict(state)
    assert b.take(6) == rest
    assert PromptSampler(50, seed=4).take(50) != PromptSampler(50, seed=3).take(50)
    assert PromptSampler(5, seed=3, shuffle=False).take(7) == [0, 1, 2, 3, 4, 0, 1]
    with pytest.raises(TrainerSetupError, match="prompts"):
        PromptSampler(6, seed=3).load_state_dict(state)


def test_hub_dataset_with_split_config_and_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    calls: dict[str, object] = {}

    def fake_load(path: str, name: str | None = None, split: str | None = None):
        calls.update(path=path, name=name, split=split)
        return datasets.Dataset.from_list([{"problem": "1+1", "solution": "2"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    rows = load_rows(DataSection(path="org/math", split="test", config_name="main", column_mapping={"problem": "prompt"}))
    assert calls == {"path": "org/math", "name": "main", "split": "test"}
    assert rows == [{"prompt": "1+1", "solution": "2"}]
