"""`launchgen check` reads what the spec names on disk: rewards' modules, data files and folders, the model path,
and (with --live) the files slurm.setup sources. Each bad spec exits 2 with its code, field, line and fix.

Every case runs the real CLI in a temporary submit directory (relative paths resolve from there, as in the job).
Data sets are real files: parquet through pyarrow, `save_to_disk` folders written by `datasets` itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tools import unwrapped

from launchgen.cli import main

SPEC = """\
job:
  name: demo
model:
  name_or_path: {model}
train:
  device: cpu
  precision: fp32
  trainer: {trainer}
  args:
    data:
      path: {data}
{extra}"""

ROWS = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}]


def spec(model: str = "org/model", trainer: str = "grpo", data: str = "train.jsonl", extra: str = "") -> str:
    return SPEC.format(model=model, trainer=trainer, data=data, extra=extra)


def rewards(*names: str) -> str:
    return "    rewards:\n" + "".join(f"      - name: {json.dumps(n)}\n" for n in names)


@pytest.fixture
def submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A submit directory with a good JSONL data file; the current directory, as when the job runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def check(text: str, *args: str, env: dict[str, str] | None = None) -> Result:
    Path("spec.yaml").write_text(text)
    return CliRunner().invoke(main, ["check", "spec.yaml", *args],
                              env={"HF_HOME": "/nonexistent-hf-home", "PYTHONPATH": "", **(env or {})})


def lines(r: Result, code: str) -> list[str]:
    """The issues of `code`, each on one line (as printed, wrapped at 80 columns in a pipe)."""
    return [ln for ln in unwrapped(r.stderr).splitlines() if f" {code} " in ln]


def failed(r: Result, code: str, field: str, line: int | None = None) -> str:
    """The one issue line of `code`, after asserting exit 2, no traceback, the field and the line."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in unwrapped(r.output) and "internal error" not in unwrapped(r.output)
    found = lines(r, code)
    assert len(found) == 1, r.stderr
    assert f"[{field}]" in found[0], found[0]
    if line is not None:
        assert found[0].startswith(f"spec.yaml:{line}: error {code} "), found[0]
    assert " Fix: " in found[0]
    return found[0]


def test_good_spec_passes(submit: Path) -> None:
    r = check(spec())
    assert r.exit_code == 0, r.stderr
    assert " error " not in unwrapped(r.stderr) and " warning " not in unwrapped(r.stderr)


# ------------------------------------------------------------------------------------------------ rewards


def test_misspelt_builtin_reward(submit: Path) -> None:
    out = failed(check(spec(extra=rewards("acuracy"))), "LG320", "train.args.rewards.0.name", 13)
    assert "did you mean the built-in `accuracy`" in out
    assert "`format`" in failed(check(spec(extra=rewards("format_reward"))), "LG320", "train.args.rewards.0.name")
    out = failed(check(spec(extra=rewards("zzz"))), "LG320", "train.args.rewards.0.name")
    assert "module:function" in out
    failed(check(spec(extra=rewards("mod:"))), "LG320", "train.args.rewards.0.name")
    assert "my_rewards.py" in failed(check(spec(extra=rewards("my-rewards:f"))), "LG320", "train.args.rewards.0.name")


