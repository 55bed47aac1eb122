"""`python -m launchgen.trainers.<name> --help` lists every config field with its default and description, and
neither it nor a config error imports torch (checked with `-X importtime`, which lists every module imported)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from launchgen.trainers.cli import field_rows

HEAVY = ("torch", "transformers", "accelerate", "vllm")


def _imported(stderr: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^import time:[^|]*\|[^|]*\|\s*(\S+)", stderr, re.M)}


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m.split(".")[0] in HEAVY)


def test_every_field_has_a_description() -> None:
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.declarations.configs import CONFIGS

    for cls in CONFIGS.values():
        rows = field_rows(cls)
        assert len(rows) > (60 if issubclass(cls, TrainerConfig) else 5)  # TRL's own: its field table is elsewhere
        assert [p for p, _, _, desc in rows if not desc] == []


def test_help_shows_the_trainers_own_options_and_defaults() -> None:
    from launchgen.trainers.declarations.configs import CONFIGS

    grpo = {p: d for p, _, d, _ in field_rows(CONFIGS["grpo"])}
    dpo = {p: d for p, _, d, _ in field_rows(CONFIGS["online_dpo"])}
    assert "delta" in grpo and "delta" not in dpo  # GRPO's options under grpo only
    assert (grpo["num_generations"], dpo["num_generations"]) == ("8", "2")
    assert (dpo["generation.temperature"], dpo["loss_type"]) == ("0.9", '"sigmoid"')


@pytest.mark.parametrize("trainer", ["grpo", "rloo", "online_dpo", "sft"])
def test_help_lists_every_field_without_importing_torch(trainer: str) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", f"launchgen.trainers.{trainer}", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = _imported(proc.stderr)
    assert "launchgen.trainers.cli" in mods  # the parse worked: importtime did list the imports
    assert _heavy(mods) == []
    out = proc.stdout
    from launchgen.trainers.declarations.configs import CONFIGS

    for path, typ, default, _desc in field_rows(CONFIGS[trainer]):
        assert f"\n  {path}: {typ} = {default}\n" in out, path
    # hand-written expectations for a few rows (type, default, description)
    assert "\n  seed: int = 42\n      Random seed" in out
    assert '\n  precision: bf16|fp16|fp32 = "bf16"\n' in out
    assert "\n  generation.vllm_server.port: int = 8000\n      HTTP port of the server.\n" in out
    assert '\n  rewards: list = [{"name": "accuracy"}]\n' in out
    assert "\n  rewards[].weight: float = 1.0\n      Weight in the weighted sum of rewards.\n" in out
    assert "\n  output_dir: str = required\n" in out


def test_config_error_exits_2_without_importing_torch(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("trainer: grpo\noutput_dir: out\nmodel: {name_or_path: m}\ndata: {path: d.jsonl}\nseed: x\n")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "launchgen.trainers.grpo", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"error: {cfg}: seed: " in proc.stderr
    assert _heavy(_imported(proc.stderr)) == []
