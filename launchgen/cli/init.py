"""`launchgen init [PATH]`: write a commented starter spec for one of the four layouts.

Every starter passes `launchgen check --strict` (a test asserts it), so a user starts from a spec with no
errors and no warnings and changes one thing at a time. Ports are chosen outside the Linux ephemeral range
and with distinct last digits, so turning on `job.port_offset: job_id` later stays clean too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from launchgen.shared.textwidth import line_width, wrap

_HEADER = """\
# launchgen topology spec ({layout}). Reference: `launchgen schema --format markdown`.
# Check it:   launchgen check {path}
# Render it:  launchgen render {path} -o job.sbatch && sbatch job.sbatch
version: 1

job:
  name: {name}
  output_dir: launchgen-runs/%j     # %j = SLURM job id; logs, configs and checkpoints go here

slurm:
  # partition: gpu                  # uncomment and set for your cluster
  # account: my-account
  time: "04:00:00"
  gpus_per_node: 8                  # what each node of the partition has
  gpu_request: gres                 # or gpus-per-node, as your cluster wants GPUs asked for
  exclusive: true
  signal_grace: 300                 # USR2 this many seconds before the limit: checkpoint, then requeue
  max_restarts: 3
  setup:                            # run on every node before anything else
    - source .venv/bin/activate
  # env:
  #   all: {{HF_HUB_OFFLINE: "1"}}    # nodes without internet: the model must be in the HF cache
"""

_TRAIN_ARGS = """\
  args:                             # launchgen.trainers.declarations.config.TrainerConfig fields
    data:
      path: prompts.jsonl           # .jsonl/.json/.parquet: `prompt` + `answer` (for accuracy)
      max_prompt_length: 512
    generation:
      max_completion_length: 1024
    num_generations: 8              # completions per prompt
    per_device_train_batch_size: 8  # completions per GPU per micro-batch
    learning_rate: 1.0e-6
    max_steps: 500
    save_steps: 50
"""

LAYOUTS: dict[str, str] = {
    "single-node-split": """\
model:
  name_or_path: Qwen/Qwen2.5-7B

# One node, 8 GPUs: the vLLM server on GPUs 0-3 (TP=4), the trainers on GPUs 4-7.
vllm:
  mode: server
  nodes: 0                          # 0 = share the first trainer node
  gpus: [0, 1, 2, 3]                # the server's GPUs on that node (the trainer gets the rest)
  tensor_parallel_size: 4           # x data_parallel_size must equal the server's GPUs
  port: 8000                        # HTTP API
  group_port: 29551                 # NCCL weight-transfer rendezvous on trainer rank 0 (outside 32768-60999)
  max_model_len: 2048               # >= max_prompt_length + max_completion_length
  gpu_memory_utilization: 0.9
  health_timeout: 900               # seconds to become healthy before the job gives up

train:
  nodes: 1
  backend: deepspeed_zero2
  main_process_port: 29500
  trainer: grpo
  precision: bf16                   # Ampere or newer; fp16 on older GPUs
  attn_implementation: sdpa         # or a pinned Hub kernel: kernels-community/flash-attn2@v2
""" + _TRAIN_ARGS,
    "multi-node": """\
model:
  name_or_path: Qwen/Qwen2.5-72B

# TRL's 70B recipe: 4 trainer nodes x 8 GPUs with ZeRO-3, plus 1 dedicated server node with TP=8.
vllm:
  mode: server
  nodes: 1                          # dedicated server nodes, placed after the trainer nodes
  tensor_parallel_size: 8           # all 8 GPUs of the server node
  port: 8000
  group_port: 29551                 # the server's workers connect to trainer rank 0 on this port
  max_model_len: 2048
  health_timeout: 1800              # a 72B model takes a while to load

train:
  nodes: 4
  backend: deepspeed_zero3
  main_process_port: 29500
  trainer: grpo
  precision: bf16
  attn_implementation: sdpa
  gradient_checkpointing: true