def test_trl_style_dotted_reward(submit: Path) -> None:
    (submit / "my_rewards.py").write_text("def brevity(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    out = failed(check(spec(extra=rewards("accuracy", "my_rewards.brevity"))), "LG321", "train.args.rewards.1.name", 14)
    assert "write `my_rewards:brevity`" in out
    r = check(spec(extra=rewards("accuracy", "my_rewards:brevity")))
    assert r.exit_code == 0, r.stderr


def test_reward_module_is_found_without_importing_it(submit: Path) -> None:
    """A module that imports torch (and, here, leaves a mark when imported) is located and parsed, never run."""
    pkg = submit / "lab" / "rl"
    pkg.mkdir(parents=True)
    for d in (submit / "lab", pkg):
        (d / "__init__.py").write_text("import pathlib\npathlib.Path('IMPORTED').write_text('x')\nimport torch\n")
    (pkg / "scores.py").write_text("import torch\n\ndef brevity(prompts, completions, **kw):\n    return []\n\n"
                                   "if True:\n    def _helper():\n        pass\n")
    r = check(spec(extra=rewards("lab.rl.scores:brevity")))
    assert r.exit_code == 0, r.stderr
    assert not (submit / "IMPORTED").exists()
    out = failed(check(spec(extra=rewards("lab.rl.scores:brevty"))), "LG323", "train.args.rewards.0.name", 13)
    assert "did you mean `lab.rl.scores:brevity`" in out
    (pkg / "broken.py").write_text("def f(:\n")
    out = failed(check(spec(extra=rewards("lab.rl.broken:f"))), "LG323", "train.args.rewards.0.name")
    assert "broken.py:1" in out and "syntax error" in out
    assert not (submit / "IMPORTED").exists()


def test_reward_module_missing(submit: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    failed(check(spec(extra=rewards("nowhere:f"))), "LG322", "train.args.rewards.0.name", 13)
    # found through slurm.env.trainer.PYTHONPATH, as the trainer would
    lib = tmp_path_factory.mktemp("lib")
    (lib / "nowhere.py").write_text("def f(**kw):\n    return []\n")
    with_env = spec(extra=rewards("nowhere:f")).replace(
        "train:\n", f"slurm:\n  env:\n    trainer: {{PYTHONPATH: {lib}}}\ntrain:\n")
    assert check(with_env).exit_code == 0
    # ... or in the site-packages of the virtualenv slurm.setup activates
    site = submit / "venv" / "lib" / "python3.99" / "site-packages"
    site.mkdir(parents=True)
    (site / "vmod.py").write_text("def g(**kw):\n    return []\n")
    (submit / "venv" / "bin").mkdir()
    (submit / "venv" / "bin" / "activate").write_text("")
    with_venv = spec(extra=rewards("vmod:g")).replace("train:\n", "slurm:\n  setup: [source venv/bin/activate]\ntrain:\n")
    assert check(with_venv).exit_code == 0, check(with_venv).stderr
    # a setup line that may change the import path in ways check cannot follow: a warning, not an error
    opaque = spec(extra=rewards("elsewhere:g")).replace("train:\n", "slurm:\n  setup: [module load rl-tools]\ntrain:\n")
    r = check(opaque)
    assert r.exit_code == 0 and "module load rl-tools" in lines(r, "LG322")[0] and " warning " in lines(r, "LG322")[0]
    assert check(opaque, "--strict").exit_code == 2


def test_reward_registry_imports_no_torch() -> None:
    code = ("import sys, launchgen.trainers.declarations.rewards as r, launchgen.trainers.declarations.datafiles, launchgen.checks;"
            "print(sorted(r.BUILTINS), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['accuracy', 'format', 'length'] False"


def test_builtin_columns_match_the_reward_functions() -> None:
    import inspect

    from launchgen.trainers.declarations.rewards import BUILTIN_COLUMNS, BUILTINS

    for name, cols in BUILTIN_COLUMNS.items():
        params = inspect.signature(BUILTINS[name]).parameters
        assert all(c in params for c in cols), (name, cols)


# ------------------------------------------------------------------------------------------------ data


def test_data_path_missing(submit: Path) -> None:
    out = failed(check(spec(data="trian.jsonl")), "LG330", "train.args.data.path", 11)
    assert str(submit / "trian.jsonl") in out and "did you mean train.jsonl" in out
    failed(check(spec(data="./data/none")), "LG330", "train.args.data.path")


def test_rows_lack_prompt_and_answer_columns(submit: Path) -> None:
    (submit / "gsm.jsonl").write_text(json.dumps({"question": "1+1?", "gold": "2"}) + "\n")
    r = check(spec(data="gsm.jsonl"))
    out = failed(r, "LG332", "train.args.data", 10)
    assert "prompt_column: question" in out
    # the default reward (rewards unset) is accuracy, which needs an answer column
    out = failed(r, "LG333", "train.args.data")
    assert "default reward" in out and "{gold: answer}" in out
    mapped = spec(data="gsm.jsonl").replace("path: gsm.jsonl", "path: gsm.jsonl\n      column_mapping: {question: prompt, gold: answer}")
    assert check(mapped).exit_code == 0, check(mapped).stderr
    # rewards that need no reference column: no LG333
    r = check(spec(data="gsm.jsonl", extra=rewards("format")).replace("path: gsm.jsonl", "path: gsm.jsonl\n      prompt_column: question"))
    assert r.exit_code == 0, r.stderr
    # a named reward is reported at its own line
    failed(check(spec(data="gsm.jsonl", extra=rewards("format", "accuracy")).replace(
        "path: gsm.jsonl", "path: gsm.jsonl\n      prompt_column: question")), "LG333", "train.args.rewards.1.name", 15)


def test_sft_row_format(submit: Path) -> None:
    out = failed(check(spec(trainer="sft")), "LG332", "train.args.data", 10)
    assert "`messages`" in out and "completion" in out
    (submit / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert check(spec(trainer="sft", data="chat.jsonl")).exit_code == 0


def test_unreadable_data(submit: Path) -> None:
    (submit / "bad.jsonl").write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    assert "line 2 is not JSON" in failed(check(spec(data="bad.jsonl")), "LG331", "train.args.data.path", 11)
    (submit / "empty.jsonl").write_text("\n")
    assert "no rows" in failed(check(spec(data="empty.jsonl")), "LG331", "train.args.data.path")
    (submit / "rows.csv").write_text("prompt,answer\n")
    assert "unsupported" in failed(check(spec(data="rows.csv")), "LG331", "train.args.data.path")
    (submit / "plain").mkdir()
    assert "save_to_disk" in failed(check(spec(data="plain")), "LG331", "train.args.data.path")


def test_json_is_peeked_not_read_whole(submit: Path) -> None:
    """The first rows of a JSON list are decoded incrementally: garbage far down the file is never reached."""
    body = ",\n".join(json.dumps(r) for r in ROWS * 3)
    (submit / "big.json").write_text("[\n" + body + ",\n" + "x" * (3 << 20) + "\n]")
    assert check(spec(data="big.json")).exit_code == 0
    (submit / "q.json").write_text(json.dumps([{"question": "x"}]))
    failed(check(spec(data="q.json")), "LG332", "train.args.data")
    (submit / "wrapped.json").write_text(json.dumps({"train": ROWS}))
    assert check(spec(data="wrapped.json")).exit_code == 0


def test_parquet_columns(submit: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "x", "solution": "1"}] * 3), submit / "ok.parquet")
    assert check(spec(data="ok.parquet")).exit_code == 0
    pq.write_table(pa.Table.from_pylist([{"prompt": "x"}] * 3), submit / "noref.parquet")
    failed(check(spec(data="noref.parquet")), "LG333", "train.args.data")


def test_save_to_disk_folders(submit: Path) -> None:
    import datasets
    datasets.Dataset.from_list(ROWS).save_to_disk(str(submit / "ds"))
    assert check(spec(data="ds")).exit_code == 0
    datasets.Dataset.from_list([{"question": "x", "answer": "1"}]).save_to_disk(str(submit / "ds_q"))
    failed(check(spec(data="ds_q")), "LG332", "train.args.data")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(submit / "dd"))
    assert check(spec(data="dd")).exit_code == 0
    out = failed(check(spec(data="dd").replace("path: dd", "path: dd\n      split: validation")),
                 "LG331", "train.args.data.split", 12)
    assert "test, train" in out or "train, test" in out
    datasets.Dataset.from_list(ROWS).select([]).save_to_disk(str(submit / "empty"))
    assert "no rows" in failed(check(spec(data="empty")), "LG331", "train.args.data.path")


