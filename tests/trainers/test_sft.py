"""SFT: tokenization and loss masks (exact), the loss against the model's own, and CPU runs on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import accelerate  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
import pytest
import torch
from tools import tool


def _cfg(tmp_path: Path, model: Path, data: Path, out: str, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "trainer": "sft",
        "output_dir": str(tmp_path / out),
        "precision": "fp32",
        "model": {"name_or_path": str(model)},
        "data": {"path": str(data)},
        "per_device_train_batch_size": 4,
        "learning_rate": 0.01,
        "lr_scheduler_type": "constant",
        "max_steps": 10,
        "save_steps": 0,
        "report_to": ["jsonl"],
        "save_final_model": False,
    }
    cfg.update(over)
    return cfg


def _tc(**over: Any) -> Any:
    from launchgen.trainers.declarations.config import TrainerConfig

    d: dict[str, Any] = {"trainer": "sft", "output_dir": "o", "model": {"name_or_path": "m"}, "data": {"path": "d"}}
    d.update(over)
    return TrainerConfig.model_validate(d)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _trained_text(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    """Decoded runs of consecutive trained tokens."""
    runs: list[list[int]] = []
    prev = 0
    for t, m in zip(ids, mask, strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(t)
        prev = m
    return [tok.decode(r) for r in runs]


def test_messages_train_on_assistant_turns_only(tok: Any) -> None:
    from launchgen.trainers.supervised import tokenize_example

    msgs = [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "one two"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "three four five"},
    ]
    ids, mask = tokenize_example({"messages": msgs}, "messages", tok, _tc())
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert ids == tok(full, add_special_tokens=False)["input_ids"]
    # exactly each assistant turn, with its end-of-turn token (what the model must learn to emit), nothing else
    assert _trained_text(tok, ids, mask) == ["one two<|im_end|>\n", "three four five<|im_end|>\n"]
    # the system prompt is added to the chat, not trained on
    ids_s, mask_s = tokenize_example({"messages": msgs}, "messages", tok, _tc(data={"path": "d", "system_prompt": "be brief"}))
    assert "be brief" in tok.decode(ids_s) and _trained_text(tok, ids_s, mask_s) == _trained_text(tok, ids, mask)
    ids_all, mask_all = tokenize_example({"messages": msgs}, "messages", tok, _tc(completion_only_loss=False))
    assert ids_all == ids and set(mask_all) == {1}
    short, short_mask = tokenize_example({"messages": msgs}, "messages", tok, _tc(max_length=7))
    assert short == ids[:7] and short_mask == mask[:7]


def test_template_that_rewrites_earlier_turns_falls_back_to_content_search(tok: Any) -> None:
    """A template that renders old assistant turns differently (as reasoning templates do) is not prefix-stable."""
    from launchgen.trainers.supervised import assistant_spans

    tpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}[old] "
           "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"},
            {"role": "user", "content": "d"}, {"role": "assistant", "content": "e f"}]
    orig = tok.chat_template
    tok.chat_template = tpl
    try:
        full = tok.apply_chat_template(msgs, tokenize=False)
        spans = assistant_spans(tok, msgs, full)
    finally:
        tok.chat_template = orig
    assert [full[a:b] for a, b in spans] == ["b c<|im_end|>", "e f<|im_end|>"]


def test_prompt_completion_and_text_formats(tok: Any) -> None:
    from launchgen.trainers.supervised import detect_format, tokenize_example

    row = {"prompt": "The sky is", "completion": " blue"}
    assert detect_format(row, "prompt") == "prompt_completion"
    ids, mask = tokenize_example(row, "prompt_completion", tok, _tc())
    p = tok("The sky is")["input_ids"]
    c = tok(" blue", add_special_tokens=False)["input_ids"]
    assert ids == p + c + [tok.eos_token_id]
    assert mask == [0] * len(p) + [1] * (len(c) + 1)
    _, mask_all = tokenize_example(row, "prompt_completion", tok, _tc(completion_only_loss=False))
    assert set(mask_all) == {1}

    conv = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "ans"}]}
    ids, mask = tokenize_example(conv, "prompt_completion", tok, _tc())
    assert _trained_text(tok, ids, mask) == ["ans<|im_end|>\n"]

    text = {"text": "hello world"}
    assert detect_format(text, "prompt") == "text"
    ids, mask = tokenize_example(text, "text", tok, _tc())
    assert ids[-1] == tok.eos_token_id and set(mask) == {1}

    from launchgen.trainers.declarations.errors import TrainerSetupError

    with pytest.raises(TrainerSetupError, match="column_mapping"):
        detect_format({"question": "x"}, "prompt")


def test_loss_equals_the_models_own_cross_entropy(tiny_model_dir: Path, tok: Any) -> None:
    from launchgen.trainers import modeling
    from launchgen.trainers.supervised import sequence_nll, tokenize_example
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    modeling.install_logp_head(model)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a b c d"}]},
            {"messages": [{"role": "user", "content": "longer question here"}, {"role": "assistant", "content": "x"}]}]
    exs = [tokenize_example(r, "messages", tok, _tc()) for r in rows]
    width = max(len(e[0]) for e in exs)
    ids = torch.tensor([e[0] + [tok.pad_token_id] * (width - len(e[0])) for e in exs])
    attn = torch.tensor([[1] * len(e[0]) + [0] * (width - len(e[0])) for e in exs])
    lmask = torch.tensor([e[1] + [0] * (width - len(e[1])) for e in exs])
    nll, _ = sequence_nll(model, ids, attn, lmask)
    labels = ids.masked_fill(lmask == 0, -100)
    ref = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    n = int(lmask[:, 1:].sum())
    assert (nll / n).item() == pytest.approx(ref.item(), abs=1e-5)


def _chat_data(tmp_path: Path) -> Path:
    p = tmp_path / "sft.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"count {i}"},
                          {"role": "assistant", "content": "one two three four five"}]} for i in range(8)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _run(cfg: dict[str, Any]) -> int:
    from launchgen.trainers.core import run
    from launchgen.trainers.declarations.config import TrainerConfig

    return run(TrainerConfig.model_validate(cfg))


def test_learns_a_repeated_answer(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert _run(_cfg(tmp_path, tiny_model_dir, _chat_data(tmp_path), "learn", max_steps=12)) == 0
    ms = _metrics(tmp_path / "learn")
    losses = [m["loss"] for m in ms]
    assert len(losses) == 12
    assert losses[0] > 5.0  # ~log(vocab) for a random-init model
    assert losses[-1] < 0.5 * losses[0], losses
    assert ms[-1]["num_tokens"] == 12 * ms[0]["num_tokens"] and ms[-1]["epoch"] == 6.0
    assert json.loads((tmp_path / "learn" / "launchgen-complete.json").read_text())["trainer"] == "sft"


def test_signal_checkpoint_and_bit_identical_resume(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from launchgen.trainers.core import Trainer

    data = _chat_data(tmp_path)
    common = dict(max_steps=4, gradient_accumulation_steps=2, per_device_train_batch_size=2,
                  lr_scheduler_type="linear", warmup_steps=1)
    assert _run(_cfg(tmp_path, tiny_model_dir, data, "a", **common)) == 0
    full = _metrics(tmp_path / "a")

    orig = Trainer.generate_batch
    calls = {"n": 0}

    def signalling(self: Trainer) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # USR2 arrives during step 2; honoured after it
            os.kill(os.getpid(), signal.SIGUSR2)
        return orig(self)

    monkeypatch.setattr(Trainer, "generate_batch", signalling)
    assert _run(_cfg(tmp_path, tiny_model_dir, data, "b", **common)) == 75
    assert (tmp_path / "b" / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (tmp_path / "b" / "launchgen-complete.json").exists()
    monkeypatch.setattr(Trainer, "generate_batch", orig)
    assert _run(_cfg(tmp_path, tiny_model_dir, data, "b", **common)) == 0
    resumed = _metrics(tmp_path / "b")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed, strict=True):
        assert (a["loss"], a["grad_norm"], a["num_tokens"], a["learning_rate"]) == (
            b["loss"], b["grad_norm"], b["num_tokens"], b["learning_rate"])


def test_cli_two_steps_and_config_errors(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml
    from launchgen.trainers.sft import main

    data = tmp_path / "pc.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Q{i}:", "completion": " yes"}) for i in range(6)) + "\n")
    cfg = _cfg(tmp_path, tiny_model_dir, data, "cli", max_steps=2, save_final_model=True)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "launchgen.trainers.sft", "--config", str(path),
         "--set", f"output_dir='{tmp_path / 'cli2'}'"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "cli2"
    assert [m["step"] for m in _metrics(out)] == [1, 2]
    assert (out / "final" / "model.safetensors").is_file()
    assert json.loads((out / "launchgen-complete.json").read_text())["global_step"] == 2

    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text(json.dumps({"question": "x"}) + "\n")
    for bad, needle in (
        (dict(cfg, data={"path": str(tmp_path / "missing.jsonl")}), "file not found"),
        (dict(cfg, data={"path": str(bad_rows)}), "`messages` column"),
        (dict(cfg, num_iterations=2), "leave them unset for sft"),
        (dict(cfg, generation={"backend": "vllm_server"}), "generation.backend must stay"),
    ):
        path.write_text(yaml.safe_dump(bad))
        assert main(["--config", str(path)]) == 2
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and needle in lines[0], err


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sft", "online_dpo"])
def test_accelerate_launch_two_processes(tmp_path: Path, tiny_model_dir: Path, trainer: str) -> None:
    """Two CPU (gloo) processes: the token-normalised SFT loss and the pair-aligned DPO batches under DDP."""
    import yaml
    here = Path(__file__).parent
    if trainer == "sft":
        data = tmp_path / "varied.jsonl"  # unequal trained-token counts: a per-rank mean would differ from the global one
        data.write_text("\n".join(json.dumps({"prompt": f"Q{i}:", "completion": " yes" * (1 + 3 * i)}) for i in range(8)))
        cfg = _cfg(tmp_path, tiny_model_dir, data, "ddp", max_steps=2, per_device_train_batch_size=2,
                   gradient_accumulation_steps=2, save_steps=1)
    else:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("\n".join(json.dumps({"prompt": f"Say {i}"}) for i in range(8)) + "\n")
        cfg = _cfg(tmp_path, tiny_model_dir, prompts, "ddp", trainer="online_dpo", max_steps=2,
                   per_device_train_batch_size=4, save_steps=1, rewards=[{"name": "toy_rewards:target_fraction"}],
                   generation={"max_completion_length": 4})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [tool("accelerate"), "launch", "--num_processes", "2", "--num_machines", "1", "--multi_gpu", "--mixed_precision", "no",
         "--dynamo_backend", "no", "-m", f"launchgen.trainers.{trainer}", "--config", str(path)],
        env=env, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ms = _metrics(tmp_path / "ddp")
    assert [m["step"] for m in ms] == [1, 2]
    ck = tmp_path / "ddp" / "checkpoint-2"
    assert (ck / "random_states_0.pkl").is_file() and (ck / "random_states_1.pkl").is_file()
    if trainer == "sft":
        # the same 8 examples per step in one process: the loss is the token mean over all of them either way
        single = dict(cfg, output_dir=str(tmp_path / "single"), per_device_train_batch_size=4)
        assert _run(single) == 0
        for a, b in zip(ms, _metrics(tmp_path / "single"), strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
            assert a["num_tokens"] == b["num_tokens"]
