"""`launchgen check` on `train.args.peft` (LG340-LG346): names against the model's config.json, the settings LoRA
cannot run with, the saved adapter path. Each case runs the real CLI in a temporary submit directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_preflight import check, failed, lines, spec
from tools import unwrapped


def _model(tmp: Path, model_type: str = "qwen2", layers: int = 2) -> str:
    d = tmp / f"m-{model_type}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "num_hidden_layers": layers,
                                               "num_attention_heads": 4, "num_key_value_heads": 2}))
    return str(d)


def peft(**fields: object) -> str:
    return "    peft:\n" + "".join(f"      {k}: {json.dumps(v)}\n" for k, v in fields.items())


@pytest.fixture
def submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    return tmp_path


def test_good_lora_spec_passes_and_renders(submit: Path) -> None:
    m = _model(submit)
    for fields in ({}, {"target_modules": ["q_proj", "self_attn.v_proj", "layers.1.mlp.down_proj"], "r": 8},
                   {"modules_to_save": ["embed_tokens"], "target_modules": "all-linear"}):
        r = check(spec(model=m, extra=peft(**fields)))
        assert r.exit_code == 0, r.stderr
        assert " error " not in unwrapped(r.stderr) and " warning " not in unwrapped(r.stderr) and "LG34" not in unwrapped(r.stderr), r.stderr


def test_target_entry_matching_nothing_is_lg340_on_its_line(submit: Path) -> None:
    m = _model(submit)
    out = failed(check(spec(model=m, extra=peft(target_modules=["q_proj", "attn.c_attn"]))), "LG340",
                 "train.args.peft.target_modules.1")
    assert "'attn.c_attn'" in out and "q_proj" in out, out
    # a layer index past num_hidden_layers (2) matches nothing either
    failed(check(spec(model=m, extra=peft(target_modules=["layers.2.mlp.up_proj"]))), "LG340",
           "train.args.peft.target_modules.0")


def test_modules_to_save_matching_nothing_is_lg341(submit: Path) -> None:
    out = failed(check(spec(model=_model(submit), extra=peft(modules_to_save=["wte"]))), "LG341",
                 "train.args.peft.modules_to_save.0")
    assert "'wte'" in out


@pytest.mark.parametrize("where", ["hub", "unknown_type"])
def test_names_not_checkable_is_lg342_info(submit: Path, where: str) -> None:
    m = "org/model" if where == "hub" else _model(submit, "gpt_neox")
    r = check(spec(model=m, extra=peft(target_modules=["query_key_value"])))
    assert r.exit_code == 0, r.stderr
    found = lines(r, "LG342")
    assert len(found) == 1 and " info LG342 " in found[0] and "[train.args.peft]" in found[0], r.stderr
    assert ("not local" if where == "hub" else "'gpt_neox'") in found[0]
    # all-linear needs no names: nothing to say
    assert not lines(check(spec(model=m, extra=peft())), "LG342")


def test_missing_adapter_path_is_lg346(submit: Path) -> None:
    m = _model(submit)
    out = failed(check(spec(model=m, extra=peft(adapter_path="runs/a/final"))), "LG346",
                 "train.args.peft.adapter_path")
    assert "does not exist" in out
    (submit / "empty").mkdir()
    assert "without adapter_config.json" in failed(check(spec(model=m, extra=peft(adapter_path="empty"))), "LG346",
                                                   "train.args.peft.adapter_path")
    (submit / "ok").mkdir()
    (submit / "ok" / "adapter_config.json").write_text("{}")
    assert check(spec(model=m, extra=peft(adapter_path="ok"))).exit_code == 0


def test_invalid_peft_section_is_one_lg901_error(submit: Path) -> None:
    r = check(spec(model=_model(submit), extra=peft(r=0)))
    assert r.exit_code == 2 and "Traceback" not in unwrapped(r.output)
    assert "LG901" in unwrapped(r.stderr) and "peft.r" in unwrapped(r.stderr), r.stderr
