"""The in-allocation preflight: probes run on every node of the job before any model loads (issue 25).

The job script writes this file's source into `$LG_JOB_DIR/steps/preflight.py` and runs it with the node's
`python3`, once per node at the same time (one srun step over every node; under `--bash`, once), after
`slurm.setup` and before the server and trainer steps start. Standard library only: the server nodes have vLLM's
environment, not necessarily launchgen's. It reads the attempt's run record (`launchgen-plan.json`: node names,
ports with this attempt's values, the server's argv) and checks, on this node:

* PF101 a port this node will bind is free (the server's HTTP port on a server leader, trainer rank 0's weight-sync
  `group_port`), and PF102 every peer reaches it: each trainer node connects to each server's HTTP port and each
  server node connects to trainer rank 0's group port, on the addresses and ports the job will use, while nothing
  else binds them (a TCP probe both ways: each node listens on what it will bind and connects to what it will reach);
* PF103 the installed `vllm` accepts every flag the server's command passes it (`<vllm> serve --help=all`);
* PF104 each GPU position the plan gives a role on this node exists in the step's CUDA_VISIBLE_DEVICES (or among
  the node's devices when it is unset);
* PF105 the trainer's output directory is writable and its file system has room for one checkpoint (the size of
  the model's weight files);
* PF106 with HF_HUB_OFFLINE set, the model is readable here without the network (a local directory with its
  config.json, or a snapshot in the HF cache).

Each node writes `preflight-<node>.json` into the attempt's log folder and prints one line per failure; it exits 0
when everything passed, 3 otherwise. The codes are stable: `launchgen status` shows them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CODES = {
    "PF101": "a port this node must bind is in use",
    "PF102": "a peer could not reach a port it will use (TCP probe)",
    "PF103": "the installed vllm does not accept a flag the server command passes",
    "PF104": "a GPU position of the plan is not visible on this node",
    "PF105": "the output directory is not writable or has no room for a checkpoint",
    "PF106": "the model is not readable offline (HF_HUB_OFFLINE is set)",
}
#: Exit status of a node whose probes failed (2 is the trainers' config error, 1 a generic failure).
EXIT_FAILED = 3
#: The TCP probes give up after this many seconds (peers start their step within a second of each other).
TCP_WINDOW_S = 10.0
#: `vllm serve --help=all` imports vLLM (seconds on a warm node): beyond this the flags go unchecked (a note).
HELP_TIMEOUT_S = 60.0
#: The job script's bound on the whole preflight step (srun's own start included).
STEP_TIMEOUT_S = 90


def source() -> str:
    """This module's text: the job script writes it into the job directory and runs it on the nodes."""
    return Path(__file__).read_text(encoding="utf-8")


def _addr(host: str) -> str:
    """host -> an IPv4 address, skipping loopback where the name has another (as the job script's lg_node_addr)."""
    try:
        answers = [str(a[4][0]) for a in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)]
    except OSError:
        return host
    return next((a for a in answers if not a.startswith("127.")), answers[0] if answers else host)


def tcp_probes(listen: list[tuple[str, str, int]], reach: list[tuple[str, str, int]], expect: int,
               window: float = TCP_WINDOW_S) -> list[tuple[str, str]]:
    """Bind each (what, host, port) of `listen`, connect to each of `reach` until it answers or the window ends,
    and keep accepting until `expect` peers connected to each listener (or the window ends). -> failures."""
    failures: list[tuple[str, str]] = []
    servers: list[tuple[str, socket.socket]] = []
    for what, host, port in listen:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # as the servers that will bind it (uvicorn, torch's store): a previous run's connections in TIME_WAIT do
        # not count as in use, a live listener still does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((_addr(host), port))
            s.listen(64)
            s.setblocking(False)
            servers.append((what, s))
        except OSError as exc:
            s.close()
            failures.append(("PF101", f"{what}: cannot bind {host}:{port} ({exc.strerror}): another process "
                                      "holds it; the job would fail there after loading"))
    deadline = time.monotonic() + window
    pending = list(reach)
    accepted = {what: 0 for what, _ in servers}
    while time.monotonic() < deadline and (pending or any(accepted[w] < expect for w, _ in servers)):
        for what, s in servers:
            try:
                while True:
                    conn, _ = s.accept()
                    conn.close()
                    accepted[what] += 1
            except (BlockingIOError, OSError):
                pass
        for item in list(pending):
            _what, host, port = item
            try:
                with socket.create_connection((_addr(host), port), timeout=1.0):
                    pending.remove(item)
            except OSError:
                pass
        time.sleep(0.1)
    for what, host, port in pending:
        failures.append(("PF102", f"{what}: {host}:{port} did not accept a connection from "
                                  f"{socket.gethostname()} within {window:g} s (a firewall, a wrong address, or the "
                                  "peer's preflight failed)"))
    for _, s in servers:
        s.close()
    return failures


