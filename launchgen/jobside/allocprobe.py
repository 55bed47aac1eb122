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
* PF103 the installed `vllm` accepts every flag the server's command passes it: the installed release is read from
  package metadata by the server's interpreter (no vLLM import) and its row of launchgen's flag table
  (compat.vllm_serve_flag_table, rendered into `steps/preflight.json`) decides; a release without a row, or a server
  command whose interpreter cannot be told (a wrapper script, a container), runs `<vllm> serve --help=all` instead
  (it imports vLLM: 10-50 s);
* PF107 the installed vLLM has the routes launchgen's client calls, as of its release (each route's path is looked
  for in the installed `vllm/entrypoints` source, where vLLM declares its routes: nothing starts), and the
  weight-transfer engine's vllm.general_plugins entry point is registered where the server uses gloo;
* PF104 each GPU position the plan gives a role on this node exists in the step's CUDA_VISIBLE_DEVICES (or among
  the node's devices when it is unset);
* PF105 the trainer's output directory is writable and its file system has room for one checkpoint (full
  fine-tuning: the parameter count read off the model's weight files and config.json's dtype, times the bytes of
  weights and AdamW state per parameter the plan gives; else the size of the weight files);
* PF106 with HF_HUB_OFFLINE set, the model is readable here without the network (a local directory with its
  config.json, or a snapshot in the HF cache);
* PF108 where a role on this node asks for bf16 on GPUs, each of its GPUs has compute capability >= 8.0
  (`nvidia-smi`; without it, a note);
* PF109 every command a role of this node runs is on PATH (after `slurm.setup`: `accelerate`, `vllm`, a container
  runtime), and the trainer's Python (the interpreter of its `accelerate`) finds `launchgen.jobside.rank`, the trainer's
  module and, for TRL's trainers, `trl` (`importlib.util.find_spec`: nothing is imported). Without it a job whose
  environment is not active passes every other probe and ends minutes later with status 127 or a
  ModuleNotFoundError in the trainer's log;
* PF110 the model's config.json, where there is one, is a regular file; every file the probes read is opened
  without blocking and read only where it is one (a FIFO would hold the step for its bound).

PF103's and PF107's probes, and the non-blocking read, are in launchgen.jobside.vllmprobe, which the job script
writes beside this file as `steps/vllmprobe.py` (this program imports it from there on the nodes).

Each node writes `preflight-<node>.json` into the attempt's log folder and prints one line per failure; it exits 0
when everything passed, 3 otherwise. The codes are stable: `launchgen status` shows them.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__:
    from launchgen.jobside import vllmprobe
else:  # run as steps/preflight.py on a node, where launchgen need not be installed: its sibling steps/vllmprobe.py
    import vllmprobe  # type: ignore[no-redef]

CODES = {
    "PF101": "a port this node must bind is in use",
    "PF102": "a peer could not reach a port it will use (TCP probe)",
    "PF103": "the installed vllm does not accept a flag the server command passes",
    "PF104": "a GPU position of the plan is not visible on this node",
    "PF105": "the output directory is not writable or has no room for a checkpoint",
    "PF106": "the model is not readable offline (HF_HUB_OFFLINE is set)",
    "PF107": "the installed vllm lacks a route the client calls, or the weight-transfer engine's plugin",
    "PF108": "a GPU of a role that asks for bf16 cannot run it (compute capability < 8.0)",
    "PF109": "a command a role runs is not on PATH, or the trainer's Python cannot import launchgen or trl",
    "PF110": "a file the spec names (the model's config.json) is not a regular file (a FIFO, a directory, a device)",
}
#: Exit status of a node whose probes failed (2 is the trainers' config error, 1 a generic failure).
EXIT_FAILED = 3
#: The TCP probes give up after this many seconds (peers start their step within a second of each other).
TCP_WINDOW_S = 10.0
#: The job script's bound on the whole preflight step (srun's own start included).
STEP_TIMEOUT_S = 90


#: The preflight program's files in the job directory (the job script writes each and runs the first on the nodes),
#: and the source file each is, verbatim.
PROGRAM = {"steps/preflight.py": Path(__file__), "steps/vllmprobe.py": Path(__file__).with_name("vllmprobe.py")}


