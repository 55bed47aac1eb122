"""`FastGenerateBackend`: the `GenerationBackend` over the trainer's own model (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ...dynamo_config import recompile_limit_raised
from ..protocol import GenerationOutput, SamplingParams
from .adapters import adapted_linears
from .attention import _ATTN_NAME, _register_attention
from .fused import LAYER_FUNCTIONS, _fused_final, _fused_spec, _FusedSpec, _LayerWeights
from .recompile import _RECOMPILE_LIMIT, _no_recompile
from .sampling import sample, sampler_key
from .state import _Arena, _SamplerKey, _State, _StaticKV
from .weight_copies import DecodeWeights

if TYPE_CHECKING:
    from launchgen.trainers.declarations.config import TrainerConfig

#: The package's name, so logging is configured for the engine as a whole.
log = logging.getLogger("launchgen.trainers.generation.fast_generate")

DecodeImpl = Literal["auto", "fused", "modules"]
#: Between calls: hold the cache (True), free it and the graphs (False), or lend its memory to training ("lend").
KeepCache = bool | Literal["lend"]


class FastGenerateBackend:
    """GenerationBackend over the trainer's own HF model; see the module docstring for how it is fast.

    Args:
        model: a transformers causal LM (possibly wrapped by accelerate/DDP, or Liger-patched).
        tokenizer: supplies the pad and EOS ids when the model's generation config lacks them.
        accelerator: used only to unwrap the model.
        use_cuda_graphs: default True on CUDA, always False elsewhere.
        length_bucket: cache columns per captured decode graph; smaller buckets read less of the cache early
            on at the cost of more captures.
        stop_check_interval: decode steps between looks at the all-ended flag.
        decode_impl: "auto" takes the fused decode where `_fused_spec` recognises the model (Llama family) and
            the modules path elsewhere; "fused" insists (ValueError for other models); "modules" never fuses.
        compile: torch.compile the fused layer and LM-head functions; None = on CUDA only.
        keep_cache: what happens to the KV cache, the decode state (and LoRA's merged weights) between calls.
            "lend" (default): their one flat buffer goes back to the caching allocator (training reuses it) and is
            taken again next call; the captured graphs are kept and replay when it comes back at the same address,
            else they are recaptured (`state._Arena`). True: held between calls. False: freed with the graphs and
            handed back to the device (`empty_cache`); recaptured every call (0.22 ms per decode step over a
            256-token call at the 0.5B shape on an H200).
        compile_backend: torch.compile backend (inductor; tests use aot_eager, which needs no C++ compiler).
        stack_projections: the fused decode computes q/k/v and gate/up with one GEMM each, over stacked copies of
            those weights held in the arena while generating (`weight_copies`); False reads the projections
            separately (the same function up to GEMM rounding; kept for comparison).
        decode_attention: the fused decode's attention: "sdpa" (default) or "flex" (`fused._flex_attention`,
            FlexAttention's split-KV decoding kernel once compiled; issue 39's experiment).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        accelerator: Any = None,
        *,
        use_cuda_graphs: bool | None = None,
        length_bucket: int = 256,
        stop_check_interval: int = 16,
        capacity_multiple: int = 64,
        decode_impl: DecodeImpl = "auto",
        compile: bool | None = None,
        keep_cache: KeepCache = "lend",
        compile_backend: str | Callable[..., Any] = "inductor",
        stack_projections: bool = True,
        decode_attention: Literal["sdpa", "flex"] = "sdpa",
    ) -> None:
        if decode_impl not in ("auto", "fused", "modules"):
            raise ValueError(f"decode_impl must be 'auto', 'fused' or 'modules', got {decode_impl!r}")
        if keep_cache not in (True, False, "lend"):
            raise ValueError(f"keep_cache must be True, False or 'lend', got {keep_cache!r}")
        if length_bucket < 1 or stop_check_interval < 1 or capacity_multiple < 1:
            raise ValueError("length_bucket, stop_check_interval and capacity_multiple must be >= 1")
        if accelerator is not None and hasattr(accelerator, "unwrap_model"):
            model = accelerator.unwrap_model(model)
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module  # DDP without an accelerator
        # Any: transformers models expose config/generation_config/get_decoder dynamically.
        self.model: Any = model
        self.tokenizer = tokenizer
        self._read_architecture(model)
        self.pad_id, self.eos_ids = _token_ids(model, tokenizer)
        _check_unsharded(model)
        device = next(model.parameters()).device
        self.device = device
        self.amp_dtype = self._autocast_dtype(accelerator)
        self.use_cuda_graphs = (device.type == "cuda") if use_cuda_graphs is None else (
            use_cuda_graphs and device.type == "cuda")
        self.length_bucket = length_bucket
        self.stop_check_interval = stop_check_interval
        self.capacity_multiple = capacity_multiple
        self.keep_cache = keep_cache
        self.stack_projections = stack_projections
        self._layer_eager = LAYER_FUNCTIONS[decode_attention]
        self._choose_decode_path(decode_impl, compile, compile_backend)
        # Live parameters of the fused path, re-read at the start of every call.
        self._weights: list[_LayerWeights] = []

        self.cache = _StaticKV(self.num_layers)
        self.state: _State | None = None
        self._arena: _Arena | None = None
        # LoRA: the adapted projections the fused decode reads merged weights for; those and the stacked
        # projections are the fused decode's weight copies (laid out with the arena, per decode shape).
        self._adapted: list[Any] = adapted_linears(self.decoder) if self._spec is not None else []
        self._copies: DecodeWeights | None = None
        self._pool: Any = None
        self._side_stream: torch.cuda.Stream | None = None
        # Decode steps the last call ran (prefill excluded); lets tests and benchmarks see the early stop.
        self.last_num_steps = 0
        self.graph_captures = 0

    def _read_architecture(self, m: Any) -> None:
        """The decoder and head modules and the cache shape; refuses models this engine cannot decode."""
        decoder = m.get_decoder() if hasattr(m, "get_decoder") else None
        head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
        if decoder is None or head is None:
            raise TypeError(
                f"FastGenerateBackend needs a causal LM with get_decoder() and get_output_embeddings(); "
                f"got {type(m).__name__}. Use generation.backend: hf for other models."
            )
        self.decoder: nn.Module = decoder
        self.lm_head: nn.Module = head
        cfg: Any = m.config.get_text_config() if hasattr(m.config, "get_text_config") else m.config
        self.text_config: Any = cfg
        layer_types = getattr(cfg, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(
                f"FastGenerateBackend supports full-attention decoders only; this model has layer types "
                f"{sorted(set(layer_types))}. Use generation.backend: hf for it."
            )
        self.num_layers = int(cfg.num_hidden_layers)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab = int(cfg.vocab_size)

    def _autocast_dtype(self, accelerator: Any) -> torch.dtype | None:
        """fp32 master weights trained under autocast (model.dtype: auto): generate under the same autocast, or
        decoding would run in fp32. The cast cache stays off: cached casts would be stale after an optimizer
        step and cannot live inside a captured graph."""
        mp = str(getattr(accelerator, "mixed_precision", "no") or "no")
        if next(self.decoder.parameters()).dtype == torch.float32 and mp in ("bf16", "fp16"):
            return torch.bfloat16 if mp == "bf16" else torch.float16
        return None

    def _choose_decode_path(self, decode_impl: DecodeImpl, compile: bool | None,
                            compile_backend: str | Callable[..., Any]) -> None:
        """Which decode forward runs (see the package docstring); the reason is kept for logs and tests."""
        device = self.device
        self._spec: _FusedSpec | None = None
        self.fused_unsupported_reason: str | None = None
        if decode_impl == "modules":
            self.fused_unsupported_reason = "decode_impl='modules'"
        else:
            try:
                found: _FusedSpec | str = _fused_spec(self.decoder, self.lm_head, self.text_config, device)
            except Exception as exc:  # an unexpected module layout is a reason to stay on the modules, not to fail
                found = f"structure check failed ({type(exc).__name__}: {exc})"
            if isinstance(found, str):
                if decode_impl == "fused":
                    raise ValueError(f"decode_impl='fused' cannot run this model: {found}")
                self.fused_unsupported_reason = found
                log.info("FastGenerateBackend: modules decode path (%s)", found)
            else:
                self._spec = found
        # The compiled wrappers once `_compile` succeeds; `_compiled` says whether they are (still) in use.
        self._compiled_layer_fn: Callable[..., Any] = self._layer_eager
        self._compiled_final_fn: Callable[..., torch.Tensor] = _fused_final
        self._compiled = False
        self._patch_recompile_limit = False
        want_compile = (device.type == "cuda") if compile is None else bool(compile)
        if self._spec is not None and want_compile:
            self._compile(compile_backend)
        self.decode_path: str = ("modules" if self._spec is None
                                 else "fused+compiled" if self._compiled else "fused")

    @classmethod
    def from_config(cls, cfg: TrainerConfig, accelerator: Any, model: nn.Module, tokenizer: Any
                    ) -> FastGenerateBackend:
        """The loop's factory signature. Of the trainer config only `generation.keep_kv_cache` tunes this backend;
        its other knobs (graphs, bucket size, stop-check interval, decode path, compile) keep their defaults, which
        suit every size measured in benchmarks/RESULTS.md."""
        return cls(model, tokenizer, accelerator, keep_cache=cfg.generation.keep_kv_cache)

    # ----------------------------------------------------------------------------------------------- API

    def sync_weights(self, named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Nothing to copy: generation runs the trainer's own parameters, which optimizers update in place."""
        for _ in named_params:  # collective callers walk the iterator on every rank; keep that contract
            pass

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        """Drop the cache, the state and with it every captured graph; their private memory pool goes with the
        last graph, and empty_cache hands the blocks back to the device."""
        self.state = None
        self._lend()
        self._copies = None
        self._arena = None
        self._pool = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the freed blocks may still be in use by queued work on other streams
            torch.cuda.empty_cache()

    def _lend(self) -> None:
        """Give the arena's buffer back to the caching allocator; the state keeps its graphs (see `_Arena`)."""
        self.cache.free()
        if self._copies is not None:
            self._copies.unbind()
        self._weights = []
        if self._arena is not None:
            self._arena.give_back()

    @property
    def _merged(self) -> dict[int, torch.Tensor]:
        """id(LoRA module) -> the merged weight the fused decode computes with (while the arena is taken)."""
        c = self._copies
        return c.merged() if c is not None and all(s.tensor is not None for s in c.slots) else {}

    def held_bytes(self) -> int:
        """Device bytes of the arena (KV cache, decode state, merged LoRA weights) held now."""
        a = self._arena
        return a.nbytes if a is not None and a.buf is not None else 0

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        if not prompt_ids:
            return GenerationOutput(prompt_ids=[], completion_ids=[], logprobs=[], finished=[])
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("FastGenerateBackend.generate: every prompt needs at least one token")
        if params.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {params.max_tokens}")
        key = sampler_key(params)
        stop = set(self.eos_ids)
        extra_stop = params.extra.get("stop_token_ids")
        if extra_stop:
            stop.update(int(t) for t in extra_stop)  # type: ignore[attr-defined]
        seed = params.extra.get("seed")
        # A per-request seed (vLLM's meaning) must not reseed the trainer's own random stream: fork it.
        rng: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if seed is not None:
            rng = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])

        was_training = self.model.training
        self.model.eval()  # dropout off, and gradient checkpointing would otherwise drop the cache
        try:
            amp = (torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=False)
                   if self.amp_dtype is not None else contextlib.nullcontext())
            limit = (recompile_limit_raised(_RECOMPILE_LIMIT) if self._compiled and self._patch_recompile_limit
                     else contextlib.nullcontext())
            with rng, torch.inference_mode(), self._maskable_attention(), amp, limit:
                if seed is not None:
                    torch.manual_seed(int(seed))  # type: ignore[call-overload]
                tokens, logprobs, n_steps = self._run(prompt_ids, params.max_tokens, key, sorted(stop))
        finally:
            self.model.train(was_training)
            if self.keep_cache is False:
                self._release()
            elif self.keep_cache == "lend":
                self._lend()
        self.last_num_steps = n_steps

        completions: list[list[int]] = []
        lps: list[list[float | None]] = []
        finished: list[bool] = []
        for row_t, row_l in zip(tokens, logprobs, strict=True):
            end = len(row_t)
            ended = False
            for i, t in enumerate(row_t):
                if t in stop:
                    end, ended = i + 1, True
                    break
            completions.append(row_t[:end])
            lps.append(list(row_l[:end]))
            finished.append(ended)
        return GenerationOutput(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=completions,
            logprobs=lps if params.logprobs else None,
            finished=finished,
        )

    # ------------------------------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _maskable_attention(self) -> Iterator[None]:
        """Route attention through `_gqa_sdpa` (it takes the 4-D additive mask this backend builds)."""
        _register_attention()
        cfgs: list[Any] = list({id(c): c for c in (self.model.config, self.text_config)}.values())
        saved: list[tuple[Any, Any]] = [(c, getattr(c, "_attn_implementation_internal", None)) for c in cfgs]
        try:
            for c, _ in saved:
                c._attn_implementation_internal = _ATTN_NAME
            yield
        finally:
            for c, impl in saved:
                c._attn_implementation_internal = impl

    def _compile(self, backend: str | Callable[..., Any]) -> None:
        """Wrap the fused functions in torch.compile (lazy: dynamo traces on the first call, which is the eager
        warm-up step before any capture). Whole-graph and static-shape: a graph break or a dynamic size would
        put Python or a host sync between kernels that the CUDA graph captures."""
        kw: dict[str, Any] = {"fullgraph": True, "dynamic": False, "backend": backend}
        if backend == "inductor":
            # This backend captures the whole decode step itself; inductor's own graphs would nest inside it.
            kw["options"] = {"triton.cudagraphs": False}
        from launchgen.trainers.dynamo_config import recompile_limit_name

        recompile_limit_name()  # un-hide the limit dynamo reads on every compile
        compile_fn: Any = torch.compile  # Any: the typing overloads lag behind the recompile_limit argument
        try:
            try:
                layer_fn = compile_fn(self._layer_eager, recompile_limit=_RECOMPILE_LIMIT, **kw)
                final_fn = compile_fn(_fused_final, recompile_limit=_RECOMPILE_LIMIT, **kw)
            except TypeError:  # torch before torch.compile(recompile_limit=): raise the global limit per call
                layer_fn = compile_fn(self._layer_eager, **kw)
                final_fn = compile_fn(_fused_final, **kw)
                self._patch_recompile_limit = True
        except Exception as exc:
            log.warning("torch.compile is unavailable (%s: %s); decoding with the uncompiled fused path",
                        type(exc).__name__, exc)
            return
        self._compiled_layer_fn = layer_fn
        self._compiled_final_fn = final_fn
        self._compiled = True

    def _call_fused(self, compiled: Callable[..., Any], eager: Callable[..., Any], *args: Any) -> Any:
        if self._compiled:
            try:
                return compiled(*args)
            except Exception as exc:
                # Dynamo/inductor errors surface at the first call of each shape (compiling is lazy). The fused
                # function only overwrites its own cache columns, so running it again eagerly is safe.
                self._compiled = False
                self.decode_path = "fused"
                log.warning("torch.compile of the fused decode failed (%s: %s); decoding with the uncompiled "
                            "fused path from now on", type(exc).__name__, exc)
        return eager(*args)

    def _weights_key(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _ensure_state(self, batch: int, capacity: int, max_new: int, need_seen: bool) -> _State:
        """The state of this shape, with the arena (KV cache and merged LoRA weights) laid out once per shape and
        taken from the allocator again when it was lent out."""
        st = self.state
        dtype = self.amp_dtype or next(self.decoder.parameters()).dtype
        if not (st is not None and st.batch == batch and st.capacity == capacity and st.max_new == max_new
                and (st.seen is not None or not need_seen) and st.mask.dtype == dtype):
            self._release()
            st = _State(batch, capacity, max_new, self.vocab, dtype, self.device, need_seen)
            self.state = st
            shapes = self.cache.shapes(batch, self.kv_heads, self.head_dim, capacity)
            if self._spec is not None:
                dec: Any = self.decoder
                self._copies = DecodeWeights(list(dec.layers), self._adapted, self.stack_projections, dtype)
                shapes += self._copies.shapes()
            self._arena = _Arena(shapes, dtype, self.device)
            if self.use_cuda_graphs:
                self._pool = torch.cuda.graph_pool_handle()
        arena = self._arena
        assert arena is not None
        if arena.buf is None:
            tensors = arena.take()
            n_kv = 2 * self.num_layers
            self.cache.bind(tensors[:n_kv], capacity)
            if self._copies is not None:
                self._copies.bind(tensors[n_kv:])
        return st

    def _drop_graphs(self, st: _State) -> None:
        """Forget the captured graphs; the next captures go to a fresh memory pool. Capturing into the pool of
        graphs just destroyed trips the caching allocator (its pool is released once the last graph goes:
        "use_count > 0 INTERNAL ASSERT FAILED", and the failed capture leaves the CUDA generator unusable)."""
        st.graphs.clear()
        if self.use_cuda_graphs:
            self._pool = torch.cuda.graph_pool_handle()

    def _logits(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
        )
        hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
        return self.lm_head(hidden[:, -1, :]).float()

    def _fused_logits(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor
                      ) -> torch.Tensor:
        """The decode forward through `_fused_decoder_layer`; same inputs and cache effects as `_logits`."""
        spec = self._spec
        cols = self.cache.write_cols
        if spec is None or cols is None:
            raise RuntimeError("_fused_logits needs a fused spec and the write columns")
        dec: Any = self.decoder
        hidden = dec.embed_tokens(input_ids)
        # The model's own rotary module: every rope type it supports (scaling, attention factor) comes for free.
        cos, sin = dec.rotary_emb(hidden, position_ids)
        # Each layer returns its output as (residual, MLP output); the next one adds them (`_fused_layer_deferred`).
        residual, delta = hidden, torch.zeros_like(hidden)
        for w, k, v in zip(self._weights, self.cache.keys, self.cache.values, strict=True):
            residual, delta = self._call_fused(self._compiled_layer_fn, self._layer_eager,
                                               residual, delta, w, k, v, cols, mask, cos, sin, spec.eps, spec.scaling)
        head: Any = self.lm_head
        logits: torch.Tensor = self._call_fused(self._compiled_final_fn, _fused_final,
                                                residual, delta, dec.norm.weight, head.weight, head.bias, spec.eps)
        return logits

    def _decode_step(self, key: _SamplerKey, st: _State) -> None:
        """Feed `st.cur` at column `st.col`, sample the next token, record it, advance. Graph-capturable."""
        st.mask.index_fill_(3, st.col, 0.0)
        self.cache.write_cols = st.col
        forward = self._fused_logits if self._spec is not None else self._logits
        logits = forward(st.cur[:, None], st.mask[:, :, :, : self.cache.view_len], st.pos[:, None])
        tok, lp = sample(logits, key, st.seen, self.vocab)
        self._record(tok, lp, st.col - st.prompt_len + 1, st)
        st.col.add_(1)
        st.pos.add_(1)

    def _record(self, tok: torch.Tensor, lp: torch.Tensor, out_col: torch.Tensor, st: _State) -> None:
        tok = torch.where(st.done, torch.full_like(tok, self.pad_id), tok)
        lp = torch.where(st.done, torch.zeros_like(lp), lp)
        st.tokens.index_copy_(1, out_col, tok[:, None])
        st.logprobs.index_copy_(1, out_col, lp[:, None])
        if st.seen is not None:
            st.seen.scatter_(1, tok[:, None], True)
        st.done.logical_or_((tok[:, None] == st.stop_ids[None, :]).any(dim=1))
        st.cur.copy_(tok)

    def _run(self, prompt_ids: list[list[int]], max_new: int, key: _SamplerKey, stop: list[int]
             ) -> tuple[list[list[int]], list[list[float]], int]:
        batch = len(prompt_ids)
        plen = max(len(p) for p in prompt_ids)
        # Round the capacity up so small changes in prompt length reuse the cache and the captured graphs.
        need = plen + max_new - 1
        capacity = -(-need // self.capacity_multiple) * self.capacity_multiple
        st = self._ensure_state(batch, capacity, max_new, key.repetition_penalty != 1.0)
        dev = self.device
        copies = self._copies
        if copies is not None:
            copies.refresh()  # the weights (and adapters) as the optimizer left them
            self._weights = copies.layer_weights()
        if self.use_cuda_graphs:
            weights_key = (self._arena.ptr if self._arena is not None else 0, *self._weights_key(),
                           *(t.data_ptr() for t in (copies.held() if copies is not None else [])))
            if weights_key != st.weights_key:
                self._drop_graphs(st)
                st.weights_key = weights_key

        ids = torch.full((batch, plen), self.pad_id, dtype=torch.long)
        valid = torch.zeros(batch, plen, dtype=torch.bool)
        for i, p in enumerate(prompt_ids):
            ids[i, plen - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, plen - len(p):] = True
        ids, valid = ids.to(dev, non_blocking=True), valid.to(dev, non_blocking=True)

        # Reset the per-call state in place (graphs hold these addresses).
        st.done.zero_()
        st.tokens.fill_(self.pad_id)
        st.logprobs.zero_()
        stop_t = torch.tensor(stop or [-1], dtype=torch.long)
        if st.stop_ids.numel() != stop_t.numel():
            st.stop_ids = torch.empty_like(stop_t, device=dev)
            self._drop_graphs(st)  # they read the old buffer's address
        st.stop_ids.copy_(stop_t)
        if st.seen is not None:
            st.seen.zero_()
            st.seen.scatter_(1, ids, True)
        neg = torch.finfo(st.mask.dtype).min
        st.mask.fill_(neg)
        st.mask[:, 0, 0, :plen].masked_fill_(valid, 0.0)
        # Same positions as HF generate: count real tokens; padding gets a harmless 1.
        positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)

        # Prefill (eager): causal within the prompt, padding keys hidden.
        causal = torch.ones(plen, plen, dtype=torch.bool, device=dev).tril()
        allowed = causal[None, None] & valid[:, None, None, :]
        pmask = torch.zeros(batch, 1, plen, plen, dtype=st.mask.dtype, device=dev).masked_fill(~allowed, neg)
        self.cache.write_cols = torch.arange(plen, device=dev)
        self.cache.view_len = plen
        logits = self._logits(ids, pmask, positions)
        tok, lp = sample(logits, key, st.seen, self.vocab)
        st.prompt_len.fill_(plen)
        self._record(tok, lp, torch.zeros(1, dtype=torch.long, device=dev), st)
        st.col.fill_(plen)
        st.pos.copy_(positions[:, -1] + 1)
        del logits, tok, lp, pmask, allowed

        n_steps = 0
        total = max_new - 1
        pending: list[tuple[Any, torch.Tensor]] = []
        while n_steps < total:
            col = plen + n_steps
            if self.use_cuda_graphs or self._compiled:
                # Fixed shapes per bucket: what a captured graph replays, and what keeps a compiled function from
                # recompiling at every step.
                bucket_end = min(capacity, (col // self.length_bucket + 1) * self.length_bucket)
            else:  # eager steps have no fixed shapes to keep: attend to exactly the written columns
                bucket_end = col + 1
            self.cache.view_len = bucket_end
            if self.use_cuda_graphs:
                self._replay_or_capture(key, st, bucket_end)
            else:
                self._decode_step(key, st)
            n_steps += 1
            if n_steps % self.stop_check_interval == 0 and n_steps < total and self._all_done(st, pending):
                break
        tokens = st.tokens[:, : n_steps + 1].cpu().tolist()
        logprobs = st.logprobs[:, : n_steps + 1].cpu().tolist()
        return tokens, logprobs, n_steps

    def _all_done(self, st: _State, pending: list[tuple[Any, torch.Tensor]]) -> bool:
        if self.device.type != "cuda":
            return bool(st.done.all())
        # Enqueue a copy of the flag now; read the one enqueued an interval ago, which the GPU has (almost
        # always) passed already, so the host waits for old work at most and never drains the queue.
        flag = torch.empty(1, dtype=torch.bool, pin_memory=True)
        flag.copy_(st.done.all().reshape(1), non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        pending.append((ev, flag))
        if len(pending) < 2:
            return False
        old_ev, old_flag = pending.pop(0)
        old_ev.synchronize()
        return bool(old_flag.item())

    def _replay_or_capture(self, key: _SamplerKey, st: _State, bucket_end: int) -> None:
        gkey = (key, bucket_end)
        graph = st.graphs.get(gkey)
        if graph is not None:
            graph.replay()
            return
        # First step of this bucket: run it eagerly on a side stream (it is a real step and also the warm-up
        # cuBLAS and the allocator need before capture), then capture the same step for later replays.
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        s = self._side_stream
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self._decode_step(key, st)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        # The eager step above compiled whatever this bucket needs; a compile inside capture would sync with the
        # host and void the capture, so make any would-be recompile raise (the fused call then runs uncompiled).
        no_recompile = _no_recompile() if self._compiled else contextlib.nullcontext()
        try:
            with no_recompile, torch.cuda.graph(graph, pool=self._pool):
                self._decode_step(key, st)
        except Exception as exc:  # a model whose forward syncs with the host cannot be captured
            log.warning("CUDA graph capture failed (%s); decoding eagerly from now on", exc)
            self.use_cuda_graphs = False
            torch.cuda.synchronize()
            return
        # Capture recorded but did not run the step, and the eager step above already advanced the state.
        st.graphs[gkey] = graph
        self.graph_captures += 1


def _token_ids(m: Any, tokenizer: Any) -> tuple[int, list[int]]:
    """(pad id, sorted stop ids) from the model's generation config, else the tokenizer."""
    gen_cfg = getattr(m, "generation_config", None)
    pad = getattr(gen_cfg, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise ValueError("FastGenerateBackend needs a pad or EOS token id: set tokenizer.pad_token")
    eos: set[int] = set()
    for src in (getattr(gen_cfg, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            eos.add(src)
        elif isinstance(src, (list, tuple)):
            eos.update(int(x) for x in src)
    return int(pad[0] if isinstance(pad, list) else pad), sorted(eos)


def _check_unsharded(model: nn.Module) -> None:
    for name, prm in model.named_parameters():
        # ZeRO-3 leaves empty placeholders (ds_numel), FSDP shards (DTensor / flat views): the decode step reads
        # the module's weights directly and needs every one of them whole on this device.
        if prm.numel() == 0 or hasattr(prm, "ds_numel") or type(prm).__name__ == "DTensor":
            raise ValueError(
                f"FastGenerateBackend needs unsharded weights; parameter {name} is sharded (FSDP / DeepSpeed "
                "ZeRO-3). Use generation.backend: hf (it gathers them) or a vLLM backend with sharded training."
            )
