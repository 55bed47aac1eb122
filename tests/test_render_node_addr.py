"""`lg_node_addr` of the rendered sbatch steps (issue 17): loopback answers are skipped, and a node that resolves
only to loopback while the job's other nodes resolve elsewhere fails with a message naming vllm.bind. A fake
`getent` (first on PATH) answers from a table, as /etc/hosts + DNS would on the nodes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from render_cases import plan_for

from launchgen.script.render import render_script

FAKE_GETENT = """#!/bin/bash
# getent ahostsv4 NAME: one "ADDR STREAM NAME" line per address in $FAKE_HOSTS ("name=a1,a2;name2=..."); 2 if none
[[ $1 == ahostsv4 ]] || exit 1
IFS=';' read -r -a entries <<<"$FAKE_HOSTS"
for e in "${entries[@]}"; do
  if [[ ${e%%=*} == "$2" ]]; then
    IFS=',' read -r -a addrs <<<"${e#*=}"
    for a in "${addrs[@]}"; do printf '%s STREAM %s\\n%s DGRAM\\n' "$a" "$2" "$a"; done
    exit 0
  fi
done
exit 2
"""


@pytest.fixture(scope="module")
def lg_node_addr() -> str:
    """The function as the multi-node example's server step defines it."""
    text = render_script(plan_for("multi-node-70b"), "sbatch")
    m = re.search(r"^lg_node_addr\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert m, "no lg_node_addr in the rendered server step"
    return m.group(0)


def _resolve(tmp_path: Path, fn: str, node: str, hosts: str, nodes: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "getent").write_text(FAKE_GETENT)
    (bin_dir / "getent").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_HOSTS=hosts, LG_NODE_LIST=nodes)
    script = f"set -euo pipefail\n{fn}\nlg_node_addr {node}\n"
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_loopback_answers_are_skipped(tmp_path: Path, lg_node_addr: str) -> None:
    r = _resolve(tmp_path, lg_node_addr, "gpu1", "gpu1=127.0.1.1,10.1.0.1;gpu2=10.1.0.2", "gpu1 gpu2")
    assert r.returncode == 0 and r.stdout.strip() == "10.1.0.1", r.stderr


def test_debian_127_0_1_1_on_a_multi_node_job_fails_naming_vllm_bind(tmp_path: Path, lg_node_addr: str) -> None:
    r = _resolve(tmp_path, lg_node_addr, "gpu1", "gpu1=127.0.1.1;gpu2=10.1.0.2", "gpu1 gpu2")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "127.0.1.1" in r.stderr and "vllm.bind" in r.stderr and "gpu2 is at 10.1.0.2" in r.stderr, r.stderr


@pytest.mark.parametrize(("hosts", "nodes"), [
    ("gpu1=127.0.1.1", "gpu1"),  # one node: loopback reaches everything
    ("node1=127.0.0.1;node2=127.0.0.1", "node1 node2"),  # every node on this host (a one-machine cluster)
])
def test_loopback_is_kept_where_every_node_is_here(tmp_path: Path, lg_node_addr: str, hosts: str, nodes: str) -> None:
    node = nodes.split()[0]
    r = _resolve(tmp_path, lg_node_addr, node, hosts, nodes)
    assert r.returncode == 0 and r.stdout.strip().startswith("127."), r.stderr


def test_an_unknown_name_fails_clearly(tmp_path: Path, lg_node_addr: str) -> None:
    r = _resolve(tmp_path, lg_node_addr, "ghost", "gpu2=10.1.0.2", "ghost gpu2")
    assert r.returncode == 1 and "cannot resolve node ghost" in r.stderr and "vllm.bind" in r.stderr