def test_trainer_reads_save_to_disk_folders(submit: Path) -> None:
    import datasets
    from launchgen.trainers.data import load_rows
    from launchgen.trainers.declarations.config import DataSection

    rows = [{"q": f"{i}+1?", "answer": str(i + 1)} for i in range(2500)]
    datasets.Dataset.from_list(rows).save_to_disk(str(submit / "ds"), max_shard_size="20KB")
    got = load_rows(DataSection(path="ds", column_mapping={"q": "prompt"}))
    assert got == [{"prompt": r["q"], "answer": r["answer"]} for r in rows]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]),
                          "test": datasets.Dataset.from_list(rows[3:4])}).save_to_disk(str(submit / "dd"))
    assert [r["q"] for r in load_rows(DataSection(path="dd", split="test", prompt_column="q"))] == ["3+1?"]


def test_hub_data_set_is_an_info(submit: Path) -> None:
    r = check(spec(data="openai/gsm8k"))
    assert r.exit_code == 0 and lines(r, "LG334") and " info " in lines(r, "LG334")[0]


# ------------------------------------------------------------------------------------------------ model


def test_local_model_path(submit: Path) -> None:
    out = failed(check(spec(model="./models/qwen-sft")), "LG210", "model.name_or_path", 4)
    assert str(submit / "models" / "qwen-sft") in out
    failed(check(spec(model="runs/a/final")), "LG210", "model.name_or_path")
    (submit / "empty-model").mkdir()
    assert "config.json" in failed(check(spec(model="./empty-model")), "LG210", "model.name_or_path")
    (submit / "empty-model" / "config.json").write_text("{}")
    assert check(spec(model="./empty-model")).exit_code == 0
    # `examples/tiny-model` reads as a Hub id, but examples/ is a local folder: a warning
    (submit / "examples").mkdir()
    r = check(spec(model="examples/tiny-model"))
    assert r.exit_code == 0 and " warning " in lines(r, "LG211")[0]
    assert check(spec(model="examples/tiny-model"), "--strict").exit_code == 2
    assert not lines(check(spec(model="Qwen/Qwen2.5-0.5B")), "LG21")
    # `~user` of no user, and a name too long for a path: reported, never a traceback
    assert "does not exist" in failed(check(spec(model="~nosuchuser0")), "LG210", "model.name_or_path")
    failed(check(spec(model="./" + "m" * 300)), "LG210", "model.name_or_path")


