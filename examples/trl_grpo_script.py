"""A TRL GRPO script of the usual shape (TrlParser over ScriptArguments, GRPOConfig and ModelConfig), as TRL's own
`trl/scripts/grpo.py` is written: launchgen runs it unchanged with `train.script` (examples/trl-script.yaml).

The job passes launchgen's flags first (--output_dir, precision, --use_vllm/--vllm_mode and the server's address
when there is a `vllm:` section, --model_name_or_path, --dtype, ...: docs/trl-names.md lists them) and
`train.script_args` after them. Nothing here knows about launchgen: the lifecycle (checkpoint on the pre-timeout
signal, exit 75, resume on requeue, metrics.jsonl, completion marker) is installed around the script.

By hand:  python examples/trl_grpo_script.py --model_name_or_path M --dataset_name examples/data/tiny-math.jsonl \
              --output_dir out --max_steps 2 --use_cpu true
"""

from __future__ import annotations

from typing import Any

from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser


def digits_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """The share of digits in each completion (the tiny model learns to emit them)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def main() -> None:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    training_args.model_init_kwargs = {"revision": model_args.model_revision, "dtype": model_args.dtype,
                                       "attn_implementation": model_args.attn_implementation,
                                       **(training_args.model_init_kwargs or {})}
    # a local .jsonl (or a Hub data set name, on a node with network or a warm cache)
    if script_args.dataset_name.endswith((".jsonl", ".json")):
        dataset = load_dataset("json", data_files=script_args.dataset_name, split=script_args.dataset_train_split)
    else:
        dataset = load_dataset(script_args.dataset_name, split=script_args.dataset_train_split)
    trainer = GRPOTrainer(model=model_args.model_name_or_path, reward_funcs=digits_reward, args=training_args,
                          train_dataset=dataset)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
