"""The premise of launchgen.input.directives, checked against the real sbatch: the spellings it refuses are read by
sbatch as the reserved option (`sbatch -v --test-only` lists the options it parsed), and the ordinary directives
it lets through are accepted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from slurmkit import Cluster

from launchgen.input import directives

pytestmark = pytest.mark.slurm

BYPASSES = ["-N3", "-pdebug", "--signa=USR1@5", "--no-req", "--partit=debug", "--outp=x.out", "-c4", "-HN3",
            "--ntasks-per-node=1", "-o/dev/null", "--mem=100", "--chdir=/tmp", "--exclus"]


def _parsed(tmp_path: Path, directive: str) -> tuple[set[str], str]:
    names, err, _refused = _sbatch(tmp_path, directive)
    return names, err


def _sbatch(tmp_path: Path, directive: str) -> tuple[set[str], str, bool]:
    """What sbatch -v --test-only makes of one #SBATCH line: the options it lists, its stderr, and whether it
    refused the script (a `fatal:`/`error:` before the listing, e.g. two mutually exclusive memory options)."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH {directive}\ntrue\n")
    r = subprocess.run(["sbatch", "-v", "--test-only", str(script)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    # `sbatch: <option> : <value>` lines, in sbatch's own names (cpus_per_task, no-requeue)
    names = {ln[8:].split(":", 1)[0].strip().replace("_", "-") for ln in r.stderr.splitlines()
             if ln.startswith("sbatch: ") and ":" in ln[8:] and not ln[8:].startswith(("fatal:", "error:"))}
    refused = any(ln.startswith(("sbatch: fatal:", "sbatch: error:")) for ln in r.stderr.splitlines())
    return names, r.stderr, refused


@pytest.mark.parametrize("directive", BYPASSES)
def test_sbatch_reads_each_refused_spelling_as_the_reserved_option(cluster: Cluster, tmp_path: Path,
                                                                   directive: str) -> None:
    with pytest.raises(directives.DirectiveError):
        directives.validate(directive)
    expected = next(o.name for o in directives.options(directive) if o.name in directives.RESERVED)
    names, err = _parsed(tmp_path, directive)
    assert expected in names, f"{directive}: sbatch -v did not show --{expected}:\n{err}"


@pytest.mark.parametrize("directive", ["--exclu", "--ti=5", "--mem-p=1"])
def test_ambiguous_prefixes_are_refused_like_sbatch_refuses_them(cluster: Cluster, tmp_path: Path,
                                                                 directive: str) -> None:
    with pytest.raises(directives.DirectiveError, match="ambiguous"):
        directives.validate(directive)
    _names, err = _parsed(tmp_path, directive)
    assert "is ambiguous" in err, err


@pytest.mark.parametrize(("directive", "name"), [
    ("--constraint=h100", "constraint"), ("--comment='a b'", "comment"), ("--mail-type=END", "mail-type"),
    ("--no-kill", "no-kill"), ("--time-min=5", "time-min"), ("-x node9", "exclude"), ("--constr=h100", "constraint"),
])
def test_sbatch_reads_what_launchgen_lets_through_as_launchgen_does(cluster: Cluster, tmp_path: Path,
                                                                    directive: str, name: str) -> None:
    directives.validate(directive)
    assert [o.name for o in directives.options(directive)] == [name]
    names, err = _parsed(tmp_path, directive)
    assert name in names, err


#: options with a value sbatch 22.05 parses without complaint (so `-v` lists every option of the line)
_VALUES = {
    "account": "a", "array": "1-2", "begin": "now", "chdir": "/tmp", "comment": "x", "cpus-per-task": "2",
    "dependency": "afterok:1", "distribution": "block", "error": "e.out", "export": "ALL", "gpus": "1",
    "gpus-per-node": "1", "gres": "gpu:1", "job-name": "j", "mail-type": "END", "mem": "100", "mem-per-cpu": "10",
    "mincpus": "1", "nice": "0", "nodes": "1", "ntasks": "1", "ntasks-per-node": "1", "open-mode": "append",
    "output": "o.out", "partition": "debug", "priority": "1", "qos": "normal", "signal": "USR1@5", "time": "5",
    "time-min": "2", "tmp": "1", "wckey": "w", "input": "/dev/null", "threads-per-core": "1",
}
_FLAGS = ["contiguous", "exclusive", "hold", "no-kill", "no-requeue", "overcommit", "oversubscribe", "parsable",
          "requeue", "spread-job", "use-min-nodes", "wait", "reboot", "ignore-pbs"]
#: options of newer Slurm releases that 22.05 lacks (they make some prefixes ambiguous only there)
_NEWER = tuple(directives.SINCE)
_SHORT_FOR = {long: short for short, long in directives.SHORT_OPTIONS.items()}


@st.composite
def _option(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(sorted(_VALUES) + _FLAGS))
    value = _VALUES.get(name)
    short = _SHORT_FOR.get(name)
    if short is not None and draw(st.booleans()):
        if value is None:
            return f"-{short}"
        return f"-{short}{value}" if draw(st.booleans()) else f"-{short} {value}"
    cut = draw(st.integers(min_value=2, max_value=len(name)))
    written = name[:cut]
    if value is None:
        return f"--{written}"
    return f"--{written}={value}" if draw(st.booleans()) else f"--{written} {value}"


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_option(), min_size=1, max_size=3))
# found by this test: sbatch refuses two memory options outright (fatal before -v lists anything), so its listing
# holds no --mem although the line has one; launchgen refusing the line is right
@example(parts=["--mem 100", "--mem-per-c 10"])
@example(parts=["--mem-per-cpu=10", "--mem=100"])
def test_parser_agrees_with_sbatch(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
                                   parts: list[str]) -> None:
    """Differential: for generated directive lines (long-option prefixes, attached and separate short values,
    several options a line), launchgen finds exactly the reserved options sbatch parses, refuses exactly the
    lines sbatch calls ambiguous, and refuses every line sbatch refuses."""
    directive = " ".join(parts)
    names, err, refused = _sbatch(tmp_path_factory.mktemp("d"), directive)
    if refused and "is ambiguous" not in err:
        # sbatch lists nothing it would parse: there is no set to compare, only the verdict
        with pytest.raises(directives.DirectiveError):
            directives.validate(directive)
        return
    sbatch_reserved = (names - {"test-only", "verbose"}) & set(directives.RESERVED)
    try:
        mine = {o.name for o in directives.options(directive)} & set(directives.RESERVED)
    except directives.DirectiveError as exc:
        # stricter than this sbatch is fine: a prefix that newer Slurm makes ambiguous, a stray word
        # (`--nice 0`: --nice takes its value only after `=`, so sbatch reads `0` as the script)
        if "is ambiguous" in str(exc):
            assert "is ambiguous" in err or any(f"--{n}" in str(exc) for n in _NEWER), (directive, str(exc), err)
        return
    assert "is ambiguous" not in err, (directive, err)
    assert mine == sbatch_reserved, (directive, err)
    if not mine:
        directives.validate(directive)
    else:
        with pytest.raises(directives.DirectiveError):
            directives.validate(directive)