def sources() -> dict[str, str]:
    """PROGRAM's files: job-directory path -> text."""
    return {name: path.read_text(encoding="utf-8") for name, path in PROGRAM.items()}


def _addr(host: str) -> str:
    """host -> an IPv4 address, skipping loopback where the name has another (as the job script's lg_node_addr)."""
    try:
        answers = [str(a[4][0]) for a in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)]
    except OSError:
        return host
    return next((a for a in answers if not a.startswith("127.")), answers[0] if answers else host)


def tcp_probes(listen: list[tuple[str, str, int]], reach: list[tuple[str, str, int]], expect: int | dict[str, int],
               window: float = TCP_WINDOW_S) -> list[tuple[str, str]]:
    """Bind each (what, host, port) of `listen`, connect to each of `reach` until it answers or the window ends,
    and keep accepting until `expect` peers (or `expect[what]`) connected to each listener (or the window
    ends). -> failures."""
    need = expect if isinstance(expect, dict) else {what: expect for what, _, _ in listen}
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
    while time.monotonic() < deadline and (pending or any(accepted[w] < need.get(w, 0) for w, _ in servers)):
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


def bf16_gpus(roles: list[str], positions: dict[str, list[int]], env: dict[str, str],
              query: Callable[[], str | None]) -> tuple[list[tuple[str, str]], list[str]]:
    """PF108 for each role of `roles` (those asking for bf16 on GPUs) whose GPU positions map to a device of
    compute capability < 8.0. `query` returns `nvidia-smi --query-gpu=index,uuid,compute_cap,name` CSV (None: it
    could not run: a note, never a failure, so a machine without NVIDIA GPUs passes)."""
    asked = [r for r in roles if positions.get(r)]
    if not asked:
        return [], []
    text = query()
    if text is None:
        return [], [f"nvidia-smi could not run: bf16 support of the {'/'.join(asked)} GPUs not checked"]
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.count(",") >= 3]
    cvd = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    failures: list[tuple[str, str]] = []
    for role in asked:
        bad = []
        for pos in positions[role]:
            ident = cvd[pos] if pos < len(cvd) else (str(pos) if not cvd else None)
            row = next((r for r in rows if ident is not None and ident in (r[0], r[1])), None)
            if row is None:
                continue  # not visible: PF104's
            try:
                cap = float(row[2])
            except ValueError:
                continue
            if cap < 8.0:
                bad.append(f"position {pos}: {', '.join(row[3:])} (compute capability {row[2]})")
        if bad:
            failures.append(("PF108", f"the {role} asks for bf16, which needs compute capability >= 8.0 (Ampere+): "
                                      + "; ".join(bad) + " (use fp16 / float16 on these GPUs)"))
    return failures, []


def _nvidia_smi() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,compute_cap,name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


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
    return None if d is None else _weight_files_bytes(d)


def _weight_files_bytes(d: Path) -> int:
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


#: Bytes per parameter of a weight file's dtype (config.json's `torch_dtype` / `dtype`; 2 where it says none).
_FILE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def checkpoint_need(model: str, env: dict[str, str], per_param: int | None) -> tuple[int | None, str]:
    """Bytes one checkpoint takes, and what that figure is, from the model's files here; (None, "") if unknown."""
    d = model_dir(model, env)
    if d is None or not (size := _weight_files_bytes(d)):
        return None, ""
    if per_param is None:
        return size, "the model's weights"
    dtype = None
    try:
        config = json.loads(vllmprobe.regular_text(d / "config.json") or "")
        dtype = config.get("torch_dtype") or config.get("dtype")
    except (ValueError, AttributeError):  # no config.json (or not a file: PF110), not JSON, not an object
        pass
    params = size // _FILE_DTYPE_BYTES.get(str(dtype), 2)
    return params * per_param, f"~{params / 1e9:.2f} B parameters x {per_param} bytes of weights and AdamW state"


def model_files(model: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """PF110: the model's config.json is there but not a regular file (transformers and vLLM would block on a
    FIFO or fail on a directory when they load it)."""
    d = model_dir(model, env)
    try:
        mode = os.stat(d / "config.json").st_mode if d is not None else stat.S_IFREG
    except OSError:
        return []
    if stat.S_ISREG(mode):
        return []
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    return [("PF110", f"the model's {d}/config.json is {kind}: loading the model would block or fail")]


def output_dir(path: str, need: int | None, what: str = "the model's weights") -> list[tuple[str, str]]:
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
                          f"{need >> 20} MiB ({what})")]
    return []


