"""Memory, weight-sync time and GPU-hours before the queue wait: every input and formula of the estimate (issue 26).

Standard library only (`check` and `plan` import it on a login node). The inputs are plain values: a `ModelShape`
(from a local config.json, `hfcache.ModelConfig`, or `estimate.model` in the spec), the GPU's memory (a
`slurm.gpu_type` from `GPU_MEMORY_GIB`, `estimate.gpu_memory_gib`, or nvidia-smi under `check --live`) and the
role's settings; `launchgen.planning.estimate_spec.estimate` gathers them from a spec. The formulas:

* **Server** (vLLM, per TP rank): weights / TP, a runtime reserve (the profile run's activations at the
  scheduler's token budget, sampler logits, CUDA graphs, NCCL and cuBLAS workspaces), and the KV cache: what
  `gpu_memory_utilization` leaves (or `kv_cache_memory_bytes`). KV bytes per token per rank =
  2 (K and V) x layers x ceil(KV heads / TP) x head size x dtype bytes; full-length sequences = KV / (that x
  max_model_len). vLLM refuses to start when not one full-length sequence fits.
* **Trainer** (per process): weights, gradients and AdamW state as launchgen's trainers hold them.
  DDP/FSDP2 keep every tensor in the loaded weight dtype (`precision.trainable_weight_dtype`: fp32 for
  `model.dtype: auto`, bf16 for pure-bf16 training) with the two AdamW moments in the same dtype; DDP adds its
  gradient buckets (accelerate's default `gradient_as_bucket_view=False`). DeepSpeed keeps bf16/fp16 weights and
  gradients plus fp32 master weights and moments (ZeRO's 2 + 2 + 12 bytes per parameter; 4 + 4 + 8 in fp32).
  ZeRO-2 shards gradients and optimizer state, ZeRO-3 and FSDP2 everything, over the trainer's processes, and
  then gather a working set (two decoder layers or the LM head, whichever is larger) in the compute dtype. CPU
  offload moves the optimizer state (and with `offload_params` the weights) off the GPU. LoRA: the frozen base in
  the precision's dtype, the adapters (r x (in + out) per adapted linear) in fp32 with fp32 gradients and moments.
  A reference model (KL with beta != 0 and no LoRA) is one more copy of the weights.
* **Activations** (a rough bound), in elements of the compute dtype (2 bytes under bf16/fp16, 4 in an fp32 run:
  `activation_element_bytes`): with gradient checkpointing each decoder layer's input is kept
  (tokens x hidden x layers elements), without it every layer's activations (`ACT_*_UNITS` below); the peak is
  the larger of the start of the backward pass (all kept activations plus the log-prob head's fp32 tiles,
  `model.logits_chunk_mib` (at most the pass's tokens x vocabulary) x `LOGIT_TILE_COPIES`, or the last layer's
  recomputation and the head's fp32 weight gradient) and its end (all gradients plus the first layer's working
  set): `peak_activation_bytes`. Tokens of a
  pass = per_device_train_batch_size x (prompt + completion), at most `max_tokens_per_forward`. Checked against
  H200 peaks in benchmarks/RESULTS.md, and against the CPU allocator's peak of fp32 runs in
  tests/trainers/test_estimate_cpu.py.
* **Weight sync**: bytes pushed per optimizer step (every parameter, or with LoRA the merged adapted modules:
  vLLM's fused groups q/k/v and gate/up whole) over the link's effective bandwidth (`LINK_GB_PER_S`).
* **GPU-hours**: measured seconds per step x max_steps x GPUs of the allocation / 3600.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from launchgen.shared.modelshape import ModelShape

GIB = 2**30

#: memory.total as nvidia-smi reports it (GiB), by the names sites use in GRES (`gpu:h100:8`). A name matches
#: when one of its words (split at anything but letters and digits) starts with the key, longest key first, so
#: `h100_80gb` and `nvidia_h100_sxm5` are H100s and `a100_40g` picks the 40 GB A100.
GPU_MEMORY_GIB: dict[str, float] = {
    "gb200": 184.0, "b200": 179.1, "b100": 179.1, "h200": 139.8, "gh200": 94.5, "h100nvl": 93.6,
    "h100": 79.6, "h800": 79.6, "a100_40": 39.4, "a10040": 39.4, "a100": 79.2, "a800": 79.2,
    "l40s": 44.99, "l40": 44.99, "a6000": 47.99, "rtxa6000": 47.99, "a40": 44.99, "l4": 22.49, "a10": 22.49,
    "a30": 23.5, "v100_16": 15.77, "v10016": 15.77, "v100": 31.74, "t4": 14.75, "mi300x": 191.5, "mi250x": 63.98,
    "mi250": 63.98, "mi210": 63.98,
}

#: Effective bandwidth of one weight push (GB/s) by link: NCCL from trainer rank 0 to the server's ranks, with the
#: packing copies and vLLM's load_weights. NVLink 4 is 450 GB/s per direction, one InfiniBand NDR port 50 GB/s,
#: a 100 GbE port 12.5 GB/s; the figures allow for the copies and loading on top (the same 100 GB/s NVLink
#: assumption as benchmarks/RESULTS.md's staleness model). `estimate.link_gb_per_s` overrides.
LINK_GB_PER_S: dict[str, float] = {"nvlink": 100.0, "infiniband": 25.0, "ethernet": 5.0}
Link = Literal["nvlink", "infiniband", "ethernet"]

#: Server runtime reserve per GPU (GiB): CUDA context, NCCL and cuBLAS workspaces, CUDA graphs; the profile run's
#: activations and sampler logits are added from the shape (`server_activation_bytes`).
SERVER_RESERVE_GIB = 1.5
#: vLLM's scheduler token budget (max_num_batched_tokens) and sequences (max_num_seqs) its profile run uses.
SERVER_BATCHED_TOKENS = 8192
SERVER_MAX_SEQS = 256
#: Per trainer process, outside the allocator's count: CUDA context, cuBLAS/NCCL workspaces.
TRAINER_RESERVE_GIB = 1.0
#: Activation elements per token per decoder layer, per hidden / KV / intermediate
#: feature (x activation_element_bytes): what autograd keeps for a Llama-family layer (norms, q/k/v, attention
#: output, the SwiGLU MLP's inputs).
#: Fitted to the two runs without gradient checkpointing in benchmarks/RESULTS.md (Qwen2.5-0.5B and 1.5B shapes,
#: compiled layers, 18,432 tokens: 40.0 and 71.8 kB per token per layer); the a-priori 8 / 4 / 4 over-estimated
#: them by 30 %. The runs with checkpointing, which use it for one layer's working set, were not fitted.
ACT_HIDDEN_UNITS = 9.4
ACT_KV_UNITS = 4.0
ACT_INTERMEDIATE_UNITS = 2.3
#: fp32 tiles of the log-prob head alive at once (logits, scaled, log-softmax, its gradient).
LOGIT_TILE_COPIES = 4
#: Above this share of the GPU a role is reported as tight (a warning); above the GPU, as not fitting.
MARGIN = 0.10
#: Prompt tokens assumed when neither data.max_prompt_length nor estimate.prompt_tokens says.
DEFAULT_PROMPT_TOKENS = 512

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TrainBackend = Literal["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"]


# --- GPU ------------------------------------------------------------------------------------------------


def gpu_memory_gib(gpu_type: str) -> float | None:
    """The memory of the GPU `slurm.gpu_type` names (`GPU_MEMORY_GIB`), or None when it is not in the table."""
    low = gpu_type.lower()
    words = [w for w in "".join(c if c.isalnum() else " " for c in low).split() if w]
    joined = "".join(words)
    for key in sorted(GPU_MEMORY_GIB, key=len, reverse=True):
        plain = key.replace("_", "")
        if "_" in key:  # a size variant: the family word followed by the size word (a100_40g, a100-40gb)
            fam, size = key.split("_")
            if any(w.startswith(fam) and (w[len(fam):].startswith(size) or (i + 1 < len(words) and w == fam
                   and words[i + 1].startswith(size))) for i, w in enumerate(words)):
                return GPU_MEMORY_GIB[key]
            continue
        if any(w.startswith(plain) and not w[len(plain):][:1].isdigit() for w in words) or joined == plain:
            return GPU_MEMORY_GIB[key]
    return None


# --- server -----------------------------------------------------------------------------------------------


Verdict = Literal["fits", "tight", "does not fit", "unknown"]


@dataclass(frozen=True)
class Part:
    """One line of a role's per-GPU memory: a name, GiB, and whether it is a rough bound."""

    name: str
    gib: float
    rough: bool = False


