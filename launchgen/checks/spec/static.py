"""Warnings knowable from the spec and local files alone, without `check --live` (issue 17).

* LG620: `slurm.gpu_type` names a pre-Ampere GPU (V100, T4, P100, ...) while training in bf16, which needs
  compute capability 8.0 (LG716 finds the same with `--live`, from nvidia-smi, only on a GPU host).
* LG820: `vllm.health_timeout` is shorter than the server's start-up estimated from the model's size, when its
  config.json is local (a directory or the Hub cache): a job that waits the whole queue time and then kills a
  server that was still loading.

* LG809: a `slurm.extra_directives` option sbatch does not know (20.11-25.11): sbatch refuses the script at
  submission (`unrecognized option`), typically a typo (`--constrain=`) or an srun-only option.
* LG813: an option newer than the cluster's Slurm (`slurm.version`; unset, newer than 22.05: a warning).
* LG814: `--nodelist` / `-w` naming more or fewer nodes than the plan asks for; a node file
  (`-F/--nodefile`, or a `-w` value with a `/`) is read by `check` only: launchgen.checks.files.nodefile.

Registered with `launchgen.checks.registry.check` like every check.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.input import directives
from launchgen.planning.hetjob import is_hetjob
from launchgen.planning.hfcache import ModelConfig
from launchgen.shared.issues import Issue, SpecError
from launchgen.shared.modelshape import ModelShape

#: GPU type names (as sites spell them in GRES) of NVIDIA generations before Ampere, with compute capability.
PRE_AMPERE = {
    "v100": "7.0", "titanv": "7.0", "t4": "7.5", "rtx6000": "7.5", "rtx8000": "7.5", "rtx2080": "7.5",
    "2080ti": "7.5", "p100": "6.0", "p40": "6.1", "p4": "6.1", "gtx1080": "6.1",
    "1080ti": "6.1", "titanxp": "6.1", "k80": "3.7", "k40": "3.5", "k20": "3.5", "m60": "5.2", "m40": "5.2",
}
_SPLIT = re.compile(r"[^a-z0-9]+")

#: Server start-up before weights stream in (process start, NCCL, CUDA graphs, torch.compile), seconds.
STARTUP_BASE_S = 120
#: Seconds per GB of weights read by one server node from a cold shared filesystem (~125 MB/s).
SECONDS_PER_GB = 8.0
BYTES_PER_PARAM = 2  # bf16/fp16 weights

_doc("LG620", "warning", "slurm.gpu_type is a pre-Ampere GPU (V100, T4, P100, ...) but the trainer uses bf16, "
     "which needs compute capability 8.0.",
     "Set train.precision: fp16 (or fp32) for these GPUs, or request Ampere or newer (A100, H100, L40S, ...).")
_doc("LG809", "warning", "slurm.extra_directives has an option sbatch (Slurm 20.11-25.11) does not know; sbatch "
     "refuses the whole script for it.",
     "Fix the spelling (`sbatch --help` lists the options; a unique prefix is enough), drop srun-only options, or "
     "ignore this where your Slurm is newer and has the option.")
_doc("LG820", "warning", "vllm.health_timeout is shorter than the server's start-up estimated from the model's "
     "size (its config.json is local).",
     "Raise vllm.health_timeout to at least the estimate (weights are read at ~125 MB/s from a cold shared "
     "filesystem, plus start-up); the job stops everything when the server is not healthy by then.")


def pre_ampere(gpu_type: str) -> tuple[str, str] | None:
    """(matched name, compute capability) when `gpu_type` names a pre-Ampere GPU, e.g. `tesla_v100-sxm2`."""
    words = [w for w in _SPLIT.split(gpu_type.lower()) if w]
    for w in [*words, "".join(words)]:
        for name, cc in PRE_AMPERE.items():
            if w == name or (w.startswith(name) and not w[len(name):].isdigit()):
                return name, cc
    return None


@check("LG620")
def bf16_on_pre_ampere(ctx: Ctx) -> Iterator[Issue]:
    gpu_type = ctx.spec.slurm.gpu_type
    if gpu_type is None or ctx.cpu:
        return
    from launchgen.planning.plan import resolve_precision

    try:
        precision = resolve_precision(ctx.spec)
    except SpecError:
        return  # LG906 says why
    hit = pre_ampere(gpu_type)
    if hit is not None and precision == "bf16":
        path = "train.precision" if "precision" in ctx.spec.train.model_fields_set else "slurm.gpu_type"
        yield ctx.issue("LG620", path, f"slurm.gpu_type {gpu_type!r} is a {hit[0].upper()} (compute capability "
                        f"{hit[1]}); bf16 needs 8.0 (Ampere), and the trainer's precision is bf16")


def parameter_count(cfg: ModelConfig) -> int | None:
    """A decoder's parameters from config.json (dense or mixture-of-experts), or None if the keys are missing;
    the count is the memory estimate's (`launchgen.shared.modelshape.ModelShape`)."""
    shape = ModelShape.from_config(cfg.data, cfg.source)
    return None if shape is None else shape.parameter_count()


