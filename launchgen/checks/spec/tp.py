"""LG2xx: tensor/data parallelism and the model (and LG904, which moved here from the plan)."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

# === LG2xx tensor/data parallelism and the model =========================================================

_doc("LG201", "error", "tensor_parallel_size x pipeline_parallel_size x data_parallel_size (x vllm.replicas) "
     "differs from the server's GPU count (vllm.nodes x the server GPUs per node).",
     "Make vllm.tensor_parallel_size * vllm.pipeline_parallel_size * vllm.data_parallel_size * vllm.replicas "
     "equal the number of server GPUs (a replica may span whole server nodes).")
_doc("LG202", "error", "A tensor-parallel group cannot be placed: larger than the GPUs of a one-node server "
     "(or of a node, in colocate), or straddling a node boundary part-way (TP neither dividing the server GPUs per "
     "node nor a multiple of them).",
     "Use a vllm.tensor_parallel_size that divides the server GPUs per node and put the rest across nodes with "
     "vllm.pipeline_parallel_size (or a TP that is a whole number of nodes, with vllm.nodes covering it).")
_doc("LG203", "error", "num_attention_heads of the model is not divisible by tensor_parallel_size.",
     "Choose a vllm.tensor_parallel_size that divides num_attention_heads.")
_doc("LG204", "error", "num_key_value_heads is neither divisible by tensor_parallel_size nor a divisor of it.",
     "Choose a vllm.tensor_parallel_size that divides num_key_value_heads (or a multiple of it).")
_doc("LG205", "warning", "data_parallel_size > 1 for a dense model (vLLM's DP only helps mixture-of-experts).",
     "Scale the server with vllm.tensor_parallel_size instead of data_parallel_size.")
_doc("LG206", "error", "max_model_len is shorter than the longest prompt plus max_completion_length.",
     "Raise vllm.max_model_len to at least data.max_prompt_length + generation.max_completion_length.")
_doc("LG207", "warning", "max_model_len exceeds the model's max_position_embeddings.",
     "Lower vllm.max_model_len to the model's max_position_embeddings (vLLM refuses longer without rope scaling).")
_doc("LG208", "info", "The model's config.json is not reachable locally, so head-count checks were skipped.",
     "Use a local path, or run where the model is in the HF cache (HF_HOME / HF_HUB_CACHE).")
_doc("LG209", "error", "Colocate: the trainer processes of a node are not divisible by tensor_parallel_size.",
     "Make the trainer GPUs per node a multiple of vllm.tensor_parallel_size.")


@check("LG201")
def tp_dp_matches_server_gpus(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.mode != "server" or (ctx.shared_node and v.gpus is None):
        return
    lay = ctx.layout
    if len(set(lay.server_gpus)) != len(lay.server_gpus):
        return  # a GPU listed twice (LG102's) makes the count wrong: one mistake, one message
    n = lay.server_world_size
    if n and not lay.tp_dp_matches_server:
        reps = f" x replicas {v.replicas}" if v.replicas > 1 else ""
        pp = f" x pipeline_parallel_size {v.pipeline_parallel_size}" if v.pipeline_parallel_size > 1 else ""
        yield ctx.issue("LG201", "vllm.tensor_parallel_size",
                        f"tensor_parallel_size {v.tensor_parallel_size}{pp} x data_parallel_size "
                        f"{v.data_parallel_size}{reps} = {lay.replica_size * v.replicas}, "
                        f"but the server has {n} GPU(s) ({ctx.server_nodes} node(s) x "
                        f"{lay.server_gpus_per_node})")


@check("LG202")
def tp_fits_node(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None:
        return
    tp = v.tensor_parallel_size
    lay = ctx.layout
    if v.mode == "server" and lay.server_world_size and not lay.tp_dp_matches_server:
        return  # TP x PP x DP does not match the server GPUs at all: one message, LG201's
    if v.mode == "server" and ctx.server_gpus:
        per_node = lay.server_gpus_per_node
        if lay.server_tp_tiles_nodes:
            return  # inside a node, or whole nodes of a multi-node replica (LG210 warns about the link)
        where = (f"a replica spans {lay.replica_nodes} node(s)" if lay.replica_nodes > 1
                 else "a replica is one node")
        yield ctx.issue("LG202", "vllm.tensor_parallel_size",
                        f"tensor_parallel_size {tp} neither divides nor is a multiple of the {per_node} server "
                        f"GPU(s) of a node ({where}), so a TP group would straddle a node boundary")
        return
    if tp > ctx.spec.slurm.gpus_per_node and v.mode != "server":
        yield ctx.issue("LG202", "vllm.tensor_parallel_size",
                        f"tensor_parallel_size {tp} is larger than slurm.gpus_per_node "
                        f"{ctx.spec.slurm.gpus_per_node}")


def _tp(ctx: Ctx) -> int:
    return ctx.spec.vllm.tensor_parallel_size if ctx.spec.vllm is not None else 1


@check("LG203", "LG204", "LG208")
def heads_divisible_by_tp(ctx: Ctx) -> Iterator[Issue]:
    tp = _tp(ctx)
    if ctx.spec.vllm is None or tp == 1:
        return
    cfg = ctx.model_config
    if cfg is None:
        yield ctx.issue("LG208", "model.name_or_path",
                        f"config.json of {ctx.spec.model.name_or_path!r} is not in a local directory or the "
                        "local HF cache; head divisibility by tensor_parallel_size was not checked")
        return
    q, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if q is not None and q % tp:
        yield ctx.issue("LG203", "vllm.tensor_parallel_size",
                        f"num_attention_heads {q} ({cfg.source}) is not divisible by tensor_parallel_size {tp}")
    if kv is not None and kv % tp and tp % kv:
        # vLLM replicates KV heads when TP is a multiple of their count; anything else cannot be split
        yield ctx.issue("LG204", "vllm.tensor_parallel_size",
                        f"num_key_value_heads {kv} ({cfg.source}) cannot be split over tensor_parallel_size {tp}")


@check("LG205")
def dp_for_dense(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.mode != "server" or v.data_parallel_size == 1:
        return
    cfg, numbers = ctx.model_config, ctx.spec.estimate.model
    if (cfg is not None and cfg.is_moe) or (cfg is None and numbers is not None and (numbers.num_experts or 0) > 1):
        return  # vLLM's DP is for mixture-of-experts models (config.json, else estimate.model, says so)
    what = "a dense model" if cfg is not None else "the model (config.json not reachable; fine if it is MoE)"
    yield ctx.issue("LG205", "vllm.data_parallel_size",
                    f"data_parallel_size {v.data_parallel_size} for {what}: every DP replica joins the weight "
                    "group and dense models gain nothing over tensor parallelism")


def _max_model_len(ctx: Ctx) -> tuple[int | None, str]:
    v = ctx.spec.vllm
    if v is not None and v.max_model_len is not None:
        return v.max_model_len, "vllm.max_model_len"
    # an argument the spec owns (LG902), but still the length vLLM would be asked for
    mml = ctx.value("generation.vllm_colocate.max_model_len")
    return (mml if isinstance(mml, int) and not isinstance(mml, bool) else None), \
        "train.args.generation.vllm_colocate.max_model_len"


@check("LG206", "LG207")
def max_model_len_fits(ctx: Ctx) -> Iterator[Issue]:
    if ctx.spec.vllm is None:
        return
    mml, path = _max_model_len(ctx)
    if mml is None:
        return
    tc = ctx.trainer_cfg  # the trainer's own values and defaults (None: LG901 reports the config)
    prompt = tc.data.max_prompt_length if tc is not None else None
    completion = tc.generation.max_completion_length if tc is not None else None
    if prompt is not None and completion is not None and prompt + completion > mml:
        yield ctx.issue("LG206", path,
                        f"max_model_len {mml} < max_prompt_length {prompt} + max_completion_length {completion} "
                        f"= {prompt + completion}; vLLM answers such requests with HTTP 400")
    cfg = ctx.model_config
    if cfg is not None and cfg.max_position_embeddings is not None and mml > cfg.max_position_embeddings:
        yield ctx.issue("LG207", path,
                        f"max_model_len {mml} exceeds max_position_embeddings {cfg.max_position_embeddings} "
                        f"({cfg.source})")


@check("LG209")
def colocate_tp_divides_world(ctx: Ctx) -> Iterator[Issue]:
    ppn = ctx.processes_per_node
    if not ctx.colocate or ppn == 0:
        return
    tp = _tp(ctx)
    if tp > ctx.spec.slurm.gpus_per_node:
        return  # a TP group larger than a node: LG202's
    if not ctx.layout.colocate_tp_fits:
        yield ctx.issue("LG209", "vllm.tensor_parallel_size",
                        f"colocate splits the {ppn} trainer processes of each node into TP groups of {tp}, "
                        "which does not divide evenly")


_doc("LG904", "error", "data_parallel_size in colocate mode (each trainer rank generates for itself).",
     "Remove vllm.data_parallel_size (each trainer rank generates for itself).")


@check("LG904")
def colocate_has_no_dp(ctx: Ctx) -> Iterator[Issue]:
    if ctx.colocate and ctx.layout.data_parallel_size != 1:
        yield ctx.issue("LG904", "vllm.data_parallel_size", "colocate mode has no data-parallel server")