@pytest.mark.parametrize(("directive", "canonical"), [("--tasks-per-node=2", "--ntasks-per-node=2"),
                                                      ("--ntasks-per-tres=1", "--ntasks-per-gpu=1")])
def test_synonyms_of_reserved_options_are_refused_and_sbatch_reads_them_as_those(
        cluster: Cluster, tmp_path: Path, directive: str, canonical: str) -> None:
    """Issue 37: spellings sbatch documents nowhere but reads as a reserved option: the same listing, or the same
    refusal (--ntasks-per-gpu without GPUs is refused naming --ntasks-per-tres, the field both set)."""
    with pytest.raises(directives.DirectiveError, match="is refused"):
        directives.validate(directive)

    def errors(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("sbatch: error:")]

    names, err, refused = _sbatch(tmp_path, directive)
    _names, canonical_err, canonical_refused = _sbatch(tmp_path, canonical)
    assert refused == canonical_refused and errors(err) == errors(canonical_err), (err, canonical_err)
    assert canonical[2:].split("=")[0] in names or errors(err), err


def _release() -> str:
    return subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=30, check=True).stdout


# `--extra` is left out: on a release before 23.02 getopt reads it as a prefix of --extra-node-info (-B)
@pytest.mark.parametrize("name", sorted(set(directives.SINCE) - {"extra"}))
def test_the_release_table_agrees_with_this_clusters_sbatch(cluster: Cluster, tmp_path: Path, name: str) -> None:
    """Each option the table dates after this cluster's release is refused by its sbatch as unrecognized, each
    older one is not (22.05.8 here: --tres-per-task, --tres-bind, --segment, ... are 'unrecognized option')."""
    written = f"--{name}" if directives.LONG_OPTIONS[name] == "none" else f"--{name}=x"
    release = _release()
    _names, err, _refused = _sbatch(tmp_path, written)
    newer = bool(directives.newer_than(written, release))
    assert ("unrecognized option" in err) == newer, (name, release, err)


@pytest.mark.parametrize("directive", ["-F two", "--nodefile=five", "--nodef five", "-w ./five", "-F ./two"])
def test_node_files_are_counted_as_sbatch_counts_them(cluster: Cluster, tmp_path: Path, directive: str) -> None:
    """LG814 reads -F/--nodefile (and a -w value with a `/`) as sbatch does: this cluster's sbatch, asked for
    the plan's 2 nodes, refuses the 5-node file (`invalid number of nodes`) and takes the 2-node one."""
    (tmp_path / "two").write_text("node1\nnode2\n")
    (tmp_path / "five").write_text("node[1-3]\nnode4 node5\n")
    [(_written, path)] = list(directives.nodefiles(directive))
    count = directives.node_count_of_file((tmp_path / path).read_text())
    _names, err, refused = _sbatch(tmp_path, f"{directive}\n#SBATCH -N 2")
    assert refused == (count != 2), (count, err)