""" + _TRAIN_ARGS.replace("per_device_train_batch_size: 8 ", "per_device_train_batch_size: 4 "),
    "colocate": """\
model:
  name_or_path: Qwen/Qwen2.5-1.5B

# vLLM runs inside every trainer process, on the trainer's own GPU (no server, no weight transfer).
vllm:
  mode: colocate
  tensor_parallel_size: 1           # must divide the trainer GPUs of a node
  gpu_memory_utilization: 0.3       # fraction of each GPU given to vLLM
  max_model_len: 2048

train:
  nodes: 1
  backend: ddp
  main_process_port: 29500
  colocate_master_port: 29611       # MASTER_PORT of vLLM's external launcher
  trainer: grpo
  precision: bf16
  attn_implementation: sdpa
""" + _TRAIN_ARGS,
    "sft": """\
model:
  name_or_path: Qwen/Qwen2.5-1.5B

# Supervised fine-tuning: no vLLM section (sft does not generate).
train:
  nodes: 1
  backend: ddp
  main_process_port: 29500
  trainer: sft
  precision: bf16
  attn_implementation: sdpa
  args:
    data:
      path: sft.jsonl               # prompt/completion or chat `messages` rows
    per_device_train_batch_size: 8
    learning_rate: 2.0e-5
    max_steps: 1000
    save_steps: 200
""",
}

#: the data file each starter names (relative: resolved from where `check` and the job run) and what it holds
_DATA: dict[str, tuple[str, str]] = {
    "single-node-split": ("prompts.jsonl", "JSONL rows with `prompt` and `answer`"),
    "multi-node": ("prompts.jsonl", "JSONL rows with `prompt` and `answer`"),
    "colocate": ("prompts.jsonl", "JSONL rows with `prompt` and `answer`"),
    "sft": ("sft.jsonl", "JSONL rows with chat `messages`, or `prompt` and `completion`"),
}

HELP = """\
Write a commented starter spec to PATH (default: topology.yaml; `-` for stdout).

\b
Layouts:
  single-node-split  one 8-GPU node: server on GPUs 0-3 (TP 4), trainers 4-7
  multi-node         4 trainer nodes (ZeRO-3) + 1 dedicated server node (TP 8)
  colocate           vLLM inside each trainer process, sharing its GPU
  sft                supervised fine-tuning, no vLLM

\b
Examples:
  launchgen init
  launchgen init big.yaml --layout multi-node
  launchgen init - --layout colocate | less
"""


def starter_spec(layout: str, path: str = "topology.yaml", name: str | None = None) -> str:
    job_name = name or ("sft" if layout == "sft" else f"grpo-{layout}")
    return _HEADER.format(layout=layout, path=path, name=job_name) + "\n" + LAYOUTS[layout]


@click.command("init", help=HELP)
@click.argument("path", default="topology.yaml", type=click.Path(dir_okay=False, path_type=str))
@click.option("--layout", type=click.Choice(list(LAYOUTS)), default="single-node-split", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def command(path: str, layout: str, force: bool) -> None:
    text = starter_spec(layout, "topology.yaml" if path == "-" else path)
    if path == "-":
        click.echo(text, nl=False)
        return
    target = Path(path)
    if target.exists() and not force:
        click.echo(f"launchgen: error: {path} exists; pass --force to overwrite it", err=True)
        raise click.exceptions.Exit(2)
    target.write_text(text)
    data, rows = _DATA[layout]
    if Path(data).exists():
        _say(f"wrote {path} ({layout}); next: launchgen check {path}")
    else:
        # the one thing a starter cannot bring: `check` reads the data's first rows, so it refuses until it exists
        _say(f"wrote {path} ({layout}); add {data} here ({rows}), then: launchgen check {path} "
             "(--no-files checks the spec alone now)")


def _say(text: str) -> None:
    """One message, wrapped at the terminal's width (COLUMNS, else 80 in a pipe), its later lines indented."""
    click.echo("\n".join(wrap(text, line_width(sys.stderr), indent="  ")), err=True)
