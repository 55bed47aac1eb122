"""Build a tiny random-init causal LM and a byte-level BPE tokenizer trained in-process, saved to a directory.

Nothing is downloaded: tests, the quickstart example and the benchmarks all load their model through the
same `from_pretrained(path)` code path a real run uses, from what this module writes.

    python -m launchgen.trainers.tiny OUT_DIR [--arch qwen2|llama|qwen3_moe] [--hidden 64] [--layers 2] [--vocab 512]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# A small corpus with digits, arithmetic and the chat markers, so the BPE has useful merges for the toy tasks.
_CORPUS = [
    "What is 2 + 3? The answer is \\boxed{5}.",
    "Compute 7 * 6. Final answer: 42",
    "<think>reasoning</think><answer>yes</answer>",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "user: hello assistant: hi there, how can I help?",
] * 50 + [" ".join(str(i) for i in range(200))]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]


def build_tokenizer(out_dir: str | Path, vocab_size: int = 512):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 512,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.02,
) -> Path:
    """Write config.json, weights (safetensors), tokenizer and generation_config.json to `out_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, vocab_size=vocab_size)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        # transformers' default 0.02 makes the random LM head's logits nearly flat; tests that train only
        # adapters on the decoder layers need a head that can express a preference (see tests/trainers/test_lora.py)
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model: Any
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen3_moe":
        # a mixture of experts in every layer (4 experts of half the MLP width, 2 per token), as Qwen3-30B-A3B
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=hidden_size, decoder_sparse_step=1))
    else:
        raise ValueError(f"unknown arch {arch!r} (qwen2, llama or qwen3_moe)")
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out))
    (out / "launchgen-tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}) + "\n")
    return out


def build_tiny_reward_model(out_dir: str | Path, seed: int = 1, hidden_size: int = 32) -> Path:
    """A random-init 1-layer Qwen2 sequence-classification model (one output) with the tiny tokenizer: a reward
    model for `rewards: [{model: PATH}]` on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg.num_labels = 1  # a reward model: one output (a PretrainedConfig attribute the Qwen2Config stub omits)
    Qwen2ForSequenceClassification(cfg).save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "llama", "qwen3_moe"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward-model", action="store_true",
                   help="write a tiny sequence-classification reward model instead (rewards: [{model: OUT_DIR}])")
    a = p.parse_args(argv)
    if a.reward_model:
        print(f"tiny reward model written to {build_tiny_reward_model(a.out_dir, a.seed or 1)}")
        return 0
    out = build_tiny_model(a.out_dir, a.arch, a.hidden, a.layers, a.heads, a.kv_heads, a.vocab, a.seed)
    print(f"tiny {a.arch} model written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
