"""Login-node start-up (issue 28): each verb imports only what it uses, and `render` reuses compiled templates.

The timings themselves are `benchmarks/cli_speed.py`'s (a ratio to `python -c pass` in one run); these tests
keep the causes away: `--help` importing every verb, `check` importing jinja2 or rich, templates compiled anew
on every render.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "colocate.yaml"

PROBE = """
import json, sys
START = sorted(sys.modules)
from launchgen.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("START " + json.dumps(START))
print("MODULES " + json.dumps(sorted(sys.modules)))
"""

JOB = ROOT / "tests" / "fixtures" / "status" / "job10"  # a recorded job directory (attempts 0 and 1)

#: What a verb's imports may reach outside the standard library and launchgen, as top-level packages.
CLI = {"click"}
MODELS = CLI | {"pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection", "yaml"}
NEVER = {"torch", "transformers", "vllm", "trl", "accelerate", "datasets", "numpy", "huggingface_hub"}

#: (arguments; the packages it may import; the most launchgen modules it may import; launchgen modules it must
#: not import). The bounds are today's counts plus a few for new check modules: a verb that starts importing
#: another verb's stack (or every check, or the trainers' runtime) is over them at once. The stage folders'
#: package modules (`launchgen.input`, `launchgen.planning`, ...) count too: a docstring each. Every verb that
#: prints a message for a person imports `launchgen.shared.textwidth` (stdlib only) to wrap it.
VERBS: list[tuple[list[str], set[str], int, tuple[str, ...]]] = [
    (["--help"], CLI, 2, ("launchgen.cli.check", "launchgen.cli.status", "launchgen.shared.issues")),
    (["--version"], CLI, 2, ()),
    (["init", "-"], CLI, 5, ("launchgen.checks", "launchgen.input.spec")),
    # check and plan render the sbatch script once, to measure it against SLURM's max_script_size (LG815: the
    # only exact answer; ~30 ms with the compiled-template cache), so they import the templates' engine too
    (["check", str(SPEC)], MODELS | {"packaging", "jinja2", "markupsafe"}, 126, ("launchgen.planning.view",)),
    (["check", str(SPEC), "--no-files"], MODELS | {"packaging", "jinja2", "markupsafe"}, 126,
     ("launchgen.planning.view",)),
    (["plan", str(SPEC)], MODELS | {"packaging", "rich", "jinja2", "markupsafe"}, 130, ()),
    (["render", str(SPEC), "-o", "{tmp}/job.sbatch"], MODELS | {"packaging", "jinja2", "markupsafe"}, 125,
     ("launchgen.planning.view", "launchgen.tables")),
    (["render", str(SPEC), "--bash", "-o", "{tmp}/job.sh"], MODELS | {"packaging", "jinja2", "markupsafe"}, 125,
     ("launchgen.planning.view", "launchgen.tables")),
    (["schema"], MODELS, 49, ("launchgen.checks", "launchgen.planning.plan")),
    (["schema", "--format", "markdown"], MODELS, 49, ("launchgen.checks", "launchgen.planning.plan")),
    (["status", "local", "--job-dir", "{job}"], CLI | {"rich"}, 19, ("launchgen.input.spec", "launchgen.checks")),
    (["logs", "local", "--job-dir", "{job}", "--role", "trainer"], CLI, 18, ("launchgen.input.spec", "launchgen.checks")),
    # orjson: plotly's JSON writer takes it where it is installed
    (["report", "{job}", "-o", "{tmp}/report.html"], CLI | {"plotly", "narwhals", "orjson"}, 20,
     ("launchgen.input.spec", "launchgen.checks")),
]


def imported(args: list[str], tmp_path: Path) -> set[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in p.stdout.splitlines()
             if ln.startswith(("START ", "MODULES "))}
    assert "MODULES" in lines, p.stdout + p.stderr
    # What the interpreter imported before the CLI (a site-packages .pth file, such as one that imports certifi
    # to add a CA) is the machine's, not the verb's.
    return set(json.loads(lines["MODULES"])) - set(json.loads(lines["START"]))


def packages(mods: set[str]) -> set[str]:
    """The top-level packages imported from outside the standard library and launchgen (a package counts once
    it is itself imported: launchgen's stand-in for pydantic's plugin loader does not import pydantic)."""
    return {m for m in mods if "." not in m and not m.startswith("_") and m not in sys.stdlib_module_names
            and m not in ("launchgen", "cython_runtime")}


@pytest.mark.parametrize(("args", "allowed", "most", "absent"), VERBS, ids=lambda a: " ".join(a).replace(str(ROOT) + "/", "")
                         if isinstance(a, list) else "")
def test_verbs_import_only_what_they_use(tmp_path: Path, args: list[str], allowed: set[str], most: int,
                                         absent: tuple[str, ...]) -> None:
    job = tmp_path / "job"
    shutil.copytree(JOB, job)
    mods = imported([a.format(tmp=tmp_path, job=job) for a in args], tmp_path)
    assert "launchgen.cli" in mods  # the probe ran the CLI
    verb = " ".join(args[:1])
    assert not packages(mods) & NEVER
    assert packages(mods) <= allowed, f"`launchgen {verb}` imported {sorted(packages(mods) - allowed)}"
    ours = sorted(m for m in mods if m == "launchgen" or m.startswith("launchgen."))
    assert len(ours) <= most, f"`launchgen {verb}` imported {len(ours)} launchgen modules (at most {most}): {ours}"
    assert not [m for m in absent if m in mods], f"`launchgen {verb}` imported {[m for m in absent if m in mods]}"
    if args[0] != "report":  # plotly reads its own package metadata
        # email, zipfile, csv, ...: ~30 ms that only `check --live` (installed versions) needs
        assert "importlib.metadata" not in mods or args[-1] == "--live"


def test_the_guard_sees_an_import(tmp_path: Path) -> None:
    """The probe reports what the process imported: a CLI run after `import jinja2` shows jinja2."""
    mods = imported(["--help"], tmp_path)
    assert "jinja2" not in mods
    probe = PROBE.replace("from launchgen.cli import main", "import jinja2\nfrom launchgen.cli import main")
    p = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert "jinja2" in packages(set(json.loads(p.stdout.split("MODULES ", 1)[1])))


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