_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_.-]*")


def vllm_flags(argv: list[str], run: Callable[[list[str]], str | None]) -> tuple[list[tuple[str, str]], list[str]]:
    """(failures, notes) for the server command `argv` (`... serve MODEL --flag ...`): every `--flag` must be in
    `<executable> serve --help=all`, which `run` returns (None: it could not be run)."""
    if "serve" not in argv:
        return [], []
    cut = argv.index("serve")
    text = run([*argv[:cut], "serve", "--help=all"])
    if text is None:
        return [], [f"could not run `{' '.join(argv[:cut])} serve --help=all` within {HELP_TIMEOUT_S:g} s: the "
                    "server's flags were not checked"]
    known = {f.rstrip(".").replace("_", "-") for f in _FLAG.findall(text)}
    if "--port" not in known:  # not vLLM's help (a wrapper without --help=all): nothing to compare with
        return [], [f"`{' '.join(argv[:cut])} serve --help=all` listed no vLLM flags: the server's flags were not "
                    "checked"]
    wanted = [w.split("=", 1)[0] for w in argv[cut + 1:] if w.startswith("--")]
    missing = [w for w in wanted if w.replace("_", "-") not in known]
    return [("PF103", f"the installed vllm ({argv[0]}) does not know {w}: the server would exit at start")
            for w in missing], []


def visible_gpus(env: dict[str, str]) -> int | None:
    """How many devices this step sees: CUDA_VISIBLE_DEVICES when set, else the node's NVIDIA device files; None
    when neither says (no NVIDIA driver here: a CPU machine or another vendor's devices)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip()])
    return len(glob.glob("/dev/nvidia[0-9]*")) or None


def weight_bytes(model: str, env: dict[str, str]) -> int | None:
    """Size of the model's weight files (a local directory or its HF cache snapshot); None where unknown."""
    d = model_dir(model, env)
    if d is None:
        return None
    return sum(f.stat().st_size for pat in ("*.safetensors", "*.bin", "*.pt") for f in d.glob(pat) if f.is_file())


def model_dir(model: str, env: dict[str, str]) -> Path | None:
    p = Path(os.path.expanduser(model))
    if p.is_dir():
        return p
    if model.count("/") != 1:
        return None
    hub = env.get("HF_HUB_CACHE") or os.path.join(env.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"),
                                                  "hub")
    snaps = sorted(Path(hub, "models--" + model.replace("/", "--"), "snapshots").glob("*/config.json"))
    return snaps[-1].parent if snaps else None


def output_dir(path: str, need: int | None) -> list[tuple[str, str]]:
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".launchgen-preflight-{socket.gethostname()}-{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        return [("PF105", f"the output directory {d} is not writable here ({exc.strerror})")]
    free = shutil.disk_usage(d).free
    if need is not None and free < need:
        return [("PF105", f"the output directory {d} has {free >> 20} MiB free; one checkpoint needs about "
                          f"{need >> 20} MiB (the model's weights)")]
    return []


def offline_model(model: str, env: dict[str, str]) -> list[tuple[str, str]]:
    if env.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return []
    d = model_dir(model, env)
    if d is None or not os.access(d / "config.json", os.R_OK):
        return [("PF106", f"HF_HUB_OFFLINE is set and the model {model} is neither a readable local directory nor "
                          "in the HF cache here (HF_HUB_CACHE / HF_HOME): loading would fail")]
    return []