@dataclass
class RoleEstimate:
    role: str  # "server" or "trainer"
    setup: str  # e.g. "TP 8, bfloat16" / "deepspeed_zero3 over 32 processes, bf16"
    parts: list[Part]
    gpu_gib: float | None
    budget_gib: float | None  # what the role may use of one GPU (server: utilization x memory)
    notes: list[str] = field(default_factory=list)
    full_sequences: int | None = None  # server: max_model_len sequences the KV cache holds
    max_model_len: int | None = None
    kv_gib: float | None = None
    dtype: str = ""  # server: the engine's dtype

    @property
    def total_gib(self) -> float:
        return sum(p.gib for p in self.parts)

    @property
    def solid_gib(self) -> float:
        """The parts that are not rough bounds (weights, gradients, optimizer state, KV cache)."""
        return sum(p.gib for p in self.parts if not p.rough)

    @property
    def verdict(self) -> Verdict:
        """Server: `does not fit` when the weights and runtime leave no room for one full-length sequence.
        Trainer: `does not fit` when what is not a rough bound alone exceeds the GPU, `tight` when the whole
        estimate (with the rough activations) is within MARGIN of it or over it."""
        if self.budget_gib is None:
            return "unknown"
        if self.role != "trainer":
            if self.total_gib - (self.kv_gib or 0.0) > self.budget_gib:
                return "does not fit"
            if self.full_sequences is not None and self.full_sequences < 1:
                return "does not fit"
            return "tight" if self.full_sequences is not None and self.full_sequences < 2 else "fits"
        if self.solid_gib > self.budget_gib:
            return "does not fit"
        return "tight" if self.total_gib > (1 - MARGIN) * self.budget_gib else "fits"

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "setup": self.setup, "parts": [asdict(p) for p in self.parts],
                "total_gib": round(self.total_gib, 3), "gpu_gib": self.gpu_gib, "budget_gib": self.budget_gib,
                "verdict": self.verdict, "full_sequences": self.full_sequences,
                "max_model_len": self.max_model_len, "kv_gib": None if self.kv_gib is None else round(self.kv_gib, 3),
                "notes": self.notes}


