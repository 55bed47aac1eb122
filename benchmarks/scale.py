"""`launchgen check` and `render` at scale: wall seconds, peak memory and script size by trainer node count.

examples/multi-node-70b.yaml (8-GPU trainer nodes, one TP=8 server node) with train.nodes set to each count;
each command runs as its own process (the best of --repeat runs, so a busy machine's noise drops out), its peak
resident memory read from the kernel's accounting of the finished child. Prints a markdown table and writes JSON
to --out.

    python benchmarks/scale.py --out scale.json                 # 64, 1,024, 4,096, 16,384, 65,536 nodes
    python benchmarks/scale.py --nodes 64 4096 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from launchgen.input.bounds import MAX_NODES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "multi-node-70b.yaml"


def _launchgen() -> str:
    beside = Path(sys.executable).with_name("launchgen")
    found = str(beside) if beside.exists() else shutil.which("launchgen")
    if found is None:
        raise SystemExit("launchgen is not installed beside this python nor on PATH")
    return found


def _run(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one command; it must succeed."""
    # a fresh process for each measurement: its RSS is that child's alone (ru_maxrss of the waited child)
    code = ("import resource, subprocess, sys, time\n"
            "t = time.monotonic(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "w = time.monotonic() - t\n"
            "if p.returncode: sys.exit(p.stderr[-2000:])\n"
            "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True, check=False)
    if p.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{p.stderr}")
    wall, kib = p.stdout.split()
    return float(wall), int(kib) / 1024


def measure(nodes: int, repeat: int, work: Path) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    # the job's nodes are bounded (MAX_NODES, LG108): the bound's row trains on all nodes but the server's
    nodes = min(nodes, MAX_NODES - data["vllm"]["nodes"])
    data["train"]["nodes"] = nodes
    spec = work / f"nodes-{nodes}.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    script = work / f"nodes-{nodes}.sbatch"
    lg = _launchgen()
    row: dict[str, Any] = {"nodes": nodes, "gpus": nodes * data["slurm"]["gpus_per_node"]}
    for verb, argv in (("check", [lg, "check", "--no-files", str(spec)]),
                       ("render", [lg, "render", str(spec), "-o", str(script), "--force"])):
        runs = [_run(argv, work) for _ in range(repeat)]
        row[f"{verb}_s"] = round(min(r[0] for r in runs), 2)
        row[f"{verb}_mib"] = round(min(r[1] for r in runs), 1)
    row["script_mib"] = round(script.stat().st_size / 2**20, 3)
    row["script_bytes"] = script.stat().st_size
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[64, 1024, 4096, 16384, MAX_NODES])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="launchgen-scale-") as tmp:
        rows = [measure(n, args.repeat, Path(tmp)) for n in args.nodes]
    print(f"launchgen check / render of examples/multi-node-70b.yaml by train.nodes ({os.cpu_count()} CPUs, best "
          f"of {args.repeat})\n")
    print("| trainer nodes | GPUs | check s | check MiB | render s | render MiB | script bytes |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['nodes']:,} | {r['gpus']:,} | {r['check_s']} | {r['check_mib']} | {r['render_s']} | "
              f"{r['render_mib']} | {r['script_bytes']:,} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
