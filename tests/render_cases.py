"""Specs every render test walks: the bundled examples plus variants that reach other template branches."""

from __future__ import annotations

from pathlib import Path

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import Plan, bash_issues, build_plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))
SCHEDULERS = ("sbatch", "bash")

_BASE = """
job: {{name: variant{extra_job}}}
model: {{name_or_path: org/model}}
slurm: {slurm}
vllm: {vllm}
train:
  nodes: {train_nodes}
  args: {{data: {{path: d.jsonl}}}}
"""

#: name -> spec text; each exercises a branch the examples do not (DP across nodes, explicit bind, port offset,
#: setup lines + env, cpus/mem/gpu type, requeue off, 0.0.0.0)
VARIANTS: dict[str, str] = {
    "multi-node-dp": _BASE.format(extra_job="", slurm="{cpus_per_task: 16, mem: 500G, gpu_type: h100}",
                                  vllm="{nodes: 2, tensor_parallel_size: 4, data_parallel_size: 4}",
                                  train_nodes=2),
    "shared-bind-any-offset": _BASE.format(
        extra_job=", port_offset: job_id", slurm="{max_restarts: 0, signal_grace: 0, exclusive: false}",
        vllm="{gpus: [0, 1], tensor_parallel_size: 2, bind: 0.0.0.0, extra_args: [--seed, '1']}", train_nodes=1),
    "explicit-bind-setup-env": _BASE.format(
        extra_job="", slurm="{setup: ['module load cuda/12.8', 'export HF_HOME=/scratch/hf'], "
        "env: {all: {A: '1'}, server: {B: 'x y'}, trainer: {C: \"it's\"}}, "
        "extra_directives: ['--constraint=h100']}",
        vllm="{gpus: [4, 5, 6, 7], tensor_parallel_size: 4, bind: 10.0.0.5}", train_nodes=1),
    # a charliecloud image whose path needs quoting; the trainer in its own singularity image with a host variable
    "containers-charliecloud-singularity": """
job: {name: variant}
model: {name_or_path: org/model}
slurm: {max_restarts: 0}
vllm: {gpus: [0, 1, 2, 3], tensor_parallel_size: 4}
container: {runtime: charliecloud, image: "/images/it's a dir", mounts: [/data, /a:/b]}
train:
  container: {runtime: singularity, image: "docker://org/trainer:1", mounts: ["/d:/e:ro"], env: [WANDB_API_KEY],
              extra_args: [--cleanenv]}
  args: {data: {path: d.jsonl}}
""",
    # a heterogeneous job whose server runs in a pyxis image: --het-group and the pyxis options on one srun line
    "hetjob-pyxis": """
job: {name: variant}
model: {name_or_path: org/model}
slurm: {partition: train, max_restarts: 0}
vllm: {nodes: 1, tensor_parallel_size: 8, partition: infer, qos: low,
       container: {runtime: pyxis, image: "nvcr.io#nvidia/vllm:25.09-py3", mounts: ["/data:/data:ro"]}}
train:
  nodes: 2
  args: {data: {path: d.jsonl}}
""",
}


def example_text(name: str) -> str:
    return (ROOT / "examples" / f"{name}.yaml").read_text()


def plan_for(name: str) -> Plan:
    """Plans load from a repo-relative path, so rendered headers do not depend on where tests run."""
    if name in VARIANTS:
        return build_plan(load_spec_text(VARIANTS[name], f"tests/variants/{name}.yaml"))
    return build_plan(load_spec_text(example_text(name), f"examples/{name}.yaml"))


def renderable(name: str, scheduler: str) -> bool:
    return scheduler == "sbatch" or not bash_issues(plan_for(name))
