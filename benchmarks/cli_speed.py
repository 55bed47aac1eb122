"""Start-up cost of the CLI on a login node: every verb against `python -c pass`, in one run.

    python benchmarks/cli_speed.py examples/SPEC.yaml [--runs 7] [--nodes 64] [--job-dir DIR]

The spec is copied with its node counts edited so the job spans `--nodes` nodes: `train.nodes` becomes
`nodes - vllm.nodes` (the dedicated server nodes stay as they are); a spec without a `train` section has every
`nodes` field it holds set to `--nodes`. The verbs that read a job directory (`status`, `logs`, `report`) run on
`--job-dir` (default: `launchgen-runs/local`, what `bash examples/quickstart.sh` leaves) and are left out, saying
so, when there is none. `--compare CLI` times a second CLI (an older checkout) in the same runs. Each command
runs `--runs` times in fresh processes, interleaved (baseline, then every verb, then the baseline again, ...) so
drift hits all of them; the table gives the medians and the ratios to the baseline (target: <= 15x for every
verb, `--help` near 5x). The warm-up run of each command writes the bytecode
cache even where PYTHONDONTWRITEBYTECODE is set, as an installed launchgen has it; the timed runs read it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml


def _set_all_nodes(obj: Any, nodes: int) -> int:
    hits = 0
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "nodes" and isinstance(v, int) and not isinstance(v, bool):
                obj[k] = nodes
                hits += 1
            else:
                hits += _set_all_nodes(v, nodes)
    elif isinstance(obj, list):
        for v in obj:
            hits += _set_all_nodes(v, nodes)
    return hits


def scale_spec(src: Path, dst: Path, nodes: int) -> int:
    """Write `src` with `nodes` nodes in total to `dst`; returns the trainer node count written."""
    spec = yaml.safe_load(src.read_text())
    if not isinstance(spec, dict):
        raise SystemExit(f"{src}: expected a mapping at the top level")
    train = spec.get("train")
    if isinstance(train, dict):
        vllm = spec.get("vllm") if isinstance(spec.get("vllm"), dict) else {}
        server = int(vllm.get("nodes", 0) or 0) if isinstance(vllm, dict) else 0
        if server >= nodes:
            raise SystemExit(f"{src}: vllm.nodes ({server}) leaves no trainer node out of {nodes}")
        train["nodes"] = nodes - server
        written = nodes - server
    elif _set_all_nodes(spec, nodes) == 0:
        raise SystemExit(f"{src}: no `nodes` field to scale (expected train.nodes)")
    else:
        written = nodes
    dst.write_text(yaml.safe_dump(spec, sort_keys=False))
    return written


def _has_verb(lg: list[str], verb: str) -> bool:
    r = subprocess.run([*lg, verb, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def time_cmd(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    dt = time.perf_counter() - t
    # `status` of a local run that did not complete exits 3 (EXIT_STATUS_JOB_FAILED); it still did its work
    if r.returncode not in (0, 3):
        raise SystemExit(f"`{shlex.join(argv)}` exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return dt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", type=Path, help="a launchgen spec (YAML), e.g. one from examples/")
    p.add_argument("--runs", type=int, default=7, help="runs per command (median; >= 5)")
    p.add_argument("--nodes", type=int, default=64)
    # The console script beside this interpreter, not a version-manager shim (pyenv's adds ~100 ms of bash).
    beside = Path(sys.executable).parent / "launchgen"
    default_cli = str(beside) if beside.exists() else (shutil.which("launchgen") or "launchgen")
    p.add_argument("--launchgen", default=default_cli,
                   help="how to start the CLI (default: the console script installed beside this python)")
    p.add_argument("--render-args", default="--force -o {out}",
                   help="arguments after `render SPEC`; {out} is a script path in a temporary directory")
    p.add_argument("--job-dir", type=Path, default=Path("launchgen-runs/local"),
                   help="a job directory for status, logs and report (default: the quickstart's)")
    p.add_argument("--compare", default=None,
                   help="a second CLI (e.g. an older checkout's) timed in the same interleaved runs, its rows "
                   "marked [compare]: before/after ratios from one run")
    a = p.parse_args(argv)
    if a.runs < 5:
        p.error("--runs must be >= 5")

    with tempfile.TemporaryDirectory(prefix="cli-speed-") as tmp:
        spec = Path(tmp) / f"spec-{a.nodes}-nodes.yaml"
        trainer_nodes = scale_spec(a.spec, spec, a.nodes)
        out_dir = Path(tmp) / "job.sbatch"
        cmds = {"python -c pass": [sys.executable, "-c", "pass"]}
        clis = [("", shlex.split(a.launchgen))]
        if a.compare:
            clis.append((" [compare]", shlex.split(a.compare)))
        job = str(a.job_dir)
        has_job = (a.job_dir / "logs").is_dir()
        if not has_job:
            print(f"no job directory at {job}: status, logs and report are not timed (run "
                  "`bash examples/quickstart.sh` first, or pass --job-dir)")
        for tag, lg in clis:
            cmds.update({
                f"launchgen --help{tag}": [*lg, "--help"],
                f"launchgen init{tag}": [*lg, "init", "-"],
                f"launchgen check{tag}": [*lg, "check", str(spec)],
                f"launchgen plan{tag}": [*lg, "plan", str(spec)],
                f"launchgen render{tag}": [*lg, "render", str(spec),
                                           *shlex.split(a.render_args.format(out=out_dir))],
                f"launchgen schema{tag}": [*lg, "schema"],
            })
            if has_job:
                cmds[f"launchgen status{tag}"] = [*lg, "status", "local", "--job-dir", job]
                cmds[f"launchgen logs{tag}"] = [*lg, "logs", "local", "--job-dir", job, "--role", "trainer"]
                if _has_verb(lg, "report"):
                    cmds[f"launchgen report{tag}"] = [*lg, "report", job, "-o", str(Path(tmp) / "report.html")]
        # Warm the page cache, surface errors, and write the bytecode a login node's install has (pip compiles it;
        # an editable checkout writes it on its first run): with PYTHONDONTWRITEBYTECODE set (CI, containers) and
        # no __pycache__, every timed run would compile every launchgen module from source.
        warm_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        for argv_ in cmds.values():
            time_cmd(argv_, warm_env)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(a.runs):
            for k, argv_ in cmds.items():
                times[k].append(time_cmd(argv_))

    base = statistics.median(times["python -c pass"])
    print(f"spec: {a.spec} scaled to {a.nodes} nodes ({trainer_nodes} trainer); {a.runs} runs each, interleaved")
    print("| command | median ms | min ms | max ms | x python -c pass |")
    print("|---|---|---|---|---|")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{k}` | {1e3 * med:.1f} | {1e3 * min(ts):.1f} | {1e3 * max(ts):.1f} | {med / base:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
