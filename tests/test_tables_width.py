"""Output that fits (issue 28): every table `plan`, `check --explain` and `status` print is readable at 80 columns
and uses 200 when it has them, in a pipe (COLUMNS honoured) and in a terminal; a table that does not fit is
printed as whole items, never broken inside one that fits a line."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.cells import cell_len
from rich.console import Console

from launchgen import tables
from launchgen.checks import run_checks
from launchgen.cli import main
from launchgen.input.loader import load_spec
from launchgen.planning.view import _runs, print_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def widest(text: str) -> int:
    return max((cell_len(ANSI.sub("", line.rstrip())) for line in text.splitlines()), default=0)


def plan_of(example: Path):  # type: ignore[no-untyped-def]
    plan, _ = run_checks(load_spec(str(example)))
    assert plan is not None
    return plan


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_plan_fits_the_pipe_width_from_columns(example: Path, width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(main, ["plan", str(example.relative_to(ROOT))],
                           env={"COLUMNS": str(width), "HF_HOME": "/nonexistent-hf-home"})
    assert r.exit_code == 0, r.stderr
    assert widest(r.stdout) <= width, r.stdout
    assert "GPU map" in r.stdout
    if width == 200 and example.stem in ("single-node-split", "multi-node-70b", "two-replicas"):
        assert "┃ GPU 7" in r.stdout or "┃ GPU 0" in r.stdout, "200 columns hold the GPU map as a table"


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_plan_fits_a_terminal(example: Path, width: int) -> None:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=width, color_system="standard")
    print_plan(plan_of(example), con)
    out = buf.getvalue()
    if width == 200:
        assert "\x1b[" in out  # the tables that fit are drawn in colour, as for a terminal
    assert widest(out) <= width, out


def test_narrow_gpu_map_is_runs_of_whole_items(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(main, ["plan", "examples/multi-node-70b.yaml"], env={"COLUMNS": "80"})
    lines = r.stdout.splitlines()
    gpu = lines[lines.index("GPU map (node position x GPU -> role / rank):") + 1:][:5]
    assert gpu == [f"  - node {n}: trainer (machine rank {n}); GPU 0-7 trainer r{8 * n}-{8 * n + 7}"
                   for n in range(4)] + ["  - node 4: server; GPU 0-7 server TP0-7"]
    assert _runs(["server TP0", "server TP1", "idle", "idle", "trainer r0", "trainer r2"]) == [
        "GPU 0-1 server TP0-1", "GPU 2-3 idle", "GPU 4 trainer r0", "GPU 5 trainer r2"]
    assert _runs(["replica 0 TP0", "replica 0 TP1", "replica 1 TP0", "replica 1 TP1"]) == [
        "GPU 0-1 replica 0 TP0-1", "GPU 2-3 replica 1 TP0-1"]
    assert _runs([f"trainer r{i} +vLLM TP0" for i in range(8)]) == ["GPU 0-7 trainer r0-7 +vLLM TP0"]


def test_items_wrap_between_items_only() -> None:
    items = ["who: trainer rank 0, supervisor", "connects to node: 4", "port: server_http",
             "address: ${LG_SERVER_HOST}", "why: generation requests, weight-update control, /health"]
    lines = tables.wrap_items(items, 64, first="  - ", indent="      ")
    assert all(len(ln) <= 64 for ln in lines) and len(lines) == 3
    joined = " ".join(ln.strip() for ln in lines)
    for item in items:
        assert item in joined  # no item cut in two: each lies whole on one line
        assert any(item in ln for ln in lines), (item, lines)
    # an item wider than the line alone is broken at its spaces, a path never
    long = tables.wrap_items(["path: /a/very/long/path/" + "x" * 70, "b: 1"], 40, first="  - ", indent="      ")
    assert any("/a/very/long/path/" + "x" * 70 in ln for ln in long)


def test_status_tables_fit_80_columns(tmp_path: Path) -> None:
    """`launchgen status` of a job directory (the report tests' two-attempt job) in an 80-column pipe."""
    from test_report import make_job_dir

    job = make_job_dir(tmp_path)
    for width in (80, 200):
        r = CliRunner().invoke(main, ["status", "local", "--job-dir", str(job)], env={"COLUMNS": str(width)})
        assert r.exit_code in (0, 3), r.output
        assert widest(r.stdout) <= width, r.stdout


def test_counted_width_is_riches_own_measurement(tmp_path: Path) -> None:
    """`tables.fits` counts a table's width from its text instead of asking rich (which took most of a 64-node
    `plan`); both must agree on every table launchgen prints."""
    from launchgen.planning import view as planview

    con = Console(file=io.StringIO(), width=80)
    for example in EXAMPLES:
        plan = plan_of(example)
        for table in (planview.gpu_map(plan), planview.port_table(plan), planview.endpoint_table(plan),
                      planview.env_table(plan), planview.command_table(plan)):
            assert tables.natural_width(table) == tables.measured_width(con, table), (example.name, table.title)
