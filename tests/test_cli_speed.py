"""Login-node start-up (issue 28): each verb imports only what it uses, and `render` reuses compiled templates.

The timings themselves are `benchmarks/cli_speed.py`'s (a ratio to `python -c pass` in one run); these tests
keep the causes away: `--help` importing every verb, `check` importing jinja2 or rich, templates compiled anew
on every render.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "colocate.yaml"

PROBE = """
import json, sys
from launchgen.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("MODULES " + json.dumps(sorted(sys.modules)))
"""


def imported(args: list[str], tmp_path: Path) -> set[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("MODULES ")), None)
    assert line is not None, p.stdout + p.stderr
    return set(json.loads(line[len("MODULES "):]))


@pytest.mark.parametrize(("args", "absent"), [
    (["--help"], ("pydantic", "yaml", "rich", "jinja2", "plotly", "launchgen.checks", "launchgen.cli.check",
                  "launchgen.cli.status")),
    (["init", "-"], ("pydantic", "rich", "jinja2", "launchgen.checks")),
    (["check", str(SPEC)], ("rich", "jinja2", "launchgen.render")),
    (["plan", str(SPEC)], ("jinja2", "launchgen.render")),
    (["render", str(SPEC)], ("rich", "launchgen.planview")),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_verbs_import_only_what_they_use(tmp_path: Path, args: list[str], absent: tuple[str, ...]) -> None:
    mods = imported(args, tmp_path)
    assert "launchgen.cli" in mods  # the probe ran the CLI
    assert not [m for m in absent if m in mods], f"`launchgen {' '.join(args)}` imported {absent}"


def _render(tmp_path: Path, cache: str, name: str) -> str:
    out = tmp_path / name
    env = {**os.environ, "LAUNCHGEN_CACHE_DIR": cache}
    p = subprocess.run([sys.executable, "-m", "launchgen", "render", str(SPEC), "-o", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return out.read_text()


def test_render_keeps_compiled_templates_and_renders_the_same(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _render(tmp_path, str(cache), "a.sbatch")
    entries = sorted(cache.glob("jinja-*/__jinja2_*.cache"))
    assert entries, "render wrote no compiled template"
    assert (cache.stat().st_mode & 0o777) == 0o700 or (entries[0].parent.stat().st_mode & 0o777) == 0o700
    assert _render(tmp_path, str(cache), "b.sbatch") == first  # from the cache
    assert _render(tmp_path, "", "c.sbatch") == first  # no cache at all
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.access(ro, os.W_OK):  # root ignores the mode; make the cache path a file instead
        ro.rmdir()
        ro.write_text("not a directory")
    assert _render(tmp_path, str(ro / "sub"), "d.sbatch") == first  # an unusable cache costs only the compile


def test_check_does_not_scan_installed_distributions_for_pydantic_plugins(tmp_path: Path) -> None:
    probe = PROBE.replace('print("MODULES "', 'import pydantic.plugin._loader as L\nprint("SCANNED", L._plugins)\nprint("MODULES "')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, "-c", probe, "check", str(SPEC)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert "SCANNED None" in p.stdout, p.stdout[-500:] + p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-c", probe, "check", str(SPEC)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={**env, "PYDANTIC_DISABLE_PLUGINS": "0"})
    assert "SCANNED {}" in p.stdout, p.stdout[-500:]  # the user's own setting wins (and the probe can tell)