def server_activation_bytes(shape: ModelShape, tp: int, dtype_bytes: int) -> int:
    """vLLM's profile run: one layer's activations at the scheduler's token budget, plus fp32 sampler logits."""
    h, hd = shape.hidden_size, shape.head_size
    qkv = (shape.num_attention_heads + 2 * shape.num_key_value_heads) * hd
    per_token = 4 * h + qkv // tp + 3 * shape.intermediate_size // tp
    return SERVER_BATCHED_TOKENS * per_token * dtype_bytes + SERVER_MAX_SEQS * shape.vocab_size * 4 * 2


def server_estimate(shape: ModelShape, *, tp: int, dtype: str, gpu_gib: float | None, max_model_len: int | None,
                    gpu_memory_utilization: float = 0.9, kv_cache_memory_bytes: int | None = None,
                    pp: int = 1, ep: int | None = None) -> RoleEstimate:
    """One vLLM GPU of a TP x PP replica: weights, runtime reserve, and the KV cache that is left (or that is asked
    for). A pipeline stage holds 1/PP of the weights (its layers; embeddings and head ride along, not counted);
    with expert parallelism over `ep` GPUs (TP x DP) each holds 1/ep of the experts, the rest split by TP."""
    b = DTYPE_BYTES[dtype]
    experts = shape.expert_params() if ep else 0
    weights = ((shape.parameter_count() - experts) / tp + experts / (ep or 1)) * b / pp / GIB
    act = server_activation_bytes(shape, tp, b) / GIB
    parts = [Part("weights", weights), Part("activations + runtime", act + SERVER_RESERVE_GIB, rough=True)]
    length = max_model_len or shape.max_position_embeddings
    per_token = shape.kv_bytes_per_token(b, tp, pp)
    notes: list[str] = []
    if kv_cache_memory_bytes is not None:
        kv = kv_cache_memory_bytes / GIB
        budget = gpu_gib
    elif gpu_gib is not None:
        budget = gpu_memory_utilization * gpu_gib
        kv = max(0.0, budget - weights - act - SERVER_RESERVE_GIB)
    else:
        budget = kv = None
    full = None
    if kv is not None:
        parts.append(Part("KV cache", kv))
        if length:
            full = int(kv * GIB // (per_token * length))
    if max_model_len is None and length:
        notes.append(f"max_model_len unset: vLLM takes the model's {length}")
    setup = f"TP {tp}{f' x PP {pp}' if pp > 1 else ''}{f', EP {ep}' if ep else ''}, {dtype}"
    return RoleEstimate("server", setup, parts, gpu_gib, budget, notes, full, length, kv, dtype)


# --- trainer ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerSetup:
    """What decides a trainer process's memory (spec and trainer config values, resolved)."""

    backend: TrainBackend
    processes: int  # the trainer's world size (sharding degree)
    precision: str  # bf16 / fp16 / fp32
    weight_dtype: str  # the loaded weights' dtype (precision.trainable_weight_dtype)
    offload_optimizer: bool = False
    offload_params: bool = False
    lora_r: int | None = None  # LoRA: rank; None = full fine-tuning
    lora_targets: tuple[str, ...] = ()  # layer linears adapted (peft_config.LAYER_LINEARS names)
    modules_to_save: tuple[str, ...] = ()
    reference_copy: bool = False  # a second, frozen copy of the weights (KL without LoRA)
    gradient_checkpointing: bool = False
    rows: int = 1  # per_device_train_batch_size (completions per micro-batch)
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    completion_tokens: int = 256
    max_tokens_per_forward: int | None = None
    logits_chunk_mib: int = 256
    generation_kv_rows: int = 0  # hf static-cache engine: rows whose KV cache stays allocated while training
    colocated_gib: float = 0.0  # colocated vLLM's share of the GPU (not released during training)

    @property
    def tokens_per_pass(self) -> int:
        t = self.rows * (self.prompt_tokens + self.completion_tokens)
        if self.max_tokens_per_forward is not None:
            t = min(t, max(self.max_tokens_per_forward, self.prompt_tokens + self.completion_tokens))
        return t


def lora_params(shape: ModelShape, r: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: r x (in + out) per adapted linear per layer."""
    linears = shape.layer_linears()
    return shape.num_hidden_layers * sum(r * (linears[t][0] + linears[t][1]) for t in targets if t in linears)


def _module_params(shape: ModelShape, name: str) -> int:
    """Parameters of a `modules_to_save` entry (embed_tokens, a layer linear, a norm)."""
    leaf = name.split(".")[-1]
    if leaf == "embed_tokens":
        return shape.embedding_params()
    for full, (i, o) in shape.layer_linears().items():
        if full.split(".")[-1] == leaf:
            return shape.num_hidden_layers * i * o
    return shape.num_hidden_layers * shape.hidden_size  # a norm


def activation_element_bytes(precision: str) -> int:
    """Bytes of one activation element: the autocast compute dtype (bf16/fp16), or fp32 for an fp32 run, whose
    every kept tensor is twice the size (the ACT_* units count elements)."""
    return 4 if precision == "fp32" else 2


def activation_bytes(shape: ModelShape, s: TrainerSetup) -> tuple[int, int, int]:
    """(checkpointed/kept layer activations, one layer's working set, the log-prob head's working set) bytes of
    one forward/backward pass: a rough bound."""
    t = s.tokens_per_pass
    a = activation_element_bytes(s.precision)
    per_layer = int(a * (ACT_HIDDEN_UNITS * shape.hidden_size + ACT_KV_UNITS * shape.num_key_value_heads
                         * shape.head_size + ACT_INTERMEDIATE_UNITS * shape.intermediate_size))
    kept = t * shape.hidden_size * a if s.gradient_checkpointing else t * per_layer
    # a tile holds at most the pass's whole logits (a short pass never fills model.logits_chunk_mib)
    tile = min(s.logits_chunk_mib * 2**20, t * shape.vocab_size * 4)
    head = LOGIT_TILE_COPIES * tile + t * shape.hidden_size * a * 2
    return kept * shape.num_hidden_layers, t * per_layer, head


def peak_activation_bytes(shape: ModelShape, s: TrainerSetup, grad_bytes: int, head_grad_bytes: int) -> int:
    """What the pass adds to weights + optimizer state at its peak, gradients included (they do not exist yet in
    the forward pass, set_to_none, and are complete once the activations are freed): the larger of the start of
    the backward pass (every kept activation, the head's tiles or the last layer's recomputation with the head's
    fp32 weight gradient) and its end (all gradients, the first layer's working set)."""
    kept, layer, head = activation_bytes(shape, s)
    return max(kept + max(head, layer + head_grad_bytes), grad_bytes + layer)


def full_state_bytes(deepspeed: bool, precision: str, weight_dtype: str) -> tuple[int, int, int]:
    """Bytes per parameter of full fine-tuning's weights, gradients and AdamW state as launchgen's trainers hold
    them: DeepSpeed keeps bf16/fp16 weights and gradients with fp32 master weights and moments (fp32: 4 + 4 + 8),
    DDP/FSDP2 every tensor in the loaded dtype with the two moments in it too."""
    if deepspeed:
        return (4, 4, 8) if precision == "fp32" else (2, 2, 12)
    w = DTYPE_BYTES[weight_dtype]
    return w, w, 2 * w


def checkpoint_bytes_per_param(deepspeed: bool, precision: str, weight_dtype: str) -> int:
    """What one full fine-tuning checkpoint holds per parameter: the weights and the optimizer state (no
    gradients)."""
    pw, _, ow = full_state_bytes(deepspeed, precision, weight_dtype)
    return pw + ow


def trainer_estimate(shape: ModelShape, s: TrainerSetup, gpu_gib: float | None) -> RoleEstimate:
    """One trainer process: weights, gradients, optimizer state and the pass's peak, per the backend."""
    n = max(1, s.processes)
    total = shape.parameter_count()
    w = DTYPE_BYTES[s.weight_dtype]
    compute = activation_element_bytes(s.precision)
    deepspeed = s.backend.startswith("deepspeed")
    shard_params = s.backend in ("fsdp", "deepspeed_zero3")
    shard_grads = s.backend != "ddp"
    parts: list[Part] = []
    notes: list[str] = []
    layer_gather = max(2 * shape.layer_params(), shape.embedding_params()) * compute / GIB

    if s.lora_r is not None:
        adapters = lora_params(shape, s.lora_r, s.lora_targets)
        saved = sum(_module_params(shape, m) for m in s.modules_to_save)
        parts.append(Part("frozen base", (total - saved) * w / (n if shard_params else 1) / GIB))
        # adapters: fp32 weights and both AdamW moments (gradients below); modules_to_save in the loaded dtype
        grad_bytes = (adapters * 4 + saved * w) / (n if shard_grads else 1)
        per = (adapters * 12 + saved * w * 3) / (n if shard_grads else 1)
        parts.append(Part(f"adapters ({adapters / 1e6:.1f} M) + AdamW", per / GIB))
        head_grad = 0
        notes.append(f"LoRA r={s.lora_r}: {(adapters + saved) / 1e6:.1f} M trainable of {total / 1e9:.2f} B "
                     "parameters")
    else:
        pw, gw, ow = full_state_bytes(deepspeed, s.precision, s.weight_dtype)
        on_cpu_params = s.offload_params and shard_params
        parts.append(Part("weights" + (" (on CPU)" if on_cpu_params else ""),
                          0.0 if on_cpu_params else total * pw / (n if shard_params else 1) / GIB))
        grad_bytes = 0 if (on_cpu_params and s.backend == "fsdp") else total * gw / (n if shard_grads else 1)
        if s.backend == "ddp" and n > 1:
            parts.append(Part("DDP gradient buckets", total * gw / GIB))
        offloaded = s.offload_optimizer or (s.backend == "fsdp" and s.offload_params)
        parts.append(Part("AdamW state" + (" (on CPU)" if offloaded else ""),
                          0.0 if offloaded else total * ow / (n if shard_grads else 1) / GIB))
        head_grad = shape.embedding_params() * 4  # the head's weight gradient, summed in fp32
    if shard_params:
        parts.append(Part("gathered layers", layer_gather))
    if s.reference_copy:
        parts.append(Part("reference model", total * (2 if deepspeed else w) / (n if shard_params else 1) / GIB))
    peak = peak_activation_bytes(shape, s, int(grad_bytes), head_grad)
    gc = ", checkpointed" if s.gradient_checkpointing else ""
    parts.insert(1 if s.lora_r is None else 2,
                 Part("gradients" if s.lora_r is None else "adapter gradients", grad_bytes / GIB))
    parts.append(Part(f"activations ({s.tokens_per_pass} tokens/pass{gc})",
                      (peak - grad_bytes) / GIB, rough=True))
    if s.generation_kv_rows:
        kv = s.generation_kv_rows * (s.prompt_tokens + s.completion_tokens) * shape.kv_bytes_per_token(compute)
        parts.append(Part("generation KV cache (hf engine, kept)", kv / GIB))
    parts.append(Part("CUDA context, workspaces", TRAINER_RESERVE_GIB, rough=True))
    budget = None if gpu_gib is None else gpu_gib - s.colocated_gib
    if s.colocated_gib:
        notes.append(f"colocated vLLM holds {s.colocated_gib:.1f} GiB of each GPU")
    offload = [x for x, on in (("optimizer", s.offload_optimizer), ("params", s.offload_params)) if on]
    setup = f"{s.backend} x {n}, {s.precision}, weights {s.weight_dtype}" + (
        f", offload {'+'.join(offload)}" if offload else "")
    return RoleEstimate("trainer", setup, parts, gpu_gib, budget, notes)


def allocated_gib(e: RoleEstimate) -> float:
    """What torch's allocator counts (max_memory_allocated): the total less the CUDA context and workspaces."""
    return e.total_gib - TRAINER_RESERVE_GIB


# --- gradient checkpointing: auto --------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointChoice:
    """What `gradient_checkpointing: auto` chose, and from what: the trainer's estimated peak with checkpointing
    off and on, against the limit (the GPU less a colocated engine's share, or `memory_budget_gib`)."""

    on: bool
    peak_off_gib: float
    peak_on_gib: float
    limit_gib: float
    limit_what: str  # "the 79.6 GiB GPU", "memory_budget_gib 20"

    def describe(self) -> str:
        """One line (plan's summary and the trainer's start-up log say the same)."""
        room, off = f"{1 - MARGIN:.0%} of {self.limit_what}", f"~{self.peak_off_gib:.1f} GiB without it"
        return f"on (auto): {off}, over {room} (~{self.peak_on_gib:.1f} with it)" if self.on else \
            f"off (auto): {off}, within {room}"

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def choose_checkpointing(shape: ModelShape, s: TrainerSetup, gpu_gib: float | None,
                         budget_gib: float | None = None) -> CheckpointChoice | None:
    """`gradient_checkpointing: auto`: on when the trainer's estimated peak with it off is over (1 - MARGIN) of
    the limit, the threshold above which `plan` calls a trainer tight, so auto never picks what the plan would
    warn about. The recomputed forward costs about a quarter of the training phase's FLOPs, paid only where the
    activations would not fit. The limit is `memory_budget_gib` where set (compared with what the allocator
    counts, as the budget means), else the GPU less a colocated engine's share; None when neither is known."""
    off = trainer_estimate(shape, replace(s, gradient_checkpointing=False), gpu_gib)
    on = trainer_estimate(shape, replace(s, gradient_checkpointing=True), gpu_gib)
    if budget_gib is not None:
        peak_off, peak_on, limit = allocated_gib(off), allocated_gib(on), budget_gib
        what = f"memory_budget_gib {budget_gib:g}"
    elif off.budget_gib is not None and gpu_gib is not None:
        peak_off, peak_on, limit = off.total_gib, on.total_gib, off.budget_gib
        what = f"the {gpu_gib:.1f} GiB GPU" + (" less the colocated vLLM" if s.colocated_gib else "")
    else:
        return None
    return CheckpointChoice(peak_off > (1 - MARGIN) * limit, peak_off, peak_on, limit, what)


# --- what to change when it does not fit ---------------------------------------------------------------------


def smallest_tp(shape: ModelShape, *, dtype: str, gpu_gib: float, max_model_len: int | None,
                gpu_memory_utilization: float, kv_cache_memory_bytes: int | None, limit: int,
                pp: int = 1) -> int | None:
    """The smallest TP (a divisor of the attention heads, at most `limit`) whose ranks fit and hold at least one
    full-length sequence beside PP - 1 other pipeline stages, or None when none does."""
    for tp in range(1, limit + 1):
        if shape.num_attention_heads % tp:
            continue
        e = server_estimate(shape, tp=tp, dtype=dtype, gpu_gib=gpu_gib, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
                            pp=pp)
        if e.verdict in ("fits", "tight"):
            return tp
    return None


def trainer_alternatives(shape: ModelShape, s: TrainerSetup, gpu_gib: float) -> list[str]:
    """The changes, cheapest first, after which the trainer fits (what the check's fix names)."""
    tries: list[tuple[str, TrainerSetup]] = []
    lora = dict(lora_r=16, lora_targets=tuple(shape.layer_linears()), modules_to_save=(), reference_copy=False)
    z3 = dict(backend="deepspeed_zero3")
    if s.backend != "deepspeed_zero3":
        tries.append(("train.backend: deepspeed_zero3", _with(s, **z3)))
    if not s.offload_optimizer:
        tries.append(("deepspeed_zero3 + train.distributed.offload_optimizer",
                      _with(s, **z3, offload_optimizer=True)))
    if not s.offload_params:
        tries.append(("deepspeed_zero3 + offload_optimizer + offload_params",
                      _with(s, **z3, offload_optimizer=True, offload_params=True)))
    if s.lora_r is None:
        tries.append(("LoRA (train.args.peft: {r: 16})", _with(s, **lora)))
        if s.backend != "deepspeed_zero3":
            tries.append(("LoRA with deepspeed_zero3", _with(s, **lora, **z3)))
    if not s.gradient_checkpointing:
        tries.append(("train.gradient_checkpointing: true", _with(s, gradient_checkpointing=True)))
    out = []
    for label, t in tries:
        e = trainer_estimate(shape, t, gpu_gib)
        if e.budget_gib is not None and e.total_gib <= e.budget_gib:
            out.append(label)
    return out


def _with(s: TrainerSetup, **changes: Any) -> TrainerSetup:
    return replace(s, **changes)


# --- weight sync and cost ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncEstimate:
    bytes_per_sync: int
    what: str
    link: str
    gb_per_s: float

    @property
    def seconds(self) -> float:
        return self.bytes_per_sync / (self.gb_per_s * 1e9)

    def to_json(self) -> dict[str, Any]:
        return {"bytes_per_sync": self.bytes_per_sync, "what": self.what, "link": self.link,
                "gb_per_s": self.gb_per_s, "seconds": round(self.seconds, 4)}


def sync_bytes(shape: ModelShape, dtype_bytes: int, lora_targets: tuple[str, ...] | None,
               modules_to_save: tuple[str, ...] = (),
               fused_groups: tuple[tuple[str, ...], ...] = ()) -> tuple[int, str]:
    """Bytes one weight sync pushes: every parameter, or the merged adapted modules and the modules_to_save. vLLM
    loads some linears as one fused parameter, so adapting one pushes its whole group (`fused_groups`, leaf names:
    `peft_config.FUSED_GROUPS`, passed in to keep this module free of the trainer package)."""
    if lora_targets is None:
        return shape.parameter_count() * dtype_bytes, "every parameter"
    linears = shape.layer_linears()
    leaves = {t.split(".")[-1] for t in lora_targets}
    for group in fused_groups:
        if leaves & set(group):
            leaves |= set(group)
    per_layer = sum(i * o for name, (i, o) in linears.items() if name.split(".")[-1] in leaves)
    params = shape.num_hidden_layers * per_layer + sum(_module_params(shape, m) for m in modules_to_save)
    return params * dtype_bytes, f"merged LoRA modules ({', '.join(sorted(leaves))})"


def gpu_hours(step_seconds: float, steps: int, gpus: int) -> float:
    return step_seconds * steps * gpus / 3600
