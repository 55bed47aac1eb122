"""`launchgen check --live`: what the spec assumes against what this machine and cluster report.

Run on a login node or inside an allocation. Each probe is independent; one that cannot run (no `sinfo`, no
`nvidia-smi`, a timeout) reports an `info` issue saying what it skipped and why, never an error. Every
subprocess has a timeout, and versions come from `importlib.metadata` (nothing heavy is imported).

Probes take a `Runner` so tests can inject canned output; the default runs the real executables from PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from launchgen.checks.context import Ctx
from launchgen.checks.live.command import PROBE_TIMEOUT, ProbeSkipped, Runner, run_command
from launchgen.checks.live.containers import ProbeUnavailable, probe_runtimes
from launchgen.checks.live.fit import probe_gpu_memory
from launchgen.checks.live.setup import probe_setup
from launchgen.checks.spec import scriptsize
from launchgen.checks.spec.kernels import (
    FLASH_ATTN2_REPO,
    attn_setting,
    cuda_is_128,
    is_hub_kernel,
    liger_enabled,
    split_kernel,
)
from launchgen.checks.spec.ports import PORT_NAMES, port_uses
from launchgen.input import directives
from launchgen.input.loader import LoadedSpec
from launchgen.input.spec import parse_time_limit
from launchgen.planning.hfcache import kernel_in_cache, model_in_cache
from launchgen.shared import compat, ports
from launchgen.shared.issues import Issue
from launchgen.shared.precision import resolve_precision


def _skip(what: str, why: str) -> Issue:
    return Issue("LG720", "", f"skipped {what}: {why}", "", "info")


# --- sinfo ------------------------------------------------------------------------------------------------

_GRES_ITEM = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")


def gpus_in_gres(gres: str, gpu_type: str | None = None) -> int:
    """`gpu:h100:8(S:0-1),shard:4` -> 8 (only the given type when set); `(null)` -> 0."""
    total = 0
    # commas also appear inside `(S:0-1,3)`: split only on commas outside parentheses
    depth, item, items = 0, "", []
    for ch in gres:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for it in items:
        m = _GRES_ITEM.match(it.strip())
        if m and (gpu_type is None or m.group(1) == gpu_type):
            total += int(m.group(2))
    return total


@dataclass(frozen=True)
class PartitionInfo:
    nodes: dict[str, int]  # node name -> GPUs
    max_nodes: int | None  # max job size in nodes, None = unlimited
    time_limit: int | None  # seconds, None = infinite


def _parse_limit(text: str) -> int | None:
    text = text.strip()
    if text in ("", "infinite", "UNLIMITED", "n/a"):
        return None
    try:
        return parse_time_limit(text)
    except ValueError:
        return None


def query_partition(partition: str | None, gpu_type: str | None, runner: Runner) -> PartitionInfo:
    part = ["-p", partition] if partition else []
    res = runner(["sinfo", "-h", "-N", *part, "-o", "%N|%P|%G"], PROBE_TIMEOUT)
    if res.returncode != 0:
        said = (res.stderr or res.stdout).strip()
        if partition and re.search(r"invalid partition|does not exist|not found", said, re.IGNORECASE):
            return PartitionInfo({}, None, None)
        raise ProbeSkipped(f"sinfo failed: {said[:200]}")
    nodes: dict[str, int] = {}
    for line in res.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        name, pname, gres = parts
        # without -p, only the default partition (marked `*`) is where the job lands
        if not partition and not pname.endswith("*"):
            continue
        nodes[name] = max(nodes.get(name, 0), gpus_in_gres(gres, gpu_type))
    max_nodes = limit = None
    res = runner(["sinfo", "-h", *part, "-o", "%P|%s|%l"], PROBE_TIMEOUT)
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3 or (not partition and not parts[0].endswith("*")):
                continue
            size = parts[1].split("-")[-1].strip()
            max_nodes = int(size) if size.isdigit() else None
            limit = _parse_limit(parts[2])
            break
    return PartitionInfo(nodes, max_nodes, limit)


def probe_sinfo(ctx: Ctx, runner: Runner) -> Iterator[Issue]:
    s = ctx.spec.slurm
    try:
        info = query_partition(s.partition, s.gpu_type, runner)
    except ProbeSkipped as exc:
        yield _skip("the partition probe", str(exc))
        return
    pname = s.partition or "the default partition"
    if not info.nodes:
        yield ctx.issue("LG711", "slurm.partition", f"sinfo lists no nodes in {pname}")
        return
    want = 0 if ctx.cpu else s.gpus_per_node  # a CPU job requests no GPUs
    fit = [n for n, g in info.nodes.items() if g >= want]
    most = max(info.nodes.values())
    typed = f" of type {s.gpu_type}" if s.gpu_type else ""
    if not fit:
        yield ctx.issue("LG712", "slurm.gpus_per_node",
                        f"slurm.gpus_per_node is {want} but the nodes of {pname} have at most {most} GPU(s){typed}")
        return
    if want and min(info.nodes[n] for n in fit) > want:
        yield ctx.issue("LG713", "slurm.gpus_per_node",
                        f"nodes of {pname} have {min(info.nodes[n] for n in fit)} GPU(s){typed}; "
                        f"the spec uses {want}")
    need = ctx.total_nodes
    if need > len(fit):
        yield ctx.issue("LG714", "train.nodes",
                        f"the job needs {need} node(s) with {want} GPU(s) but {pname} has {len(fit)}")
    elif info.max_nodes is not None and need > info.max_nodes:
        yield ctx.issue("LG714", "train.nodes",
                        f"the job needs {need} node(s) but {pname} allows at most {info.max_nodes} per job")
    if info.time_limit is not None and s.time_seconds > info.time_limit:
        yield ctx.issue("LG715", "slurm.time",
                        f"slurm.time {s.time} exceeds the time limit of {pname} ({info.time_limit} s)")


# --- versions ---------------------------------------------------------------------------------------------


def installed_versions(names: tuple[str, ...] = compat.TRACKED_PACKAGES) -> dict[str, str | None]:
    import importlib.metadata  # here, not at the top: a plain `check` imports this module too (~30 ms)

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def table_version() -> str:
    from launchgen.trainers.declarations.trl.fields import table_version as version

    return version()


def probe_versions(ctx: Ctx, versions: Mapping[str, str | None]) -> Iterator[Issue]:
    attn, _ = attn_setting(ctx)
    trl_table = table_version() if ctx.kind.uses_trl_table else None
    yield from compat.installed_issues(
        versions, uses_hub_kernel=is_hub_kernel(attn), liger=liger_enabled(ctx), needs_vllm=ctx.spec.vllm is not None,
        trl_table=trl_table)
    # which flash-attn2 build an unpinned name resolves to with these versions
    if attn is None or not is_hub_kernel(attn):
        return
    repo, rev = split_kernel(attn)
    tv = compat.parse_version(versions.get("transformers") or "")
    tor = compat.parse_version(versions.get("torch") or "")
    if repo != FLASH_ATTN2_REPO or rev is not None or tv is None:
        return
    build = compat.flash_attn2_default_build(tv, tor)
    if build is None:
        return
    gqa = ctx.model_config.is_gqa if ctx.model_config is not None else None
    if build == 3 and cuda_is_128(ctx) and gqa:
        yield ctx.issue("LG603", "train.attn_implementation",
                        f"{attn!r} resolves to build v3 with transformers {tv} and torch {tor}; with CUDA 12.8 "
                        "and a GQA model it fails in the backward pass")
    else:
        yield ctx.issue("LG721", "train.attn_implementation",
                        f"{attn!r} resolves to build v{build} with transformers {tv}"
                        + (f" and torch {tor}" if tor is not None else ""))


# --- GPUs -------------------------------------------------------------------------------------------------


def probe_gpus(ctx: Ctx, runner: Runner) -> Iterator[Issue]:
    precision = resolve_precision(ctx.spec)  # total: a contradiction among the aliases is LG605/LG606's
    if precision != "bf16" or ctx.spec.train.device == "cpu":
        yield _skip("the bf16 GPU probe", f"the trainer does not use bf16 on GPUs (precision {precision}, "
                    f"device {ctx.spec.train.device})")
        return
    try:
        res = runner(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"], PROBE_TIMEOUT)
    except ProbeSkipped as exc:
        yield _skip("the bf16 GPU probe", f"{exc} (normal on a login node; run inside an allocation)")
        return
    if res.returncode != 0:
        yield _skip("the bf16 GPU probe", f"nvidia-smi failed: {(res.stderr or res.stdout).strip()[:200]}")
        return
    old: list[str] = []
    seen = 0
    for line in res.stdout.splitlines():
        cap, _, name = line.partition(",")
        try:
            value = float(cap.strip())
        except ValueError:
            continue
        seen += 1
        if value < 8.0:
            old.append(f"{name.strip()} ({cap.strip()})")
    if not seen:
        yield _skip("the bf16 GPU probe", "nvidia-smi listed no GPUs")
    elif old:
        yield ctx.issue("LG716", "train.precision",
                        f"bf16 needs compute capability >= 8.0 (Ampere+), but this host has {', '.join(old)}")


# --- ports ------------------------------------------------------------------------------------------------


def port_free(port: int) -> bool:
    return ports.bindable(port, reuse_addr=False)


def probe_ports(ctx: Ctx, is_free: Callable[[int], bool] = port_free) -> Iterator[Issue]:
    offset, note = 0, ""
    if ctx.spec.job.port_offset == "job_id":
        job_id = ctx.env.get("SLURM_JOB_ID", "")
        if not job_id.isdigit():
            yield _skip("the port probe", "job.port_offset is job_id and SLURM_JOB_ID is not set here, so the "
                        "ports the job will use are not known yet")
            return
        offset = ports.offset_for(int(job_id))  # the rule the scripts render
        note = f" (base + {offset} for job {job_id})"
    checked = set()
    for u in port_uses(ctx):
        port = ports.shift(u.base, offset)
        if not 1 <= port <= 65535 or port in checked:
            continue
        checked.add(port)
        if not is_free(port):
            yield ctx.issue("LG717", u.spec_path, f"{PORT_NAMES[u.name]} {port}{note} is in use on this host "
                            f"({socket.gethostname()}); a job placed here would fail to bind it")
    if not checked:
        yield _skip("the port probe", "the plan listens on no port")


# --- offline caches ---------------------------------------------------------------------------------------

_TRUE = ("1", "true", "yes", "on")
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_on_nodes(ctx: Ctx) -> str | None:
    """Where HF_HUB_OFFLINE comes from if the nodes will be offline (this shell or the spec's env)."""
    for var in OFFLINE_VARS:
        if ctx.env.get(var, "").strip().lower() in _TRUE:
            return f"{var} in this environment"
    env = ctx.spec.slurm.env
    for role in ("all", "trainer", "server"):
        for var in OFFLINE_VARS:
            if getattr(env, role).get(var, "").strip().lower() in _TRUE:
                return f"slurm.env.{role}.{var}"
    return None


def probe_offline(ctx: Ctx) -> Iterator[Issue]:
    why = offline_on_nodes(ctx)
    if why is None:
        yield _skip("the offline-cache probe", "HF_HUB_OFFLINE is not set here nor in slurm.env, so the nodes "
                    "download what they miss")
        return
    m = ctx.spec.model
    if not model_in_cache(m.name_or_path, m.revision, ctx.env):
        at = f" at revision {m.revision}" if m.revision else ""
        yield ctx.issue("LG718", "model.name_or_path",
                        f"{why}, but {m.name_or_path}{at} is not a local directory nor in the HF cache")
    attn, path = attn_setting(ctx)
    if attn is not None and is_hub_kernel(attn):
        repo, rev = split_kernel(attn)
        if not kernel_in_cache(repo, rev, ctx.env):
            yield ctx.issue("LG719", path, f"{why}, but the Hub kernel {attn} is not in the local cache")


def probe_containers(ctx: Ctx, runner: Runner) -> Iterator[Issue]:
    """The container runtimes the spec uses (launchgen.checks.spec.containers owns the probe)."""
    def run(argv: list[str], timeout: float) -> tuple[int, str]:
        try:
            res = runner(argv, timeout)
        except ProbeSkipped as exc:
            raise ProbeUnavailable(str(exc)) from None
        return res.returncode, res.stdout + res.stderr

    yield from probe_runtimes(ctx, run, shutil.which)


# --- sbatch's release ------------------------------------------------------------------------------------


def probe_sbatch_release(ctx: Ctx, runner: Runner) -> Iterator[Issue]:
    """LG813 against this cluster's own sbatch (`sbatch --version`): an extra directive its release lacks makes it
    refuse the whole script. Where the spec names the release (slurm.version) the spec check judged already."""
    if ctx.spec.slurm.version is not None or not ctx.spec.slurm.extra_directives:
        return
    try:
        res = runner(["sbatch", "--version"], PROBE_TIMEOUT)
        release = res.stdout.strip()
        directives.release_key(release)
    except (ProbeSkipped, ValueError) as exc:
        yield _skip("the sbatch release probe", str(exc) or "sbatch --version said no release")
        return
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written, since in directives.newer_than(d, release):
            yield ctx.issue("LG813", f"slurm.extra_directives.{i}",
                            f"{written} came with Slurm {since}; this cluster's sbatch ({release}) refuses the script "
                            "with `unrecognized option`", severity="error")


# --- the cluster's max_script_size --------------------------------------------------------------------------


def cluster_script_limit(runner: Runner = run_command) -> tuple[int | None, list[Issue]]:
    """This cluster's max_script_size from `scontrol show config` (None: unset, SLURM's default applies, or the
    probe could not run: then an `info` issue says so). `check --live` hands it to the LG815 check."""
    try:
        config = runner(["scontrol", "show", "config"], PROBE_TIMEOUT).stdout
    except ProbeSkipped as exc:
        return None, [_skip("the max_script_size probe (scontrol show config)", str(exc))]
    return scriptsize.max_script_size_of(config), []


# --- entry point ------------------------------------------------------------------------------------------


def live_checks(loaded: LoadedSpec, *, runner: Runner = run_command, env: Mapping[str, str] | None = None,
                versions: Mapping[str, str | None] | None = None,
                is_free: Callable[[int], bool] = port_free) -> list[Issue]:
    """Every live probe; issues are located on the spec's lines like the static checks."""
    ctx = Ctx(loaded, dict(os.environ) if env is None else env)
    issues: list[Issue] = []
    issues.extend(probe_sinfo(ctx, runner))
    issues.extend(probe_versions(ctx, installed_versions() if versions is None else versions))
    issues.extend(probe_gpus(ctx, runner))
    issues.extend(probe_gpu_memory(ctx, runner))
    issues.extend(probe_ports(ctx, is_free))
    issues.extend(probe_offline(ctx))
    issues.extend(probe_setup(ctx))
    issues.extend(probe_containers(ctx, runner))
    issues.extend(probe_sbatch_release(ctx, runner))
    return [i.located(i.file or loaded.path, i.line if i.line is not None else loaded.line_of(i.path) if i.path
                      else None) for i in issues]
