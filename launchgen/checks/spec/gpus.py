"""LG1xx: GPUs and topology (and LG903, LG908, which moved here from the plan)."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.input.bounds import MAX_NODES
from launchgen.shared.issues import Issue

# === LG1xx GPUs and topology ===============================================================================

_doc("LG101", "error", "A GPU index is not below slurm.gpus_per_node.",
     "Use indices 0..gpus_per_node-1, or raise slurm.gpus_per_node to what the nodes have.")
_doc("LG102", "error", "A GPU index is listed twice.", "List each GPU index once.")
_doc("LG103", "error", "The server and the trainer use the same GPU on a node they share (NCCL fails on a "
     "shared device).", "Give vllm.gpus and train.gpus disjoint indices, or use vllm.mode: colocate to share GPUs.")
_doc("LG104", "error", "Server mode shares the first trainer node but vllm.gpus is not set.",
     "Set vllm.gpus (e.g. [0, 1, 2, 3]) or give the server nodes of its own with vllm.nodes.")
_doc("LG105", "error", "The trainer has no GPUs on its nodes.",
     "Leave GPUs for training: fewer vllm.gpus, or vllm.nodes >= 1, or set train.gpus.")
_doc("LG106", "info", "Some GPUs of a node the job holds are used by neither role.",
     "Give them to a role, or lower slurm.gpus_per_node if the nodes have fewer.")


def _gpu_lists(ctx: Ctx) -> Iterator[tuple[str, list[int]]]:
    v = ctx.spec.vllm
    if v is not None and v.gpus is not None:
        yield "vllm.gpus", list(v.gpus)
    if ctx.spec.train.gpus is not None:
        yield "train.gpus", list(ctx.spec.train.gpus)


@check("LG101")
def gpu_indices_exist(ctx: Ctx) -> Iterator[Issue]:
    n = ctx.spec.slurm.gpus_per_node
    for path, gpus in _gpu_lists(ctx):
        for i, g in enumerate(gpus):
            if g >= n:
                yield ctx.issue("LG101", f"{path}.{i}",
                                f"GPU {g} does not exist on a node with slurm.gpus_per_node={n} (indices 0..{n - 1})")


@check("LG102")
def gpu_indices_unique(ctx: Ctx) -> Iterator[Issue]:
    for path, gpus in _gpu_lists(ctx):
        seen: set[int] = set()
        for i, g in enumerate(gpus):
            if g in seen:
                yield ctx.issue("LG102", f"{path}.{i}", f"GPU {g} is listed more than once in {path}")
            seen.add(g)


@check("LG103", "LG104")
def server_trainer_disjoint(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or not ctx.shared_node or v.device == "cpu":  # a CPU server takes no GPUs (LG915 if given)
        return
    if v.gpus is None:
        yield ctx.issue("LG104", "vllm.gpus",
                        "vllm.mode is server with vllm.nodes: 0, so the server shares trainer node 0, "
                        "but vllm.gpus does not say which of its GPUs the server gets")
        return
    if ctx.spec.train.gpus is None:
        return  # the trainer defaults to the GPUs the server leaves free
    both = sorted(set(v.gpus) & set(ctx.spec.train.gpus))
    if both:
        yield ctx.issue("LG103", "train.gpus",
                        f"GPU(s) {', '.join(map(str, both))} on node 0 are in both vllm.gpus and train.gpus; "
                        "one device cannot be a server worker and a trainer rank of the same NCCL group")


@check("LG105")
def trainer_has_gpus(ctx: Ctx) -> Iterator[Issue]:
    if not ctx.cpu and not ctx.trainer_gpus:
        yield ctx.issue("LG105", "train.gpus" if ctx.spec.train.gpus is not None else "vllm.gpus",
                        f"no GPU of the {ctx.spec.slurm.gpus_per_node} per node is left for the trainer")


@check("LG106")
def idle_gpus(ctx: Ctx) -> Iterator[Issue]:
    if not ctx.trainer_gpus or ctx.cpu:
        return
    n, trainer = ctx.spec.slurm.gpus_per_node, set(ctx.trainer_gpus)
    path = "train.gpus" if ctx.spec.train.gpus is not None else "slurm.gpus_per_node"
    # a server sharing node 0 uses its GPUs there only: on the other trainer nodes they are idle
    server = set(ctx.server_gpus) if ctx.shared_node else set()
    groups = [("each trainer node", trainer | server)] if ctx.spec.train.nodes == 1 or not server else [
        ("trainer node 0 (with the server)", trainer | server),
        ("trainer node 1" if ctx.spec.train.nodes == 2 else f"trainer nodes 1-{ctx.spec.train.nodes - 1}", trainer)]
    for where, used in groups:
        idle = [g for g in range(n) if g not in used]
        if idle:
            yield ctx.issue("LG106", path, f"GPU(s) {', '.join(map(str, idle))} of {where} are used by no role")


_doc("LG107", "warning", "A dedicated server node leaves some of its GPUs idle (the job holds the whole node).",
     "List every GPU of the node in vllm.gpus and raise tensor_parallel_size or data_parallel_size (or add "
     "vllm.replicas) to use them, or share the first trainer node (vllm.nodes: 0).")


@check("LG107")
def idle_server_node_gpus(ctx: Ctx) -> Iterator[Issue]:
    """`vllm.nodes: 1` with `vllm.gpus: [0, 1, 2, 3]` on 8-GPU nodes: the server node is allocated whole (and
    `--exclusive`), so GPUs 4-7 wait for nothing the whole job. LG106 says it for trainer nodes."""
    if not ctx.server_mode or ctx.shared_node or ctx.cpu or not ctx.server_gpus or ctx.layout.server_cpu:
        return
    n = ctx.spec.slurm.gpus_per_node
    idle = [g for g in range(n) if g not in set(ctx.server_gpus)]
    if idle:
        nodes = ctx.server_nodes
        where = "the server node" if nodes == 1 else f"each of the {nodes} server nodes"
        yield ctx.issue("LG107", "vllm.gpus",
                        f"GPU(s) {_ranges(idle)} of {where} are used by no role (vllm.gpus uses "
                        f"{len(set(ctx.server_gpus))} of its {n}; the job holds the whole node)")


_doc("LG108", "error", f"train.nodes + vllm.nodes is more than {MAX_NODES:,} nodes, the most one job plans.",
     "Use fewer nodes (no real allocation comes near it; launchgen.input.bounds).")


@check("LG108")
def job_nodes_bounded(ctx: Ctx) -> Iterator[Issue]:
    """Each count is bounded by the schema (LG004); their sum here, where both are known."""
    n = ctx.layout.num_nodes
    if n > MAX_NODES:
        yield ctx.issue("LG108", "vllm.nodes", f"train.nodes {ctx.spec.train.nodes:,} + vllm.nodes "
                        f"{n - ctx.spec.train.nodes:,} = {n:,} nodes; at most {MAX_NODES:,}")


def _ranges(gpus: list[int]) -> str:
    """4, 5, 6, 7 -> `4-7`; 1, 3 -> `1, 3`."""
    runs: list[list[int]] = []
    for g in gpus:
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


_doc("LG903", "error", "Server mode with an empty vllm.gpus: the server has no GPUs.",
     "List the server's GPUs in `vllm.gpus`.")
_doc("LG908", "error", "train.device: cpu with vLLM colocate (in-process vLLM needs GPUs) or with GPU indices.",
     "Use `vllm.mode: server`, remove the `vllm` section, or set `train.device: cuda`.")


@check("LG903")
def server_has_gpus(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    # a CPU server takes no GPUs: listing some is LG915's mistake, not an empty list
    if ctx.server_mode and v is not None and v.gpus is not None and not ctx.layout.server_gpus \
            and not ctx.layout.server_cpu:
        yield ctx.issue("LG903", "vllm.gpus", "the server has no GPUs")  # vllm.gpus None is LG104's


@check("LG908")
def cpu_trainer_uses_no_gpus(ctx: Ctx) -> Iterator[Issue]:
    if not ctx.cpu:
        return
    if ctx.colocate:
        yield ctx.issue("LG908", "vllm", "train.device: cpu cannot run vLLM in-process (colocate needs GPUs)")
    if ctx.spec.train.gpus is not None:
        yield ctx.issue("LG908", "train.gpus", "train.device: cpu uses no GPUs",
                        "Remove `train.gpus`, or set `train.device: cuda`.")
