"""Named cross-field checks: each a function registered under stable codes, returning Issues.

Field rules (types, ranges, syntax) live in the pydantic models and are reported by the loader (LG000-LG004).
Everything that relates several fields, or the spec to the model's config.json, is a check here, so it gets a
code users can grep for, the dotted path of the field to change, its YAML line and a one-sentence fix.

Code ranges: LG1xx GPUs/topology, LG2xx TP/DP/model, LG3xx trainer world/backend/batch, LG4xx ports, LG5xx mode
rules, LG6xx kernels/precision, LG7xx versions and `check --live`, LG8xx security and SLURM misc. LG9xx are
plan-resolution errors raised by `plan.py`, except LG902-LG904 and LG908, rules that moved here from the plan
with their codes (the plan now only asserts them). The layout every check reads is `launchgen.layout`'s. `docs/check-codes.md` lists every code; a test keeps the two in sync.

Checks run in two stages. Spec checks see only the validated Spec (so they still run, and report everything at
once, when the spec is too broken to plan). If none of them is an error the plan is built and the plan checks
run on it. Each check is written so that it never raises on odd input: a value of the wrong type in the free
form `train.args` is the trainer config's problem (reported when the plan validates it), not a crash here.
A third stage, `files` (`launchgen/preflight/`), reads what the spec names on disk; only `check` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from launchgen import compat, ports
from launchgen.hfcache import ModelConfig, find_model_config
from launchgen.issues import Issue, Severity, SpecError
from launchgen.layout import Layout, resolve_layout
from launchgen.loader import LoadedSpec
from launchgen.ownership import owned_args
from launchgen.ports import EPHEMERAL_HIGH, EPHEMERAL_LOW, PORT_MAX, PORT_MIN
from launchgen.precision import PRECISION_DTYPE
from launchgen.reserved import is_reserved
from launchgen.spec import Spec
from launchgen.trainers.config import BUILTIN_ATTN, HUB_KERNEL_RE, ONLINE_TRAINERS

if TYPE_CHECKING:
    from launchgen.plan import Plan, Port

# --- constants the checks share with docs and tests ---------------------------------------------------------

# port ranges and the job-id shift: launchgen.ports owns them
PORT_OFFSET_MAX = ports.MAX_OFFSET
PORT_OFFSET_STEP = 10
#: Seconds below which a /health wait is too short for any real model to load (TRL waits 240 s by default).
MIN_HEALTH_TIMEOUT = 120
#: Seconds a trainer needs at least to write a checkpoint after USR2.
MIN_SIGNAL_GRACE = 30
#: `vllm serve` options launchgen generates from typed fields (long and short spellings).
GENERATED_SERVER_FLAGS: dict[str, str] = {
    "--port": "vllm.port",
    "--host": "vllm.bind",
    "--tensor-parallel-size": "vllm.tensor_parallel_size",
    "-tp": "vllm.tensor_parallel_size",
    "--data-parallel-size": "vllm.data_parallel_size",
    "-dp": "vllm.data_parallel_size",
    "--data-parallel-rpc-port": "vllm.dp_rpc_port",
    "--data-parallel-address": "(generated from the allocation)",
    "--weight-transfer-config": "(required by the weight-sync protocol)",
    "--logprobs-mode": "(required: processed_logprobs)",
    "--max-logprobs": "(required: -1)",
    "--max-model-len": "vllm.max_model_len",
    "--gpu-memory-utilization": "vllm.gpu_memory_utilization",
    "--enable-prefix-caching": "vllm.enable_prefix_caching",
    "--no-enable-prefix-caching": "vllm.enable_prefix_caching",
    "--enforce-eager": "vllm.enforce_eager",
    "--trust-remote-code": "model.trust_remote_code",
    "--revision": "model.revision",
    "--dtype": "model.dtype",
    "--model": "model.name_or_path",
    "--data-parallel-size-local": "(generated for multi-node DP)",
    "--data-parallel-start-rank": "(generated for multi-node DP)",
    "--headless": "(generated for multi-node DP)",
    "--api-server-count": "(generated: 1 when DP > 1, so one front end carries the dev routes)",
}
WIDE_BINDS = ("0.0.0.0", "::", "[::]", "*")


def vllm_flag(arg: str) -> str:
    """The option an extra_args word sets, spelled as vLLM's parser reads it: `--max_model_len=8` and
    `--weight_transfer_config.backend x` are `--max-model-len` and `--weight-transfer-config` (vLLM turns `_`
    into `-` in long options and reads `.key` as a field of a config option)."""
    word = arg.strip().split(None, 1)[0] if arg.strip() else ""
    flag = word.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].split(".", 1)[0].replace("_", "-")
    return flag


# --- registry ---------------------------------------------------------------------------------------------

#: `files` checks read what the spec names on disk; only `check` runs them (see launchgen.preflight).
Stage = Literal["spec", "plan", "files"]


@dataclass(frozen=True)
class CodeDoc:
    code: str
    severity: Severity  # the most severe level the code is reported at
    title: str
    fix: str


@dataclass(frozen=True)
class Check:
    name: str
    codes: tuple[str, ...]
    stage: Stage
    fn: Callable[[Ctx], Iterable[Issue]]


CHECKS: list[Check] = []
#: Every code launchgen reports, for `docs/check-codes.md` and the tests. The loader's and the plan's codes
#: are documented here too so the list is complete.
CODES: dict[str, CodeDoc] = {}


def _doc(code: str, severity: Severity, title: str, fix: str) -> None:
    CODES[code] = CodeDoc(code, severity, title, fix)


def check(*codes: str, stage: Stage = "spec") -> Callable[[Callable[[Ctx], Iterable[Issue]]],
                                                         Callable[[Ctx], Iterable[Issue]]]:
    def deco(fn: Callable[[Ctx], Iterable[Issue]]) -> Callable[[Ctx], Iterable[Issue]]:
        for c in codes:
            if c not in CODES:
                raise ValueError(f"check {fn.__name__}: code {c} has no CodeDoc")
        CHECKS.append(Check(fn.__name__, codes, stage, fn))
        return fn
    return deco


# --- context ----------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    loaded: LoadedSpec
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    plan: Plan | None = None

    @property
    def spec(self) -> Spec:
        return self.loaded.spec

    @cached_property
    def model_config(self) -> ModelConfig | None:
        m = self.spec.model
        return find_model_config(m.name_or_path, m.revision, self.env)

    @cached_property
    def layout(self) -> Layout:
        """The one layout derivation the plan also builds on; total, so it is there for invalid specs too."""
        return resolve_layout(self.spec)

    @property
    def server_mode(self) -> bool:
        return self.layout.mode == "server"

    @property
    def colocate(self) -> bool:
        return self.layout.mode == "colocate"

    @property
    def shared_node(self) -> bool:
        """Server mode with the server on the first trainer node."""
        return self.layout.shared

    @property
    def server_gpus(self) -> list[int]:
        return list(self.layout.server_gpus)

    @property
    def server_nodes(self) -> int:
        return len(self.layout.server_positions)

    @property
    def cpu(self) -> bool:
        return self.layout.cpu

    @property
    def trainer_gpus(self) -> list[int]:
        return list(self.layout.trainer_gpus)

    @property
    def processes_per_node(self) -> int:
        return self.layout.processes_per_node

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def total_nodes(self) -> int:
        return self.layout.num_nodes

    # train.args, read defensively (the trainer config validates types when the plan is built)
    def arg(self, path: str, default: Any = None) -> Any:
        node: Any = self.spec.train.args
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def has_arg(self, path: str) -> bool:
        sentinel = object()
        return self.arg(path, sentinel) is not sentinel

    def int_arg(self, path: str, default: int | None = None) -> int | None:
        v = self.arg(path, default)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def issue(self, code: str, path: str, message: str, fix: str | None = None,
              severity: Severity | None = None) -> Issue:
        doc = CODES[code]
        return Issue(code, path, message, doc.fix if fix is None else fix,
                     doc.severity if severity is None else severity)


def _set(model: Any, name: str) -> bool:
    """The user wrote the field (as opposed to getting the default)."""
    return name in model.model_fields_set


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


_doc("LG903", "error", "Server mode with an empty vllm.gpus: the server has no GPUs.",
     "List the server's GPUs in `vllm.gpus`.")
_doc("LG908", "error", "train.device: cpu with vLLM colocate (in-process vLLM needs GPUs) or with GPU indices.",
     "Use `vllm.mode: server`, remove the `vllm` section, or set `train.device: cuda`.")


@check("LG903")
def server_has_gpus(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if ctx.server_mode and v is not None and v.gpus is not None and not ctx.layout.server_gpus:
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


# === LG2xx tensor/data parallelism and the model =========================================================

_doc("LG201", "error", "tensor_parallel_size x data_parallel_size differs from the server's GPU count.",
     "Make vllm.tensor_parallel_size * vllm.data_parallel_size equal the number of server GPUs.")
_doc("LG202", "error", "A tensor-parallel group would not fit in one node (TP larger than, or not dividing, "
     "the GPUs vLLM gets per node).",
     "Use a vllm.tensor_parallel_size that divides the server GPUs per node (TP across nodes needs Ray); "
     "scale out with data_parallel_size instead.")
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
        yield ctx.issue("LG201", "vllm.tensor_parallel_size",
                        f"tensor_parallel_size {v.tensor_parallel_size} x data_parallel_size "
                        f"{v.data_parallel_size} = {v.tensor_parallel_size * v.data_parallel_size}, "
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
        return  # TP x DP does not match the server GPUs at all: one message, LG201's
    if tp > ctx.spec.slurm.gpus_per_node:
        yield ctx.issue("LG202", "vllm.tensor_parallel_size",
                        f"tensor_parallel_size {tp} is larger than slurm.gpus_per_node "
                        f"{ctx.spec.slurm.gpus_per_node}")
        return
    if v.mode == "server" and ctx.server_gpus:
        per_node = ctx.layout.server_gpus_per_node
        if not ctx.layout.server_tp_fits_node:
            yield ctx.issue("LG202", "vllm.tensor_parallel_size",
                            f"tensor_parallel_size {tp} does not divide the {per_node} server GPU(s) of a node, "
                            "so a TP group would span nodes")


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
    cfg = ctx.model_config
    if cfg is not None and cfg.is_moe:
        return
    what = "a dense model" if cfg is not None else "the model (config.json not reachable; fine if it is MoE)"
    yield ctx.issue("LG205", "vllm.data_parallel_size",
                    f"data_parallel_size {v.data_parallel_size} for {what}: every DP replica joins the weight "
                    "group and dense models gain nothing over tensor parallelism")


def _max_model_len(ctx: Ctx) -> tuple[int | None, str]:
    v = ctx.spec.vllm
    if v is not None and v.max_model_len is not None:
        return v.max_model_len, "vllm.max_model_len"
    mml = ctx.int_arg("generation.vllm_colocate.max_model_len")
    return mml, "train.args.generation.vllm_colocate.max_model_len"


@check("LG206", "LG207")
def max_model_len_fits(ctx: Ctx) -> Iterator[Issue]:
    if ctx.spec.vllm is None:
        return
    mml, path = _max_model_len(ctx)
    if mml is None:
        return
    prompt = ctx.int_arg("data.max_prompt_length")
    completion = ctx.int_arg("generation.max_completion_length", 256)
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


# === LG3xx trainer world, backend, batch ==================================================================

_doc("LG301", "info", "A sharding backend (fsdp / deepspeed) on a single trainer GPU shards nothing.",
     "Use train.backend: ddp for one GPU, or give the trainer more GPUs.")
_doc("LG302", "warning", "deepspeed_zero3 with colocate: every GPU also holds a full vLLM copy of the weights, "
     "so ZeRO-3's memory savings mostly vanish.",
     "Use vllm.mode: server, or raise vllm.tensor_parallel_size so vLLM's copy is sharded too.")
_doc("LG303", "error", "The generation batch is not divisible by num_generations.",
     "Make per_device_train_batch_size x trainer processes x steps_per_generation a multiple of num_generations.")


@check("LG301")
def backend_fits_world(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if t.backend != "ddp" and ctx.world_size == 1:
        yield ctx.issue("LG301", "train.backend",
                        f"backend {t.backend} with a trainer world size of 1 adds overhead and shards nothing")


@check("LG302")
def zero3_with_colocate(ctx: Ctx) -> Iterator[Issue]:
    if ctx.colocate and ctx.spec.train.backend == "deepspeed_zero3" and _tp(ctx) == 1:
        yield ctx.issue("LG302", "train.backend",
                        "deepspeed_zero3 shards the trainer's weights, but colocate with tensor_parallel_size 1 "
                        "keeps a full vLLM copy of them on every GPU")


@check("LG303")
def generation_batch_divisible(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if t.trainer not in ONLINE_TRAINERS or ctx.world_size == 0:
        return
    default_g = 2 if t.trainer in ("rloo", "online_dpo") else 8
    g = ctx.int_arg("num_generations", default_g)
    bs = ctx.int_arg("per_device_train_batch_size", 8)
    gas = ctx.int_arg("gradient_accumulation_steps", 1)
    spg = ctx.int_arg("steps_per_generation", gas)
    if not g or not bs or not spg or g < 1 or bs < 1 or spg < 1:
        return
    batch = bs * ctx.world_size * spg
    if batch % g:
        path = "train.args.num_generations" if ctx.has_arg("num_generations") else "train.args"
        yield ctx.issue("LG303", path,
                        f"generation batch = per_device_train_batch_size {bs} x {ctx.world_size} trainer "
                        f"processes x steps_per_generation {spg} = {batch}, not a multiple of num_generations {g}")


# === LG4xx ports ==========================================================================================

_doc("LG401", "error", "A port is outside 1024-65535.",
     "Use a port from 1024 to 65535 (below 1024 needs root; above 65535 does not exist).")
_doc("LG402", "error", "Two ports that listen on the same host are equal.",
     "Give each port on a host its own number.")
_doc("LG403", "warning", "A port is inside the Linux ephemeral range 32768-60999.",
     "Pick a port below 32768 (outgoing connections can already hold one in the ephemeral range).")
_doc("LG404", "error", "With job.port_offset: job_id the shifted port can exceed 65535.",
     f"Keep every port <= {PORT_MAX - PORT_OFFSET_MAX} when job.port_offset is job_id.")
_doc("LG405", "warning", "With job.port_offset: job_id two ports on a host differ by a multiple of 10, so two "
     "jobs sharing the node can collide.", "Make the ports on a host differ in their last digit.")
_doc("LG406", "warning", "Nodes are shared (slurm.exclusive: false) but ports are fixed.",
     "Set job.port_offset: job_id so jobs sharing a node get distinct ports.")


PORT_NAMES = {
    "main_process": "accelerate main_process_port",
    "server_http": "vLLM HTTP port",
    "group": "weight-transfer group_port",
    "colocate_master": "colocate MASTER_PORT",
    "dp_rpc": "vLLM DP RPC port",
}


def port_uses(ctx: Ctx) -> tuple[Port, ...]:
    """Every port the job listens on, with the node position that binds it (the plan's own resolver)."""
    from launchgen.plan import resolve_ports

    return resolve_ports(ctx.spec)


def _pname(p: Port) -> str:
    return PORT_NAMES.get(p.name, p.name)


@check("LG401", "LG402", "LG403")
def ports_valid_and_distinct(ctx: Ctx) -> Iterator[Issue]:
    uses = port_uses(ctx)
    for u in uses:
        if not PORT_MIN <= u.base <= PORT_MAX:
            yield ctx.issue("LG401", u.spec_path, f"{_pname(u)} {u.base} is outside {PORT_MIN}-{PORT_MAX}")
        elif EPHEMERAL_LOW <= u.base <= EPHEMERAL_HIGH:
            yield ctx.issue("LG403", u.spec_path, f"{_pname(u)} {u.base} is inside the ephemeral range "
                            f"{EPHEMERAL_LOW}-{EPHEMERAL_HIGH}")
    seen: dict[tuple[int, int], Port] = {}
    for u in uses:
        other = seen.get((u.host_position, u.base))
        if other is not None:
            yield ctx.issue("LG402", u.spec_path,
                            f"{_pname(u)} {u.base} equals the {_pname(other)} ({other.spec_path}); both listen "
                            f"on node {u.host_position}")
        else:
            seen[(u.host_position, u.base)] = u
    if ctx.spec.job.port_offset == "job_id":
        yield from _shifted_equal(ctx, uses)


def _shifted_equal(ctx: Ctx, uses: tuple[Port, ...]) -> Iterator[Issue]:
    """Two ports of a host that the job-id shift (with its wrap below the ephemeral range) can make equal."""
    for i, a in enumerate(uses):
        for b in uses[i + 1:]:
            o = ports.same_job_clash(a.base, b.base) if a.host_position == b.host_position else None
            if o is not None:
                yield ctx.issue("LG402", b.spec_path,
                                f"{_pname(b)} {b.base} and the {_pname(a)} {a.base} both become "
                                f"{ports.shift(b.base, o)} at job-id offset {o} (a port shifted to "
                                f"{EPHEMERAL_LOW} or above wraps down by {ports.WRAP})")


@check("LG404", "LG405", "LG406")
def port_offset_safe(ctx: Ctx) -> Iterator[Issue]:
    uses = [u for u in port_uses(ctx) if PORT_MIN <= u.base <= PORT_MAX]
    if ctx.spec.job.port_offset != "job_id":
        if not ctx.spec.slurm.exclusive and uses:
            yield ctx.issue("LG406", "job.port_offset",
                            "slurm.exclusive is false, so another job on the same node can hold "
                            f"{', '.join(str(u.base) for u in uses)}")
        return
    for u in uses:
        top = ports.shifted_range(u.base)[1]
        if top > PORT_MAX:
            yield ctx.issue("LG404", u.spec_path,
                            f"{_pname(u)} {u.base} + the job-id offset (up to {PORT_OFFSET_MAX}) can reach "
                            f"{top} > {PORT_MAX}")
    by_host: dict[int, list[Port]] = {}
    for u in uses:
        by_host.setdefault(u.host_position, []).append(u)
    for host_uses in by_host.values():
        for i, a in enumerate(host_uses):
            for b in host_uses[i + 1:]:
                clash = ports.cross_job_clash(a.base, b.base)
                if clash is not None and ports.same_job_clash(a.base, b.base) is None:
                    d = abs(clash[0] - clash[1]) // PORT_OFFSET_STEP
                    yield ctx.issue("LG405", b.spec_path,
                                    f"{_pname(b)} {b.base} and {_pname(a)} {a.base}: when two jobs' ids differ "
                                    f"by {d} (mod 1000) one's shifted port lands on the other's")


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
    for path in ("generation.vllm_colocate.gpu_memory_utilization", "vllm_gpu_memory_utilization"):
        if ctx.has_arg(path):
            mode = "server" if ctx.server_mode else "not configured"
            yield ctx.issue("LG502", f"train.args.{path}",
                            f"train.args.{path} only applies to colocate mode, but vLLM is {mode}")


@check("LG503")
def vllm_needs_online_trainer(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if ctx.spec.vllm is not None and t.trainer not in ONLINE_TRAINERS:
        yield ctx.issue("LG503", "train.trainer",
                        f"trainer {t.trainer} does not generate, so a vllm section is meaningless "
                        f"(vLLM works with {', '.join(sorted(ONLINE_TRAINERS))})")


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
    elsewhere = _owned_reported_elsewhere(ctx)
    for path, by in owned_args(ctx.spec.train.args):
        if path not in elsewhere:
            yield ctx.issue("LG902", f"train.args.{path}", f"`{path}` is set by launchgen from {by}",
                            f"Remove `train.args.{path}` and set {by} instead.")


# data_parallel_size in colocate is LG904's, nodes/gpus are LG501's
_SERVER_ONLY = ("port", "group_port", "dp_rpc_port", "bind", "extra_args", "health_timeout", "executable")
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
    if ctx.spec.vllm is None and t.trainer in ONLINE_TRAINERS and not ctx.cpu:
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


# === LG6xx kernels and precision ==========================================================================

_doc("LG601", "error", "train.args.model.attn_implementation is malformed or contradicts train.attn_implementation.",
     "Set the attention implementation once, in train.attn_implementation.")
_doc("LG602", "warning", "A Hub kernel without a pinned revision: the build it resolves to changes under you.",
     "Pin it: org/repo@<branch-or-commit>, e.g. kernels-community/flash-attn2@v2.")
_doc("LG603", "error", "kernels-community/flash-attn2 build v3 with CUDA 12.8 fails in the backward pass of "
     "GQA models.", "Pin train.attn_implementation to kernels-community/flash-attn2@v2.")
_doc("LG604", "warning", "flash_attention_2 falls back to the Hub kernel kernels-community/flash-attn2 (unpinned) "
     "when the flash-attn package is missing; with CUDA 12.8 and a GQA model that can be the failing v3 build.",
     "Use train.attn_implementation: kernels-community/flash-attn2@v2, or install flash-attn on the nodes.")
_doc("LG605", "error", "bf16 and fp16 are both true.", "Set one precision: train.precision: bf16 or fp16.")
_doc("LG606", "error", "A bf16/fp16 alias or train.args.precision contradicts train.precision.",
     "Drop the alias and set train.precision only.")
_doc("LG607", "error", "Liger GRPO loss with entropy masking (top_entropy_quantile < 1).",
     "Set top_entropy_quantile to 1.0 or model.liger_grpo_loss: false.")
_doc("LG608", "error", "Liger GRPO loss with a non-token importance_sampling_level.",
     "Set importance_sampling_level: token or model.liger_grpo_loss: false.")
_doc("LG609", "error", "Liger GRPO loss with an entropy bonus.", "Set entropy_coef to 0 or model.liger_grpo_loss: false.")
_doc("LG610", "error", "Liger GRPO loss with off-policy sequence masking.",
     "Remove off_policy_mask_threshold or set model.liger_grpo_loss: false.")

_doc("LG611", "warning", "model.dtype differs from the training precision, so the server samples in another "
     "dtype than the trainer scores log-probs in.", "Leave model.dtype: auto (it follows train.precision).")

FLASH_ATTN2_REPO = "kernels-community/flash-attn2"


def split_kernel(value: str) -> tuple[str, str | None]:
    """`wrapper|org/repo@rev:fn` -> ("org/repo", "rev" or None)."""
    body = value.split("|", 1)[-1].split(":", 1)[0]
    repo, _, rev = body.partition("@")
    return repo, (rev or None)


def is_hub_kernel(value: str | None) -> bool:
    return value is not None and value not in BUILTIN_ATTN and bool(HUB_KERNEL_RE.match(value))


def attn_setting(ctx: Ctx) -> tuple[str | None, str]:
    if ctx.spec.train.attn_implementation is not None:
        return ctx.spec.train.attn_implementation, "train.attn_implementation"
    a = ctx.arg("model.attn_implementation")
    return (a if isinstance(a, str) else None), "train.args.model.attn_implementation"


@check("LG601")
def attn_implementation_args(ctx: Ctx) -> Iterator[Issue]:
    a = ctx.arg("model.attn_implementation")
    if a is None:
        return
    path = "train.args.model.attn_implementation"
    if not isinstance(a, str) or (a not in BUILTIN_ATTN and not HUB_KERNEL_RE.match(a)):
        yield ctx.issue("LG601", path, f"{a!r} is neither a built-in attention implementation "
                        f"({', '.join(sorted(BUILTIN_ATTN))}) nor a Hub kernel org/repo[@revision]")
    elif ctx.spec.train.attn_implementation not in (None, a):
        yield ctx.issue("LG601", path, f"{a!r} contradicts train.attn_implementation "
                        f"{ctx.spec.train.attn_implementation!r}")


@check("LG602")
def hub_kernel_pinned(ctx: Ctx) -> Iterator[Issue]:
    a, path = attn_setting(ctx)
    if a is not None and is_hub_kernel(a):
        _repo, rev = split_kernel(a)
        if rev is None:
            yield ctx.issue("LG602", path, f"Hub kernel {a!r} has no revision; transformers picks its default "
                            "build branch, which changes between releases")


def cuda_is_128(ctx: Ctx) -> bool:
    cv = ctx.spec.train.cuda_version
    return cv is not None and (cv == "12.8" or cv.startswith("12.8."))


@check("LG603", "LG604")
def flash_attn2_v3_gqa(ctx: Ctx) -> Iterator[Issue]:
    a, path = attn_setting(ctx)
    if a is None or not cuda_is_128(ctx):
        return
    cfg = ctx.model_config
    gqa = cfg.is_gqa if cfg is not None else None
    gqa_text = ("a GQA model" if gqa else "a model whose config.json is not reachable (GQA unknown)")
    if gqa is False:
        return
    if a == "flash_attention_2":
        yield ctx.issue("LG604", path, f"flash_attention_2 with CUDA 12.8 and {gqa_text} can fall back to the "
                        "unpinned Hub kernel, whose v3 build fails in the backward pass")
        return
    if not is_hub_kernel(a):
        return
    repo, rev = split_kernel(a)
    if repo != FLASH_ATTN2_REPO or rev not in (None, "v3"):
        return
    build = "build v3" if rev == "v3" else "the default build (v3, or v4 with torch >= 2.10 on transformers >= 5.22)"
    yield ctx.issue("LG603", path, f"{a!r} resolves to {build}; with CUDA 12.8 and {gqa_text} the v3 build "
                    "fails in the backward pass", severity="error" if gqa else "warning")


@check("LG605", "LG606")
def precision_consistent(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    if t.bf16 and t.fp16:
        yield ctx.issue("LG605", "train.fp16", "train.bf16 and train.fp16 are both true")
        return
    explicit = _set(t, "precision")
    for alias in ("bf16", "fp16"):
        val = getattr(t, alias)
        if val and explicit and t.precision != alias:
            yield ctx.issue("LG606", f"train.{alias}", f"train.{alias} is true but train.precision is {t.precision}")
        elif val is False and explicit and t.precision == alias:
            yield ctx.issue("LG606", f"train.{alias}", f"train.{alias} is false but train.precision is {alias}")
    if _args_precision_conflict(ctx):
        yield ctx.issue("LG606", "train.args.precision",
                        f"train.args.precision is {ctx.arg('precision')!r} but train.precision is {t.precision!r}")


def _args_precision_conflict(ctx: Ctx) -> bool:
    ap = ctx.arg("precision")
    return ap is not None and ap != ctx.spec.train.precision


@check("LG611")
def dtype_matches_precision(ctx: Ctx) -> Iterator[Issue]:
    m, t = ctx.spec.model, ctx.spec.train
    if ctx.spec.vllm is None or m.dtype == "auto" or t.bf16 or t.fp16 or t.bf16 is False:
        return  # aliases: resolved by the plan, contradictions are LG605/LG606
    expected = PRECISION_DTYPE[t.precision]
    if m.dtype != expected:
        yield ctx.issue("LG611", "model.dtype",
                        f"model.dtype {m.dtype} but train.precision {t.precision} ({expected}): vLLM generates in "
                        f"{m.dtype} while the trainer computes log-probs in {expected}, widening the mismatch the "
                        "importance-sampling correction absorbs")


def liger_enabled(ctx: Ctx) -> bool:
    return bool(ctx.spec.train.use_liger_kernel or ctx.arg("model.use_liger_kernel") is True)


def liger_fused_loss(ctx: Ctx) -> bool:
    """GRPO's loss is Liger's fused one (use_liger_kernel alone patches the layers; the chunked head keeps the loss)."""
    return liger_enabled(ctx) and ctx.arg("model.liger_grpo_loss") is True


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@check("LG607", "LG608", "LG609", "LG610")
def liger_combinations(ctx: Ctx) -> Iterator[Issue]:
    if not liger_fused_loss(ctx) or ctx.spec.train.trainer != "grpo":
        return
    q = _num(ctx.arg("top_entropy_quantile"))
    if q is not None and q < 1.0:
        yield ctx.issue("LG607", "train.args.top_entropy_quantile",
                        f"top_entropy_quantile {q} masks tokens by entropy, which Liger's fused GRPO loss cannot do")
    level = ctx.arg("importance_sampling_level")
    if level is not None and level != "token":
        yield ctx.issue("LG608", "train.args.importance_sampling_level",
                        f"importance_sampling_level {level!r}: Liger's fused GRPO loss supports token level only")
    coef = _num(ctx.arg("entropy_coef"))
    if coef:
        yield ctx.issue("LG609", "train.args.entropy_coef",
                        f"entropy_coef {coef} adds an entropy bonus, which Liger's fused GRPO loss does not compute")
    if ctx.arg("off_policy_mask_threshold") is not None:
        yield ctx.issue("LG610", "train.args.off_policy_mask_threshold",
                        "off-policy sequence masking is not supported by Liger's fused GRPO loss")


# === LG7xx versions (the spec's declared vLLM version; --live adds the installed ones) =====================

_VERSION_CODES: tuple[tuple[str, Severity, str, str], ...] = (
    ("LG701", "error", "The vLLM version is malformed or older than the native weight-transfer protocol (0.19.1).",
     "Use vLLM 0.19.1 or newer (the seeds' supported window is 0.19.1-0.28.0)."),
    ("LG702", "warning", "The vLLM version is newer than the newest release launchgen knows.",
     "Prefer a known release, or run a short job first."),
    ("LG703", "info", "The vLLM version is outside the seeds' supported window 0.19.1-0.28.0.",
     "Nothing to do if it works; pin inside the window for the documented setup."),
    ("LG704", "info", "The vLLM version is outside trl 1.16's window 0.22.0-0.31.0.",
     "Only relevant when TRL's own trainers talk to this server."),
    ("LG705", "info", "Which weight-transfer protocol generation the vLLM version speaks.", ""),
    ("LG706", "info", "Installed package versions found by --live (or a package missing).",
     "Install the missing package in the job's environment if the job needs it."),
    ("LG707", "error", "kernels is outside the transformers release's kernels window (Hub kernels unavailable).",
     "Install a matching transformers/kernels pair."),
    ("LG708", "error", "liger-kernel is older than 0.8.2.", "pip install 'liger-kernel>=0.8.2'."),
    ("LG709", "warning", "use_liger_kernel is on but liger-kernel is not installed.",
     "Install launchgen[liger] in the job's environment."),
    ("LG710", "error", "vllm.extra_args uses a flag the declared vLLM version does not have.",
     "Remove the flag or raise vllm.version."),
    ("LG711", "error", "--live: the partition does not exist (sinfo lists no nodes for it).",
     "Set slurm.partition to a partition `sinfo -s` lists."),
    ("LG712", "error", "--live: the partition's nodes have fewer GPUs than slurm.gpus_per_node.",
     "Lower slurm.gpus_per_node (and the GPU lists) to what sinfo reports, or pick another partition."),
    ("LG713", "info", "--live: the partition's nodes have more GPUs than slurm.gpus_per_node.",
     "Raise slurm.gpus_per_node to use them, or leave it if the rest is intentional."),
    ("LG714", "error", "--live: the job needs more nodes than the partition has or allows.",
     "Use fewer nodes (train.nodes + vllm.nodes) or a larger partition."),
    ("LG715", "error", "--live: slurm.time exceeds the partition's time limit.",
     "Lower slurm.time to the partition's limit (sinfo -o %l)."),
    ("LG716", "error", "--live: a GPU here cannot run bf16 (compute capability < 8.0).",
     "Use train.precision: fp16 on pre-Ampere GPUs."),
    ("LG717", "warning", "--live: a port of the plan is already in use on this host.",
     "Pick another port, or set job.port_offset: job_id."),
    ("LG718", "error", "--live: offline nodes (HF_HUB_OFFLINE) but the model is not in the local cache.",
     "Download it first (huggingface-cli download) into the cache the nodes use, or use a local path."),
    ("LG719", "error", "--live: offline nodes but the Hub kernel is not in the local cache.",
     "Load the kernel once online (or `kernels download`) into the cache the nodes use."),
    ("LG720", "info", "--live: a probe was skipped (tool missing, timeout, nothing to check).", ""),
    ("LG721", "info", "--live: the build an unpinned kernels-community/flash-attn2 resolves to here.",
     "Pin the revision (@v2) to make it explicit."),
)
for _code, _sev, _title, _fix in _VERSION_CODES:
    _doc(_code, _sev, _title, _fix)


@check("LG701", "LG702", "LG703", "LG704", "LG705", "LG710")
def declared_vllm_version(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None or v.version is None:
        return
    yield from compat.vllm_version_issues(v.version, "vllm.version", source="the spec")
    parsed = compat.parse_version(v.version)
    if parsed is None or v.mode != "server":
        return
    for i, arg in enumerate(v.extra_args):
        if vllm_flag(arg) == "--enable-scale-out" and not compat.vllm_has(parsed, "enable_scale_out"):
            yield ctx.issue("LG710", f"vllm.extra_args.{i}",
                            f"--enable-scale-out exists from vLLM 0.30.0, but vllm.version is {parsed}")


# === LG8xx security and SLURM misc ========================================================================

_doc("LG801", "warning", "vllm.bind widens the dev-mode server to every interface (unauthenticated routes).",
     "Keep vllm.bind: node (the node's cluster address) unless clients outside the cluster network need it.")
_doc("LG802", "error", "vllm.extra_args repeats a flag launchgen generates.",
     "Remove it from vllm.extra_args and set the typed field instead.")
_doc("LG803", "warning", "vllm.health_timeout is too short for a model to load.",
     f"Give the server at least {MIN_HEALTH_TIMEOUT} s (large models take many minutes).")
_doc("LG804", "error", "slurm.signal_grace is not shorter than the time limit.",
     "Make slurm.signal_grace a small part of slurm.time (e.g. 120-600 s), or 0 to disable.")
_doc("LG805", "warning", "slurm.signal_grace is suspicious: more than half the time limit, or too short to "
     "checkpoint.", f"Use a grace between {MIN_SIGNAL_GRACE} s and half of slurm.time.")
_doc("LG806", "info", "max_restarts > 0 but signal_grace is 0, so the job never requeues itself at the time limit.",
     "Set slurm.signal_grace (e.g. 120) to checkpoint and requeue before the limit.")
_doc("LG807", "error", "slurm.env sets a variable launchgen sets per role (CUDA_VISIBLE_DEVICES, "
     "VLLM_SERVER_DEV_MODE, VLLM_HOST_IP, LAUNCHGEN_*, LG_*).",
     "Remove it from slurm.env; launchgen sets it for each role from the spec.")


@check("LG801")
def bind_not_widened(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "server" and v.bind.strip() in WIDE_BINDS:
        yield ctx.issue("LG801", "vllm.bind",
                        f"vllm.bind {v.bind} exposes the dev-mode routes (weight updates, collective_rpc) "
                        "to anyone who can reach the node")


@check("LG802")
def extra_args_not_generated(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is None:
        return
    for i, arg in enumerate(v.extra_args):
        flag = vllm_flag(arg)
        if flag in GENERATED_SERVER_FLAGS:
            owner = GENERATED_SERVER_FLAGS[flag]
            spelled = arg.strip().split(None, 1)[0].split("=", 1)[0]
            also = "" if spelled == flag else f" (vLLM reads {spelled} as {flag})"
            yield ctx.issue("LG802", f"vllm.extra_args.{i}",
                            f"{flag}{also} is generated by launchgen from {owner}; passing it again makes the "
                            "command ambiguous")


@check("LG803")
def health_timeout_sane(ctx: Ctx) -> Iterator[Issue]:
    v = ctx.spec.vllm
    if v is not None and v.mode == "server" and v.health_timeout < MIN_HEALTH_TIMEOUT:
        yield ctx.issue("LG803", "vllm.health_timeout",
                        f"vllm.health_timeout {v.health_timeout} s: the job stops everything if the server is "
                        f"not healthy by then (minimum sensible: {MIN_HEALTH_TIMEOUT} s)")


@check("LG804", "LG805", "LG806")
def signal_grace_sane(ctx: Ctx) -> Iterator[Issue]:
    s = ctx.spec.slurm
    grace, limit = s.signal_grace, s.time_seconds
    if grace == 0:
        if s.max_restarts > 0:
            yield ctx.issue("LG806", "slurm.signal_grace",
                            f"slurm.max_restarts is {s.max_restarts} but signal_grace 0 disables the pre-timeout "
                            "signal that triggers checkpoint and requeue")
        return
    if grace >= limit:
        yield ctx.issue("LG804", "slurm.signal_grace",
                        f"signal_grace {grace} s >= the time limit {s.time} ({limit} s): USR2 would be due before "
                        "the job starts")
    elif grace > limit // 2:
        yield ctx.issue("LG805", "slurm.signal_grace",
                        f"signal_grace {grace} s is more than half the time limit {s.time} ({limit} s)")
    elif grace < MIN_SIGNAL_GRACE:
        yield ctx.issue("LG805", "slurm.signal_grace",
                        f"signal_grace {grace} s leaves too little time to write a checkpoint")


@check("LG807")
def env_not_plan_owned(ctx: Ctx) -> Iterator[Issue]:
    env = ctx.spec.slurm.env
    for role in ("all", "server", "trainer"):
        values: dict[str, str] = getattr(env, role)
        for name in values:
            if name == "VLLM_SERVER_DEV_MODE":
                yield ctx.issue("LG807", f"slurm.env.{role}.{name}",
                                "launchgen enables VLLM_SERVER_DEV_MODE on the server step only (its routes are "
                                f"unauthenticated); slurm.env.{role} must not set it")
            elif is_reserved(name):
                yield ctx.issue("LG807", f"slurm.env.{role}.{name}",
                                f"{name} is set by launchgen for each role; slurm.env.{role} would fight it")


_doc("LG808", "error", "vllm.bind is a loopback address but the trainer reaches the server from another node.",
     "Use vllm.bind: node (the node's cluster address), or share a node with the trainer (vllm.nodes: 0).")

LOOPBACK_PREFIXES = ("127.", "localhost", "::1", "[::1]")


@check("LG808", stage="plan")
def server_reachable(ctx: Ctx) -> Iterator[Issue]:
    plan = ctx.plan
    if plan is None or plan.server is None or not plan.server.bind.strip().startswith(LOOPBACK_PREFIXES):
        return
    leader = plan.server.positions[0]
    for e in plan.endpoints:
        if e.port == "server_http" and e.position == leader and leader != plan.trainer.positions[0]:
            yield ctx.issue("LG808", "vllm.bind",
                            f"the server on node {leader} binds {plan.server.bind}, which accepts connections "
                            f"from that node only, but {e.who} reach it from node {plan.trainer.positions[0]}")
            return


# === codes owned by others, documented here so the list is complete ========================================

for _code, _title, _fix in (
    ("LG000", "The spec file cannot be read.", "Pass the path of an existing, readable spec file."),
    ("LG001", "The spec is not valid YAML, not UTF-8 text, too large (over 1 MiB, or aliases expanding past "
     "100,000 values), recursive, or not a mapping.", "Fix the YAML syntax at that line."),
    ("LG002", "Unknown key.", "Remove the key or correct its spelling (`launchgen schema` lists every field)."),
    ("LG003", "A required field is missing.", "Add the field; `launchgen init` writes a commented starter spec."),
    ("LG004", "A value has the wrong type or is out of range.",
     "Give the field a value of the documented type and range (`launchgen schema`)."),
    ("LG006", "A key appears twice in one mapping (YAML would keep only the last).", "Keep one of the two entries."),
):
    _doc(_code, "error", _title, _fix)
_doc("LG005", "warning", "The vllm section is present but empty (its keys commented out), so there is no vLLM.",
     "Delete the `vllm:` line, or write `vllm: {}` for the server-mode defaults.")


@check("LG005")
def loader_warnings(ctx: Ctx) -> Iterator[Issue]:
    yield from ctx.loaded.warnings


# === running ==============================================================================================


def _locate(issue: Issue, loaded: LoadedSpec) -> Issue:
    line = issue.line if issue.line is not None else loaded.line_of(issue.path)
    return issue.located(issue.file or loaded.path, line)


def _run_stage(ctx: Ctx, stage: Stage) -> list[Issue]:
    out: list[Issue] = []
    for c in CHECKS:
        if c.stage == stage:
            out.extend(_locate(i, ctx.loaded) for i in c.fn(ctx))
    return out


def _without_moot(issues: list[Issue]) -> list[Issue]:
    """With LG503 (a vllm section for a trainer that does not generate) the fix is to delete the section, so
    what else is wrong inside it is noise."""
    if not any(i.code == "LG503" for i in issues):
        return issues
    return [i for i in issues if i.path != "vllm" and not i.path.startswith("vllm.")]


def apply_strict(issues: list[Issue]) -> list[Issue]:
    """`--strict`: every warning becomes an error (infos stay infos)."""
    return [Issue(i.code, i.path, i.message, i.fix, "error", i.line, i.file) if i.severity == "warning" else i
            for i in issues]


_ORDER = {"error": 0, "warning": 1, "info": 2}


def sort_issues(issues: Iterable[Issue]) -> list[Issue]:
    return sorted(issues, key=lambda i: (i.line if i.line is not None else 0, _ORDER[i.severity], i.code, i.path))


def has_errors(issues: Iterable[Issue]) -> bool:
    return any(i.severity == "error" for i in issues)


def run_checks(loaded: LoadedSpec, *, strict: bool = False, env: Mapping[str, str] | None = None,
               files: bool = False) -> tuple[Plan | None, list[Issue]]:
    """Spec checks (and with `files` the checks of the files the spec names, which need only the Spec), then,
    if no spec check is an error, the plan and the plan checks.

    Returns the plan (None when there are errors, strict included) and every issue, sorted by line.
    Plan-resolution SpecErrors become issues; nothing a spec can contain makes this raise.
    """
    ctx = Ctx(loaded, dict(os.environ) if env is None else env)
    issues = _without_moot(_run_stage(ctx, "spec") + (_run_stage(ctx, "files") if files else []))
    if strict:
        issues = apply_strict(issues)
    if any(i.severity == "error" and i.code not in _FILE_CODES for i in issues):
        return None, sort_issues(issues)
    from launchgen.plan import build_plan  # deferred: checks load even where plan cannot be built

    try:
        plan = build_plan(loaded)
    except SpecError as exc:
        return None, sort_issues([*issues, *(_locate(i, loaded) for i in exc.issues)])
    ctx.plan = plan
    plan_issues = [_locate(i, loaded) for i in plan.warnings] + _run_stage(ctx, "plan")
    if strict:
        plan_issues = apply_strict(plan_issues)
    issues.extend(plan_issues)
    return (None if has_errors(issues) else plan), sort_issues(issues)


_RANGES = (
    ("LG0", "Loading the spec (`launchgen/loader.py`)"),
    ("LG1", "GPUs and topology"),
    ("LG2", "Tensor/data parallelism and the model"),
    ("LG3", "Trainer world size, backend, batch, rewards, data"),
    ("LG4", "Ports"),
    ("LG5", "Mode rules (server, colocate, no vLLM)"),
    ("LG6", "Kernels and precision"),
    ("LG7", "Versions and `check --live`"),
    ("LG8", "Security and SLURM"),
)


def codes_markdown() -> str:
    """The LG0xx-LG8xx part of docs/check-codes.md, generated from CODES (a test keeps the file in sync)."""
    out = ["<!-- generated by launchgen.checks.codes_markdown(); edit the _doc() calls in checks.py -->"]
    for prefix, title in _RANGES:
        out.append(f"\n## {prefix}xx: {title}\n")
        out.append("| code | severity | meaning | fix |\n| --- | --- | --- | --- |")
        for code in sorted(c for c in CODES if c.startswith(prefix)):
            d = CODES[code]
            out.append(f"| `{code}` | {d.severity} | {d.title.replace('|', '/')} | {d.fix.replace('|', '/')} |")
    return "\n".join(out) + "\n"


# Checks kept in their own modules register themselves on import; imported last, as they use the registry above.
from launchgen import preflight as _preflight  # noqa: E402,F401
from launchgen import static_checks as _static_checks  # noqa: E402,F401

_FILE_CODES = frozenset(c for chk in CHECKS if chk.stage == "files" for c in chk.codes)