def startup_estimate_s(params: int) -> int:
    """Seconds a server node needs to become healthy: start-up plus reading the whole checkpoint (its TP ranks
    read their shards at once, through the node's one link to the filesystem; every DP node reads its own)."""
    gb = params * BYTES_PER_PARAM / 1e9
    return int(STARTUP_BASE_S + gb * SECONDS_PER_GB)


@check("LG820")
def health_timeout_for_model_size(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    cfg = ctx.model_config
    if v is None or v.mode != "server" or cfg is None:
        return
    params = parameter_count(cfg)
    if params is None:
        return
    need = startup_estimate_s(params)
    if v.health_timeout < need:
        yield ctx.issue("LG820", "vllm.health_timeout",
                        f"vllm.health_timeout {v.health_timeout} s; the model ({cfg.source}) has about "
                        f"{params / 1e9:.1f}B parameters ({params * BYTES_PER_PARAM / 1e9:.0f} GB in bf16): "
                        f"expect about {need} s before /health answers")


_doc("LG812", "error", "slurm.extra_directives has an option sbatch refuses beside one launchgen writes "
     "(e.g. --cpus-per-gpu beside --cpus-per-task).", "Drop the option, or set the typed field it clashes with "
     "instead (slurm.cpus_per_task, slurm.mem).")


@check("LG812", stage="plan")
def extra_directives_compatible(ctx: Ctx) -> Iterator[Issue]:
    if ctx.plan is None or ctx.plan.slurm is None:
        return
    generated = list(ctx.plan.slurm.directives[:len(ctx.plan.slurm.directives) - len(ctx.spec.slurm.extra_directives)])
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written, theirs in directives.refused_beside(d, generated):
            yield ctx.issue("LG812", f"slurm.extra_directives.{i}",
                            f"{written} beside `#SBATCH {theirs}` (written by launchgen): sbatch refuses the "
                            "script (the two are mutually exclusive)")


@check("LG809")
def extra_directives_known(ctx: Ctx) -> Iterator[Issue]:
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written in directives.unknown(d):
            yield ctx.issue("LG809", f"slurm.extra_directives.{i}",
                            f"{written} in {d!r} is not an sbatch option (Slurm 20.11-25.11): sbatch would refuse "
                            "the script with `unrecognized option`")


_doc("LG813", "error", "slurm.extra_directives has an option newer than the cluster's Slurm (slurm.version); its "
     "sbatch refuses the whole script (`unrecognized option`); `check --live` asks this cluster's sbatch "
     f"(`sbatch --version`). A warning where neither says and the option is newer than "
     f"{directives.ASSUMED_RELEASE}.",
     "Drop the option, or set slurm.version to the cluster's release (`sbatch --version`) if it has it.")


@check("LG813")
def extra_directives_in_release(ctx: Ctx) -> Iterator[Issue]:
    release = ctx.spec.slurm.version
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written, since in directives.newer_than(d, release or directives.ASSUMED_RELEASE):
            if release is not None:
                yield ctx.issue("LG813", f"slurm.extra_directives.{i}",
                                f"{written} came with Slurm {since}; sbatch {release} (slurm.version) refuses the "
                                "script with `unrecognized option`")
            else:
                yield ctx.issue("LG813", f"slurm.extra_directives.{i}",
                                f"{written} came with Slurm {since}; an older sbatch (this cluster's, if before "
                                f"{since}) refuses the script: set slurm.version to say which release runs here",
                                severity="warning")


_doc("LG814", "error", "slurm.extra_directives names a --nodelist (-w) or a node file (-F/--nodefile, or a -w "
     "value with a `/`) of more or fewer nodes than the plan asks for; sbatch refuses the job, or the plan's node "
     "positions miss the named nodes. A warning where `check` cannot read the node file.",
     "Name exactly train.nodes + vllm.nodes hosts, or drop the option (`--constraint` or `--exclude` choose "
     "nodes without fixing their count).")


def _planned_nodes(ctx: Ctx) -> int:
    # a heterogeneous job's #SBATCH lines before `hetjob` are its first component: the trainer nodes
    return len(ctx.layout.trainer_positions) if is_hetjob(ctx.spec) else ctx.layout.num_nodes


def node_count_differs(ctx: Ctx, i: int, what: str, n: int | None) -> Iterator[Issue]:
    """LG814 where extra directive `i`'s `what` names `n` nodes and the plan another count (the node file's
    check, launchgen.checks.files.nodefile, shares it)."""
    want = _planned_nodes(ctx)
    if n is not None and n != want:
        yield ctx.issue("LG814", f"slurm.extra_directives.{i}",
                        f"{what} names {n} node(s); the plan asks for {want} (train.nodes + vllm.nodes)")


@check("LG814")
def nodelist_matches_the_plan(ctx: Ctx) -> Iterator[Issue]:
    for i, d in enumerate(ctx.spec.slurm.extra_directives):
        for written, hosts in directives.nodelists(d):
            yield from node_count_differs(ctx, i, written, directives.node_count(hosts))
