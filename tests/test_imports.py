"""`check`, `render` (and the other light verbs) must not import the heavy stack: they run on login nodes.

Each case runs the CLI's `main` in process inside a fresh interpreter and then inspects `sys.modules`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "vllm", "numpy", "huggingface_hub", "accelerate", "liger_kernel", "kernels",
         "plotly")

SPEC = """\
job: {name: demo}
model: {name_or_path: org/model}
vllm: {mode: server, gpus: [0, 1, 2, 3], tensor_parallel_size: 4, group_port: 29551}
train:
  trainer: grpo
  attn_implementation: kernels-community/flash-attn2@v2
  args: {data: {path: prompts.jsonl}}
"""

PROBE = """
import json, sys
from launchgen.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in json.loads({heavy!r}) if m in sys.modules]
print("RESULT " + json.dumps({{"code": code, "heavy": heavy}}))
"""


def _run(args: list[str], tmp_path: Path) -> dict[str, object]:
    code = PROBE.format(heavy=json.dumps(HEAVY))
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                          "HF_HOME": str(tmp_path / "hf")})
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, p.stdout + p.stderr
    result: dict[str, object] = json.loads(line[len("RESULT "):])
    return result


@pytest.mark.parametrize("args", [
    ["check", "spec.yaml"],
    ["check", "spec.yaml", "--live"],
    ["check", "spec.yaml", "--explain"],
    ["plan", "spec.yaml"],
    ["render", "spec.yaml", "-o", "job.sbatch"],
    ["schema", "--format", "markdown"],
    ["init", "new.yaml"],
], ids=lambda a: " ".join(a))
def test_light_verbs_import_no_heavy_package(tmp_path: Path, args: list[str]) -> None:
    verb = args[0]
    if importlib.util.find_spec(f"launchgen.cli.{verb}") is None:
        pytest.skip(f"verb {verb} not present")
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')  # check peeks at it
    result = _run(args, tmp_path)
    assert result["code"] in (0, None), result
    assert result["heavy"] == [], f"`launchgen {' '.join(args)}` imported {result['heavy']}"


def test_probe_detects_a_heavy_import(tmp_path: Path) -> None:
    """The probe itself works: a verb that imports json-only stays clean, an import of numpy is seen."""
    import numpy  # noqa: F401  (a [dev] dependency: missing is a failure, not a skip)
    code = PROBE.format(heavy=json.dumps(HEAVY)).replace("from launchgen.cli import main",
                                                         "import numpy\nfrom launchgen.cli import main")
    p = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    assert "numpy" in json.loads(line[len("RESULT "):])["heavy"]
