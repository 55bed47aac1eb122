"""The premise of launchgen.directives, checked against the real sbatch: the spellings it refuses are read by
sbatch as the reserved option (`sbatch -v --test-only` lists the options it parsed), and the ordinary directives
it lets through are accepted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurmkit import Cluster

from launchgen import directives

pytestmark = pytest.mark.slurm

BYPASSES = ["-N3", "-pdebug", "--signa=USR1@5", "--no-req", "--partit=debug", "--outp=x.out", "-c4", "-HN3",
            "--ntasks-per-node=1", "-o/dev/null", "--mem=100", "--chdir=/tmp", "--exclus"]


def _parsed(tmp_path: Path, directive: str) -> tuple[set[str], str]:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH {directive}\ntrue\n")
    r = subprocess.run(["sbatch", "-v", "--test-only", str(script)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    # `sbatch: <option> : <value>` lines, in sbatch's own names (cpus_per_task, no-requeue)
    names = {ln[8:].split(":", 1)[0].strip().replace("_", "-") for ln in r.stderr.splitlines()
             if ln.startswith("sbatch: ") and ":" in ln[8:]}
    return names, r.stderr


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