def offline_model(model: str, env: dict[str, str]) -> list[tuple[str, str]]:
    if env.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return []
    d = model_dir(model, env)
    if d is None or not os.access(d / "config.json", os.R_OK):
        return [("PF106", f"HF_HUB_OFFLINE is set and the model {model} is neither a readable local directory nor "
                          "in the HF cache here (HF_HUB_CACHE / HF_HOME): loading would fail")]
    return []


#: Run by the trainer's interpreter: which of the modules in argv it cannot find (find_spec imports only parents).
_FIND_PY = """
import importlib.util as u, json, sys
missing = []
for name in sys.argv[1:]:
    try:
        found = u.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(name)
print(json.dumps(missing))
"""
_SETUP_FIX = "activate the job's environment in slurm.setup (e.g. `source /path/to/venv/bin/activate`)"


def missing_modules(python: str, modules: list[str]) -> list[str] | None:
    """The modules `python` cannot find; None when it cannot be asked."""
    try:
        p = subprocess.run([python, "-c", _FIND_PY, *modules], capture_output=True, text=True,
                           timeout=vllmprobe.META_TIMEOUT_S, stdin=subprocess.DEVNULL)
        out = json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return [str(m) for m in out] if isinstance(out, list) else None


def command_probes(record: dict[str, Any], roles: list[str], env: dict[str, str], facts: dict[str, Any], *,
                   find: Callable[[str, list[str]], list[str] | None] = missing_modules) -> list[tuple[str, str]]:
    """PF109 for the commands the roles of this node run (a role inside a pyxis image is the image's business)."""
    path = env.get("PATH", "")
    commands: list[tuple[str, list[str], list[str]]] = []
    if "trainer" in roles and not facts.get("trainer_image"):
        commands.append(("trainer", (record.get("trainer") or {}).get("argv") or [],
                         list(facts.get("trainer_modules") or [])))
    server = (record.get("server") or {}).get("argv") or []
    if "server" in roles and server and not facts.get("server_image"):
        commands.append(("server", server[0], []))
    failures: list[tuple[str, str]] = []
    for role, argv, modules in commands:
        if not argv:
            continue
        word = os.path.expandvars(argv[0])
        exe = shutil.which(word, path=path)
        if exe is None:
            shown = path if len(path) <= 160 else path[:157] + "..."
            failures.append(("PF109", f"the {role} runs `{word}`, which is not on PATH here (PATH={shown}): "
                                      f"{_SETUP_FIX}, or install it"))
            continue
        python = vllmprobe.server_python([exe])
        missing = find(python, modules) if python is not None and modules else None
        if missing:
            failures.append(("PF109", f"the {role}'s Python ({python}, which `{word}` runs) cannot import "
                                      f"{', '.join(missing)}: {_SETUP_FIX}, or install launchgen"
                                      + ("[train,trl]" if "trl" in modules else "[train]") + " there"))
    return failures


