"""The import graph of `launchgen/` with `trainers/` at its installed place (`launchgen.trainers`): no circle, and
dependencies that run one way between the login-node code and the trainers.

Read from the source (every `import` statement, at module level or inside a function), not from what one run
happens to import, so a lazy import inside a function counts. Imports under `if TYPE_CHECKING:` count for the
circles (a circle of annotations is still a design circle) but not for the layers (they never run).

The layers:

* the shared layer (`launchgen/shared/`): launchgen's torch-free modules the trainers may import (the job-directory
  contract, precision, ports, version windows, the layout's TP/DP predicates, the memory estimate's constants);
  they import nothing outside the layer at run time.
* the trainers' declarations (`trainers/declarations/`): the torch-free part of `launchgen.trainers` that the login-node
  code may import (each trainer's config class and facts, the backends' capabilities, the data readers `check`
  peeks with, the reward names, TRL's field table); they import only declarations and the shared layer.
* the login-node code: every other `launchgen.*` module. It imports no trainers' runtime module.
* the trainers' runtime: every other `launchgen.trainers.*` module. From launchgen it imports the shared layer only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"launchgen": ROOT / "launchgen", "launchgen.trainers": ROOT / "trainers"}

#: The layers are folders: the shared layer is `launchgen/shared/` (with the `launchgen` package itself, which holds
#: only the version), the declarations are `trainers/declarations/` (with the `launchgen.trainers` package).
SHARED_FOLDER = "launchgen.shared"
DECLARATIONS_FOLDER = "launchgen.trainers.declarations"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if pkg == "launchgen" and parts and parts[0] == "trainers":
                continue
            found[".".join([pkg, *parts])] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, runtime_only: bool, on_import: bool = False) -> Iterator[str]:
    """`on_import`: only what importing the module runs (not the bodies of its functions)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if runtime_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
        if on_import and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                yield target


def _graph(runtime_only: bool, on_import: bool = False) -> dict[str, set[str]]:
    return {m: set(_imports(m, p, runtime_only, on_import)) for m, p in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _is_trainers(m: str) -> bool:
    return m == "launchgen.trainers" or m.startswith("launchgen.trainers.")


def _in(m: str, folder: str) -> bool:
    return m == folder or m.startswith(folder + ".")


def _is_declaration(m: str) -> bool:
    return m == "launchgen.trainers" or _in(m, DECLARATIONS_FOLDER)


SHARED = frozenset(m for m in MODULES if m == "launchgen" or _in(m, SHARED_FOLDER))


def test_the_graph_is_read() -> None:
    graph = _graph(runtime_only=False)
    assert len(MODULES) > 100 and "launchgen.trainers.core" in MODULES and "launchgen.checks.runner" in MODULES
    assert "launchgen.planning.plan" in graph["launchgen.checks.runner"]  # a function-level import counts
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert _circles(_graph(runtime_only=False)) == []


def test_login_node_code_imports_no_trainers_runtime() -> None:
    graph = _graph(runtime_only=True)
    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if not _is_trainers(m)
                 for t in targets if _is_trainers(t) and not _is_declaration(t))
    assert bad == []


def test_trainers_import_only_the_shared_layer_from_launchgen() -> None:
    graph = _graph(runtime_only=True)
    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if _is_trainers(m)
                 for t in targets if not _is_trainers(t) and t not in SHARED)
    assert bad == []


def test_the_shared_layer_and_the_declarations_stay_small() -> None:
    """The shared layer imports only itself; importing a declaration imports only declarations and the shared
    layer (so neither pulls the login-node code or the trainers' runtime in; a declaration's function that only the
    trainer calls may import the runtime it needs, as `rewards.load_rewards` loads a reward model)."""
    graph = _graph(runtime_only=True)
    bad = sorted(f"{m} -> {t}" for m in SHARED for t in graph[m] if t not in SHARED)
    on_import = _graph(runtime_only=True, on_import=True)
    bad += sorted(f"{m} -> {t}" for m, targets in on_import.items() if _is_trainers(m) and _is_declaration(m)
                  for t in targets if not (t in SHARED or _is_declaration(t)))
    assert bad == []


#: A flat package hides its layers; a module directly under launchgen/ is the exception, not the home.
MAX_TOP_LEVEL_MODULES = 15
#: A file past this mixes jobs: split it by what it holds.
MAX_FILE_LINES = 600


def test_launchgen_holds_its_modules_in_stage_folders() -> None:
    top = sorted(p.name for p in (ROOT / "launchgen").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    # every stage folder is a package with a docstring that says what the stage holds
    for folder in (ROOT / "launchgen").iterdir():
        if folder.is_dir() and folder.name != "__pycache__":
            init = folder / "__init__.py"
            assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), folder


def test_no_source_file_is_over_the_line_limit() -> None:
    long = sorted(f"{p.relative_to(ROOT)}: {n}" for folder in PACKAGES.values() for p in folder.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES)
    assert long == []
