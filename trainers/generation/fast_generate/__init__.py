"""Fast plain generation: a preallocated KV cache, CUDA-graph decode steps and on-device sampling.

`model.generate` spends most of its time launching kernels from Python: a 0.5B model decodes at ~26 ms per
step on an H200 while reading its weights takes ~0.2 ms. This backend keeps every decode step on the device:

* one batch for all prompts x generations, left-padded, with a static key/value cache sized once per
  (batch, capacity) shape and reused across calls;
* each decode step (forward, sampling, bookkeeping) is captured once as a CUDA graph per length bucket: the
  attention reads only the first `bucket_end` cache columns, so early steps do not pay for the whole cache;
* sampling (temperature, top-k, top-p, min-p, repetition penalty) runs on the device through the exponential
  race (argmax of p / E with E ~ Exp(1)), which draws exactly from p without a host round trip;
* the host looks at the "every row has ended" flag only every `stop_check_interval` steps, through an event
  recorded that many steps earlier, so the check never drains the GPU's queue.

Two implementations of the decode forward (`decode_path` says which one runs):

* "modules": the model's own decoder modules (`model.get_decoder()`, `model.get_output_embeddings()`) with a
  cache object they write into. Works for any full-attention decoder, but a replayed graph still launches every
  small kernel the modules issue (~55 per layer for a Qwen2: RMSNorm alone is 7-8 elementwise kernels), and at
  ~2.5 us per kernel that, not the weight reads, is what a decode step costs.
* "fused" / "fused+compiled": for decoders of the Llama family (model_type llama, mistral, qwen2, qwen3 whose
  layers have exactly the Llama structure: RMSNorm, q/k/v/o projections with optional q/k/v biases, optional
  Qwen3 q_norm/k_norm, SiLU-gated MLP, full attention) the layer math is re-expressed as one pure function of
  tensors, `_fused_decoder_layer`, which reads the layers' live parameters at call time. Being free of modules
  and Python-int layer indices, one `torch.compile(fullgraph=True, dynamic=False)` graph of it serves every
  layer, and inductor fuses the elementwise work into a handful of kernels per layer. RoPE cos/sin come from the
  model's own `rotary_emb`, so every rope scaling the model supports is honoured. Compiling is the default on
  CUDA only; it happens in the eager warm-up step of each length bucket (one compile per cache shape and bucket),
  never inside graph capture, with inductor's own CUDA graphs off (the whole step is captured here). Any compile
  error logs one warning and decoding continues with the uncompiled fused function. q/k/v and gate/up run as one
  GEMM each over stacked copies of their weights (`weight_copies`: 3 fewer GEMM launches per layer), which live
  in the arena with the KV cache, so they exist only while generating and are re-copied from the live weights at
  the start of every call; each layer's last residual add runs inside the next layer's norm kernel
  (`fused._fused_layer_deferred`). Prefill stays on the modules path (it runs once per call); it writes the same
  cache layout the fused decode reads. Other models, or `decode_impl="modules"`, use the modules path.

  Measured on an H200 (benchmarks/decode_gpu_check.py; random-init bf16, 64 x 32-token prompts, 256 new
  tokens), ms per decode step: Qwen2.5-0.5B shape 3.17 (modules), 3.19 (fused), 1.75 (fused+compiled, 9.5x the
  weights-read floor); 1.5B shape 4.49, 4.49, 2.72 (4.2x). Uncompiled, the fused layer issues the modules' ops in
  their order (bitwise the same on CPU) and is no faster: the gain is inductor's fusion. Compiled kernels keep
  fp32 between fused elementwise ops where eager rounds each one to bf16, so bf16 greedy tokens drift from the
  modules path after some tokens (~15-25 on a random-init model, whose logits are nearly flat), and the sampled
  log-probs sit slightly further from the trainer's recomputation (mean |diff| 0.009 vs 0.008 at 0.5B, 0.022 vs
  0.016 at 1.5B).

Either way the weights are the trainer's live parameters: `sync_weights` has nothing to copy, and an optimizer
that updates parameters in place is seen by the captured graphs (graphs are dropped if a parameter's storage
moves). On CPU the same step runs eagerly (no graphs). Between calls the KV cache's one flat buffer is lent back to
the caching allocator (`keep_cache="lend"`, the default: training reuses the memory, the graphs replay when the
buffer comes back at the same address), held (`True`) or freed with the graphs (`False`); see `state._Arena`.

LoRA (PEFT): the fused path decodes each adapted projection with its merged weight, recomputed into the arena at
the start of every call (`adapters`); variants that do not merge into one weight keep the modules path.

The per-token log-probs it returns are those of the sampled token under `log_softmax(logits * (1/T))` over the
whole vocabulary (before top-k/top-p/min-p filtering), which is what the trainer recomputes.
"""

from .backend import DecodeImpl, FastGenerateBackend

__all__ = ["DecodeImpl", "FastGenerateBackend"]
