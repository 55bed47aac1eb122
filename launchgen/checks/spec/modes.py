"""LG5xx: mode rules (server, colocate, no vLLM) and LG902 (trainer arguments the spec owns)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from launchgen.checks.context import Ctx, _set
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.kernels import _args_precision_conflict, attn_implementation_args
from launchgen.kinds.ownership import owned_args
from launchgen.shared.issues import Issue
from launchgen.trainers.declarations.declaration import names_where

# === LG5xx mode rules =====================================================================================

_doc("LG501", "error", "Colocate mode with server resources (vllm.nodes or vllm.gpus).",
     "Remove vllm.nodes and vllm.gpus: colocate runs vLLM inside each trainer process on its own GPU.")
_doc("LG502", "error", "The trainer's vLLM memory fraction is set but vLLM does not run colocated.",
     "Set vllm.gpu_memory_utilization instead (passed to the server as --gpu-memory-utilization).")
_doc("LG503", "error", "A vllm section with a trainer that does not generate (sft).",
     "Remove the vllm section for sft, or pick grpo, rloo or online_dpo.")
_doc("LG504", "error", "train.args.generation.backend contradicts the vllm section.",
     "Remove train.args.generation.backend: launchgen sets it from vllm.mode.")
_doc("LG505", "error", "train.args sets a server address or port that contradicts the vllm section.",
     "Remove it from train.args.generation.vllm_server: launchgen fills it from the vllm section and the plan.")
_doc("LG506", "warning", "A vllm field that has no effect in this mode is set.",
     "Remove the field, or switch vllm.mode to the mode it belongs to.")
_doc("LG507", "info", "An online trainer without a vllm section generates with plain transformers generate.",
     "Add a vllm section (server or colocate) for fast generation.")


@check("LG501")
def colocate_has_no_server(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.mode != "colocate":
        return
    if v.nodes > 0:
        yield ctx.issue("LG501", "vllm.nodes", f"vllm.nodes is {v.nodes} but colocate mode has no server nodes")
    if v.gpus is not None:
        yield ctx.issue("LG501", "vllm.gpus", "vllm.gpus is set but colocate mode has no server GPUs")


@check("LG502")
def trainer_gpu_memory_only_colocate(ctx: Ctx) -> Iterator[Issue]:
    if ctx.colocate:
        return
    # TRL's flat `vllm_gpu_memory_utilization` is not a trainer field: LG901 reports it once, pointing to
    # vllm.gpu_memory_utilization, so it is not also told here that it "only applies to colocate"
    path = "generation.vllm_colocate.gpu_memory_utilization"
    if ctx.has_arg(path):
        mode = "server" if ctx.server_mode else "not configured"
        yield ctx.issue("LG502", f"train.args.{path}",
                        f"train.args.{path} only applies to colocate mode, but vLLM is {mode}")


@check("LG503")
def vllm_needs_online_trainer(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if ctx.spec.vllm is not None and not ctx.trainer_facts.online:
        yield ctx.issue("LG503", "train.trainer",
                        f"trainer {t.trainer} does not generate, so a vllm section is meaningless "
                        f"(vLLM works with {', '.join(sorted(names_where(lambda f: f.online)))})")


def _expected_backend(ctx: Ctx) -> str:
    v = ctx.spec.vllm
    return "hf" if v is None else ("vllm_server" if v.mode == "server" else "vllm_colocate")


@check("LG504")
def backend_matches_mode(ctx: Ctx) -> Iterator[Issue]:
    backend = ctx.arg("generation.backend")
    if backend is None:
        return
    v = ctx.spec.vllm
    expected = _expected_backend(ctx)
    if backend != expected:
        where = "there is no vllm section" if v is None else f"vllm.mode is {v.mode}"
        yield ctx.issue("LG504", "train.args.generation.backend",
                        f"train.args.generation.backend is {backend!r} but {where} (expects {expected!r})")


def _server_arg_conflicts(ctx: Ctx) -> Iterator[tuple[str, Any, Any]]:
    """(key, value, what the spec says or None) for each vllm_server argument that contradicts the spec."""
    v = ctx.spec.vllm
    srv = ctx.arg("generation.vllm_server")
    if not isinstance(srv, dict):
        return
    owned = {"host": None, "base_url": None, "group_host": None}
    if v is not None and v.mode == "server":
        pairs: dict[str, Any] = {"port": v.port, "group_port": v.group_port, **owned}
    else:
        pairs = {"port": None, "group_port": None, **owned}
    for key, expected in pairs.items():
        if key in srv and (expected is None or srv[key] != expected):
            yield key, srv[key], expected


@check("LG505")
def server_args_match(ctx: Ctx) -> Iterator[Issue]:
    for key, value, expected in _server_arg_conflicts(ctx):
        why = (f"the vllm section says {expected}" if expected is not None
               else "launchgen resolves it from the allocation at run time")
        yield ctx.issue("LG505", f"train.args.generation.vllm_server.{key}",
                        f"train.args.generation.vllm_server.{key} is {value!r}, but {why}")


_doc("LG902", "error", "train.args sets a field the spec owns (model, precision, output_dir, the generation "
     "backend, the vLLM server address/ports, the colocate engine).",
     "Remove it from train.args and set the spec field the message names.")


def _owned_reported_elsewhere(ctx: Ctx) -> set[str]:
    """Owned arguments whose value contradicts the spec: the check of that contradiction reports them (LG502,
    LG504, LG505, LG601, LG606), so LG902 does not say it a second time."""
    out = {f"generation.vllm_server.{key}" for key, _, _ in _server_arg_conflicts(ctx)}
    backend = ctx.arg("generation.backend")
    if backend is not None and backend != _expected_backend(ctx):
        out.add("generation.backend")
    if not ctx.colocate:
        out.add("generation.vllm_colocate.gpu_memory_utilization")
    if _args_precision_conflict(ctx):
        out.add("precision")
    if any(True for _ in attn_implementation_args(ctx)):
        out.add("model")
    return out


@check("LG902")
def trainer_args_not_owned(ctx: Ctx) -> Iterator[Issue]:
    if ctx.trainer_facts.trl_config is not None:
        return  # TRL's fields: a value contradicting the topology is LG921 (launchgen.kinds.trl_config)
    elsewhere = _owned_reported_elsewhere(ctx)
    for path, by in owned_args(ctx.spec.train.args):
        if path not in elsewhere:
            yield ctx.issue("LG902", f"train.args.{path}", f"`{path}` is set by launchgen from {by}",
                            f"Remove `train.args.{path}` and set {by} instead.")


# data_parallel_size in colocate is LG904's, nodes/gpus are LG501's
_SERVER_ONLY = ("port", "group_port", "dp_rpc_port", "master_port", "bind", "extra_args", "health_timeout",
                "executable", "enable_expert_parallel", "all2all_backend", "enable_eplb")
_COLOCATE_ONLY = ("enable_sleep_mode",)


@check("LG506")
def mode_specific_fields(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None:
        return
    wrong = _SERVER_ONLY if v.mode == "colocate" else _COLOCATE_ONLY
    for name in wrong:
        if not _set(v, name):
            continue
        yield ctx.issue("LG506", f"vllm.{name}", f"vllm.{name} has no effect in {v.mode} mode")


@check("LG507")
def online_without_vllm(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if ctx.spec.vllm is None and ctx.trainer_facts.online and not ctx.cpu:
        yield ctx.issue("LG507", "train.trainer",
                        f"{t.trainer} will generate with transformers' generate, which is much slower than vLLM")


_doc("LG508", "warning", "Colocate gives vLLM most of each trainer GPU, leaving little for weights, gradients "
     "and optimizer state.", "Lower vllm.gpu_memory_utilization (TRL uses 0.3 for GRPO/RLOO, 0.55 for online DPO).")
COLOCATE_MAX_MEMORY = 0.6


@check("LG508")
def colocate_memory_share(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "colocate" and _set(v, "gpu_memory_utilization") \
            and v.gpu_memory_utilization > COLOCATE_MAX_MEMORY:
        yield ctx.issue("LG508", "vllm.gpu_memory_utilization",
                        f"colocate gives vLLM {v.gpu_memory_utilization:g} of every trainer GPU, leaving "
                        f"{1 - v.gpu_memory_utilization:.2g} for training")