def _run_help(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout + p.stderr if p.returncode == 0 else None


def node_probes(record: dict[str, Any], node: str, model: str, env: dict[str, str]) -> dict[str, Any]:
    """Every probe of this node, from the attempt's run record."""
    started = time.monotonic()
    me = next(n for n in record["nodes"] if n["name"] == node)
    # under --bash every role is on this machine, over loopback (the node is named `local`)
    names = {n["position"]: (n["name"] if record.get("scheduler") == "sbatch" else "127.0.0.1")
             for n in record["nodes"]}
    servers = [n for n in record["nodes"] if "server" in n["roles"]]
    trainers = [n for n in record["nodes"] if "trainer" in n["roles"]]
    listen: list[tuple[str, str, int]] = []
    reach: list[tuple[str, str, int]] = []
    expect = 0
    for port in record["ports"]:
        host = names[port["host_position"]]
        if port["name"] == "server_http":
            server_host = record.get("server_host") or host
            if port["host_position"] == me["position"]:
                listen.append((f"vllm.port (server_http, {port['spec_path']})", server_host, port["value"]))
                expect = max(expect, len(trainers))
            if "trainer" in me["roles"]:
                reach.append((f"the server's HTTP port ({port['spec_path']})", server_host, port["value"]))
        elif port["name"] == "group":
            if port["host_position"] == me["position"] and "trainer" in me["roles"]:
                listen.append((f"vllm.group_port (the weight-sync rendezvous on trainer rank 0, {port['spec_path']})",
                               host, port["value"]))
                expect = max(expect, len(servers))
            if "server" in me["roles"]:
                reach.append((f"trainer rank 0's weight-sync port ({port['spec_path']})", host, port["value"]))
    # `serve --help=all` imports vLLM (the slow probe: ~10 s on a quiet node, more on a loaded one): it runs while
    # the TCP probes wait for their peers
    flags: list[tuple[list[tuple[str, str]], list[str]]] = []
    argv = (record.get("server") or {}).get("argv") or []
    helper = None
    if "server" in me["roles"] and me.get("server_rank") == 0 and argv:
        cmd = [os.path.expandvars(w) for w in argv[0]]
        helper = threading.Thread(target=lambda: flags.append(vllm_flags(cmd, _run_help)), daemon=True)
        helper.start()
    failures = tcp_probes(listen, reach, expect)
    notes: list[str] = []
    if helper is not None:
        helper.join(HELP_TIMEOUT_S + 5)
        for f, n in flags:
            failures += f
            notes += n
    gpus = visible_gpus(env)
    wanted = {role: me.get(f"{role}_gpus") or [] for role in me["roles"]}
    if gpus is None and any(wanted.values()):
        notes.append("CUDA_VISIBLE_DEVICES is unset and there is no /dev/nvidia*: GPU visibility not checked")
    for role, positions in wanted.items():
        missing = [g for g in positions if gpus is not None and g >= gpus]
        if missing:
            failures.append(("PF104", f"the {role}'s GPU position(s) {missing} are not visible on {node}: it sees "
                                      f"{gpus} device(s) (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')})"))
    if "trainer" in me["roles"]:
        failures += output_dir(os.path.join(record["job_dir"], record["layout"]["trainer_output_dir"]),
                               weight_bytes(model, env))
    failures += offline_model(model, env)
    return {"node": node, "ok": not failures, "failures": [{"code": c, "message": m} for c, m in failures],
            "notes": notes, "seconds": round(time.monotonic() - started, 2)}


def main(argv: list[str]) -> int:
    """preflight.py RECORD NODE MODEL OUT_JSON"""
    record_path, node, model, out = argv
    record = json.loads(Path(record_path).read_text())
    result = node_probes(record, node, model, dict(os.environ))
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for f in result["failures"]:
        print(f"launchgen: preflight {f['code']} on {node}: {f['message']}", file=sys.stderr)
    for n in result["notes"]:
        print(f"launchgen: preflight note on {node}: {n}", file=sys.stderr)
    return 0 if result["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