# ------------------------------------------------------------------------------------------------ setup (--live)


def test_live_setup_sources_a_missing_file(submit: Path) -> None:
    text = spec().replace("train:\n", "slurm:\n  setup:\n    - module load cuda\n    - source .venv/bin/activate\ntrain:\n")
    out = failed(check(text, "--live"), "LG730", "slurm.setup.1", 8)
    assert str(submit / ".venv" / "bin" / "activate") in out
    assert not lines(check(text), "LG730"), "a --live check only"
    (submit / ".venv" / "bin").mkdir(parents=True)
    (submit / ".venv" / "bin" / "activate").write_text("")
    assert not lines(check(text, "--live"), "LG730")
    home = submit / "home"
    (home / "env").mkdir(parents=True)
    for line, bad in (("source ~/env/act", True), (". $HOME/env/act", True), ("source $VENV/bin/activate", False)):
        r = check(spec().replace("train:\n", f"slurm:\n  setup: [{json.dumps(line)}]\ntrain:\n"), "--live",
                  env={"HOME": str(home)})
        assert bool(lines(r, "LG730")) == bad, (line, r.stderr)


def test_render_does_not_read_the_data(submit: Path) -> None:
    """`render` may run where the data is not (a laptop): file checks are `check`'s, never render's."""
    Path("spec.yaml").write_text(spec(data="absent.jsonl", model="./absent"))
    r = CliRunner().invoke(main, ["render", "spec.yaml", "-o", "job.sbatch"])
    assert r.exit_code == 0, r.output


def test_every_file_check_code_is_tested_here() -> None:
    from launchgen import checks

    # the peft file checks are tested with the rest of peft's in test_preflight_peft.py, train.distributed's and
    # eval_data's (LG633, LG634, LG637, LG361) in test_distributed.py, the containers' (LG250, LG251, LG258) in
    # test_containers.py, a TRL script's (LG922, LG923) in test_trl_checks.py, a node file's (LG814) with the
    # rest of LG814 in test_static_checks.py
    source = "".join((Path(__file__).parent / name).read_text()
                     for name in ("test_preflight.py", "test_preflight_peft.py", "test_distributed.py",
                                  "test_containers.py", "test_trl_checks.py", "test_static_checks.py"))
    codes = {c for chk in checks.CHECKS if chk.stage == "files" for c in chk.codes} | {"LG730"}
    assert {c for c in codes if f'"{c}"' not in source} == set()


def test_file_problems_are_reported_with_the_spec_errors(submit: Path) -> None:
    """Everything at once: a GPU-layout error does not hide the missing data file."""
    text = spec(data="absent.jsonl").replace("  device: cpu\n", "  gpus: [9]\n").replace("  precision: fp32\n", "")
    r = check(text)
    assert r.exit_code == 2 and lines(r, "LG101") and lines(r, "LG330"), r.stderr
