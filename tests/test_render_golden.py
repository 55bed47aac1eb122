"""Golden files: what each example x scheduler renders, kept where a change to it needs review.

Six layouts keep their whole script (`FULL`): together they reach every template line any example reaches (a
test keeps that true), so a change to the machinery (supervisor, requeue, preflight step) shows in those six.
In them the preflight program, `launchgen/jobside/allocprobe.py` verbatim, is stored as its hash: the heredoc's
delimiter is the content's sha256 prefix, and a test holds every script's copy to the source; the run-record
writer's first part, `launchgen/shared/noderuns.py` verbatim, is one marker line. Every other
case keeps what varies with its spec: the script up to the machinery rule (header, `#SBATCH`, the role steps,
the resolved configs and spec), as `<example>.<scheduler>.request.sh`.

A change to the templates or the plan shows up as a diff here; review it like code. To accept it:
    LAUNCHGEN_UPDATE_GOLDEN=1 python -m pytest tests/test_render_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import jinja2
import pytest
from render_cases import EXAMPLES, SCHEDULERS, plan_for, renderable

from launchgen.jobside import allocprobe
from launchgen.script import render
from launchgen.script.render import MACHINERY_RULE, render_files, render_script
from launchgen.shared import noderuns
from launchgen.shared.issues import SpecError

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("LAUNCHGEN_UPDATE_GOLDEN") == "1"
CASES = [(e, s) for e in EXAMPLES for s in SCHEDULERS]
#: the cases whose whole script is golden: the README's layout, and a cover of every template line
FULL = {
    ("single-node-split", "sbatch"),  # the layout users read first (README)
    ("hetjob-inference-partition", "sbatch"),  # a heterogeneous job: het groups, two node lists, component ids
    ("two-replicas", "bash"),  # server replicas and their restarts; --bash: process groups, the watcher
    ("container-pyxis", "sbatch"),  # containers: the HF cache, USER; pyxis options on the srun lines
    ("local-cpu-quickstart", "sbatch"),  # CPU, no vLLM server, requeue off
    ("pp-two-node-server", "sbatch"),  # one engine over two nodes: each rank's files, the supervisor's rank watch
}
#: the embedded programs that are a launchgen source file verbatim, stored in full goldens as their hash
CONSTANT_PROGRAMS = {"steps/preflight.py": "launchgen/jobside/allocprobe.py",
                     "steps/vllmprobe.py": "launchgen/jobside/vllmprobe.py"}
#: the record writer's first part (jobdir.RUN_RECORD_WRITER), stored in full goldens as one line
NODERUNS_SOURCE = Path(noderuns.__file__).read_text()
NODERUNS_MARK = "# [golden: launchgen/shared/noderuns.py verbatim]\n"
MAX_GOLDEN_LINES = 15_000
HEREDOC = re.compile(r"^\s*cat >\"\$LG_JOB_DIR\"/(\S+) <<'(\S+)'$")


def golden_name(example: str, scheduler: str) -> str:
    return f"{example}.{scheduler}.sh" if (example, scheduler) in FULL else f"{example}.{scheduler}.request.sh"


def golden_text(example: str, scheduler: str, script: str) -> str:
    """What the golden of this case keeps of its script."""
    if (example, scheduler) not in FULL:
        return script[:script.index(MACHINERY_RULE)]
    out: list[str] = []
    end = None
    for line in script.splitlines(keepends=True):
        if end is not None and line.rstrip("\n") != end:
            continue
        end = None
        out.append(line)
        m = HEREDOC.match(line.rstrip("\n"))
        if m and m.group(1) in CONSTANT_PROGRAMS:
            end = m.group(2)
            out.append(f"# [golden: {CONSTANT_PROGRAMS[m.group(1)]} verbatim; its sha256 begins the delimiter]\n")
    # the run-record writer starts with noderuns.py verbatim (test_the_record_writer_embeds_noderuns_verbatim)
    return "".join(out).replace(NODERUNS_SOURCE, NODERUNS_MARK)


@pytest.mark.parametrize(("example", "scheduler"), CASES)
def test_golden(example: str, scheduler: str) -> None:
    golden = GOLDEN / golden_name(example, scheduler)
    if not renderable(example, scheduler):
        with pytest.raises(SpecError) as exc:
            render_script(plan_for(example), scheduler)  # type: ignore[arg-type]
        assert [i.code for i in exc.value.issues] in (["LG909"], ["LG254"])  # several nodes; pyxis needs srun
        assert not golden.exists(), f"{golden} is stale: this layout cannot render for --bash"
        return
    text = golden_text(example, scheduler, render_script(plan_for(example), scheduler))  # type: ignore[arg-type]
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; create it with LAUNCHGEN_UPDATE_GOLDEN=1 and review it"
    expected = golden.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(golden), "rendered", n=2))
        pytest.fail(f"rendered script differs from {golden.name} (if intended, regenerate with "
                    f"LAUNCHGEN_UPDATE_GOLDEN=1 and review the diff):\n{diff[:6000]}")


def test_no_orphan_golden_files() -> None:
    expected = {golden_name(e, s) for e, s in CASES if renderable(e, s)}
    assert {p.name for p in GOLDEN.glob("*.sh")} == expected


def test_goldens_stay_small_enough_to_review() -> None:
    total = sum(len(p.read_text().splitlines()) for p in GOLDEN.glob("*.sh"))
    assert total <= MAX_GOLDEN_LINES, f"tests/golden holds {total} lines (at most {MAX_GOLDEN_LINES})"


def test_render_is_deterministic() -> None:
    for example in EXAMPLES:
        assert render_script(plan_for(example), "sbatch") == render_script(plan_for(example), "sbatch")


def test_constant_programs_are_their_source_verbatim() -> None:
    """What the full goldens store as a hash is what every script embeds: the source file, byte for byte."""
    assert set(CONSTANT_PROGRAMS) == set(allocprobe.PROGRAM)
    for example, scheduler in CASES:
        if renderable(example, scheduler) and plan_for(example).preflight:
            files = render_files(plan_for(example), scheduler)  # type: ignore[arg-type]
            assert {n: files[n] for n in CONSTANT_PROGRAMS} == allocprobe.sources(), (example, scheduler)


def test_the_record_writer_embeds_noderuns_verbatim() -> None:
    """What the full goldens store as one line is in every script: noderuns.py, whole, once, before its caller."""
    for example, scheduler in CASES:
        if renderable(example, scheduler):
            script = render_script(plan_for(example), scheduler)  # type: ignore[arg-type]
            assert script.count(NODERUNS_SOURCE) == 1, (example, scheduler)
            assert script.index(NODERUNS_SOURCE) < script.index("expand_record(", script.index(NODERUNS_SOURCE)
                                                                + len(NODERUNS_SOURCE)), (example, scheduler)


def _reached_template_lines(example: str, scheduler: str) -> set[str]:
    """`template:line` of every template line that puts text into this case's script (its step scripts too)."""
    root = render.environment().loader.searchpath[0]  # type: ignore[union-attr]

    def tagged(name: str) -> str:
        lines = (Path(root) / name).read_text().splitlines()
        # a line with only literal text or `{{ }}` gets a marker at its end; tags and comments stay as written
        return "\n".join(line if "{%" in line or "{##" in line or "##}" in line or not line.strip()
                         else f"{line}\x02{name}:{i}\x03" for i, line in enumerate(lines, 1)) + "\n"

    env = render.environment().overlay(loader=jinja2.FunctionLoader(lambda n: (tagged(n), None, lambda: False)),
                                       bytecode_cache=None)
    original = render.environment
    render.environment = lambda: env  # type: ignore[assignment]
    try:
        text = render_script(plan_for(example), scheduler)  # type: ignore[arg-type]
    finally:
        render.environment = original
    return set(re.findall("\x02([^\x03]+)\x03", text))


def test_the_full_goldens_reach_every_template_line_an_example_reaches() -> None:
    reached = {(e, s): _reached_template_lines(e, s) for e, s in CASES if renderable(e, s)}
    covered = set().union(*(reached[c] for c in FULL))
    missing = {line: sorted(f"{e}.{s}" for (e, s), got in reached.items() if line in got)
               for line in set().union(*reached.values()) - covered}
    assert missing == {}, ("template lines no full golden shows (add the case to FULL, or an example's layout "
                           f"to a full one): {missing}")