def node_probes(record: dict[str, Any], node: str, model: str, env: dict[str, str],
                facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every probe of this node, from the attempt's run record and the rendered facts (steps/preflight.json)."""
    facts = facts or {}
    started = time.monotonic()
    me = next(n for n in record["nodes"] if n["name"] == node)
    # under --bash every role is on this machine, over loopback (the node is named `local`)
    names = {n["position"]: (n["name"] if record.get("scheduler") == "sbatch" else "127.0.0.1")
             for n in record["nodes"]}
    servers = [n for n in record["nodes"] if "server" in n["roles"]]
    trainers = [n for n in record["nodes"] if "trainer" in n["roles"]]
    listen: list[tuple[str, str, int]] = []
    reach: list[tuple[str, str, int]] = []
    expect: dict[str, int] = {}
    replicas = [r["positions"] for r in (record.get("server") or {}).get("replicas") or []]
    for port in record["ports"]:
        host = names[port["host_position"]]
        if port["name"] == "server_http":
            server_host = record.get("server_host") or host
            if port["host_position"] == me["position"]:
                what = f"vllm.port (server_http, {port['spec_path']})"
                listen.append((what, server_host, port["value"]))
                expect[what] = len(trainers)
            if "trainer" in me["roles"]:
                reach.append((f"the server's HTTP port ({port['spec_path']})", server_host, port["value"]))
        elif port["name"] == "group":
            if port["host_position"] == me["position"] and "trainer" in me["roles"]:
                what = f"vllm.group_port (the weight-sync rendezvous on trainer rank 0, {port['spec_path']})"
                listen.append((what, host, port["value"]))
                expect[what] = len(servers)
            if "server" in me["roles"]:
                reach.append((f"trainer rank 0's weight-sync port ({port['spec_path']})", host, port["value"]))
        elif port["name"] == "master":
            # a replica over several nodes: vLLM's rendezvous on its first node, which its other nodes join
            members: list[int] = next((r for r in replicas if r and r[0] == port["host_position"]), [])
            if port["host_position"] == me["position"]:
                what = f"vllm.master_port (vLLM's rendezvous on the replica's rank 0, {port['spec_path']})"
                listen.append((what, host, port["value"]))
                expect[what] = len(members) - 1
            elif me["position"] in members:
                reach.append((f"the replica's rank 0 rendezvous ({port['spec_path']})", host, port["value"]))
    # the server probe reads metadata (~0.1 s), or imports vLLM for `serve --help=all` where the flag table has no
    # row (10-50 s): either way it runs while the TCP probes wait for their peers
    server: list[tuple[list[tuple[str, str]], list[str], str]] = []
    argv = (record.get("server") or {}).get("argv") or []
    helper = None
    if "server" in me["roles"] and me.get("server_rank") == 0 and argv:
        cmd = [os.path.expandvars(w) for w in argv[0]]
        helper = threading.Thread(target=lambda: server.append(vllmprobe.server_probe(cmd, facts)), daemon=True)
        helper.start()
    failures = tcp_probes(listen, reach, expect)
    notes: list[str] = []
    flags_checked = None
    if helper is not None:
        helper.join(vllmprobe.HELP_TIMEOUT_S + vllmprobe.META_TIMEOUT_S + 5)
        for f, n, how in server:
            failures += f
            notes += n
            flags_checked = how
    gpus = visible_gpus(env)
    wanted = {role: me.get(f"{role}_gpus") or [] for role in me["roles"]}
    if gpus is None and any(wanted.values()):
        notes.append("CUDA_VISIBLE_DEVICES is unset and there is no /dev/nvidia*: GPU visibility not checked")
    for role, positions in wanted.items():
        missing = [g for g in positions if gpus is not None and g >= gpus]
        if missing:
            failures.append(("PF104", f"the {role}'s GPU position(s) {missing} are not visible on {node}: it sees "
                                      f"{gpus} device(s) (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')})"))
    f, n = bf16_gpus([r for r in facts.get("bf16") or [] if r in wanted], wanted, env, _nvidia_smi)
    failures += f
    notes += n
    if "trainer" in me["roles"]:
        need, what = checkpoint_need(model, env, facts.get("checkpoint_bytes_per_param"))
        failures += output_dir(os.path.join(record["job_dir"], record["layout"]["trainer_output_dir"]), need, what)
    failures += offline_model(model, env) + model_files(model, env)
    failures += command_probes(record, list(me["roles"]), env, facts)
    return {"node": node, "ok": not failures, "failures": [{"code": c, "message": m} for c, m in failures],
            "notes": notes, "server_flags": flags_checked, "seconds": round(time.monotonic() - started, 2)}


def main(argv: list[str]) -> int:
    """preflight.py RECORD NODE MODEL OUT_JSON [FACTS_JSON]"""
    record_path, node, model, out = argv[:4]
    record = json.loads(Path(record_path).read_text())
    facts = json.loads(Path(argv[4]).read_text()) if len(argv) > 4 else {}
    result = node_probes(record, node, model, dict(os.environ), facts)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    for f in result["failures"]:
        print(f"launchgen: preflight {f['code']} on {node}: {f['message']}", file=sys.stderr)
    for n in result["notes"]:
        print(f"launchgen: preflight note on {node}: {n}", file=sys.stderr)
    return 0 if result["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
