"""LG212-LG216: a server replica over several nodes (vLLM's `--nnodes` mode), pipeline and expert parallelism.

The world-size arithmetic (TP x PP x DP x replicas against the server GPUs) is LG201's and the TP placement
LG202's (`checks/spec/tp.py`); the placement of replicas on whole nodes LG220's. These stand down where those fire.
"""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared.issues import Issue

_doc("LG212", "warning", "A server tensor-parallel group spans several nodes: every layer's all-reduce crosses the "
     "link between nodes (InfiniBand or Ethernet, 10-40x slower than NVLink inside a node).",
     "Keep vllm.tensor_parallel_size at most the server GPUs per node and put the other factor across nodes with "
     "vllm.pipeline_parallel_size (e.g. TP 8 x PP 2 instead of TP 16 on two 8-GPU nodes).")
_doc("LG213", "error", "vllm.enable_expert_parallel for a model whose config.json names no experts (not MoE).",
     "Remove vllm.enable_expert_parallel (and all2all_backend / enable_eplb), or serve a mixture-of-experts model.")
_doc("LG214", "error", "vllm.pipeline_parallel_size is larger than the model's num_hidden_layers: a stage "
     "would hold no layer.",
     "Use a vllm.pipeline_parallel_size of at most num_hidden_layers (and better one that divides it).")
_doc("LG215", "error", "vllm.pipeline_parallel_size > 1 in colocate mode: the in-process engine of each trainer "
     "rank has no pipeline stages on other ranks.",
     "Remove vllm.pipeline_parallel_size, or use vllm.mode: server with dedicated server nodes.")
_doc("LG216", "warning", "vllm.all2all_backend or vllm.enable_eplb without vllm.enable_expert_parallel: vLLM "
     "ignores them.",
     "Set vllm.enable_expert_parallel: true, or remove vllm.all2all_backend / vllm.enable_eplb.")


@check("LG212")
def tp_group_crosses_nodes(ctx: Ctx) -> Iterator[Issue]:
    v, lay = ctx.spec.vllm, ctx.layout
    if v is None or v.mode != "server" or not lay.multi_node or not lay.server_gpus:
        return
    if not lay.tp_dp_matches_server or lay.server_tp_fits_node or not lay.server_tp_tiles_nodes:
        return  # LG201 / LG202 report the layout itself; TP inside a node needs no word
    per_node, tp = lay.server_gpus_per_node, v.tensor_parallel_size
    link = ctx.spec.estimate.link or "infiniband"
    yield ctx.issue("LG212", "vllm.tensor_parallel_size",
                    f"tensor_parallel_size {tp} spans {tp // per_node} nodes of {per_node} server GPUs: each "
                    f"layer's all-reduce crosses the {link} link between them instead of NVLink",
                    f"Use tensor_parallel_size {per_node} x pipeline_parallel_size "
                    f"{v.pipeline_parallel_size * tp // per_node}: TP inside each node, PP across nodes.")


@check("LG213")
def expert_parallel_needs_moe(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or not v.enable_expert_parallel:
        return
    cfg = ctx.model_config
    if cfg is not None and not cfg.is_moe:
        yield ctx.issue("LG213", "vllm.enable_expert_parallel",
                        f"expert parallelism for a dense model ({cfg.source} names no experts)")


@check("LG214")
def pipeline_fits_layers(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.pipeline_parallel_size == 1:
        return
    cfg = ctx.model_config
    layers = cfg.num_hidden_layers if cfg is not None else None
    if layers is not None and v.pipeline_parallel_size > layers:
        yield ctx.issue("LG214", "vllm.pipeline_parallel_size",
                        f"pipeline_parallel_size {v.pipeline_parallel_size} > num_hidden_layers {layers} "
                        f"({cfg.source if cfg is not None else ''})")


@check("LG215")
def no_pipeline_in_colocate(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "colocate" and v.pipeline_parallel_size > 1:
        yield ctx.issue("LG215", "vllm.pipeline_parallel_size",
                        f"pipeline_parallel_size {v.pipeline_parallel_size} in colocate mode")


@check("LG216")
def expert_options_need_ep(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.enable_expert_parallel or v.mode != "server":
        return
    for name in ("all2all_backend", "enable_eplb"):
        if getattr(v, name) not in (None, False):
            yield ctx.issue("LG216", f"vllm.{name}", f"vllm.{name} is set but vllm.enable_expert_parallel is off")
