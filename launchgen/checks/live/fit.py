"""`check --live`: the GPUs' memory (nvidia-smi) for the memory estimate's LG240-LG242."""

from __future__ import annotations

from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.live.command import PROBE_TIMEOUT, ProbeSkipped, Runner
from launchgen.checks.spec.fit import _server, _trainer
from launchgen.planning.estimate_spec import estimate, gpu_memory
from launchgen.shared.issues import Issue


def probe_gpu_memory(ctx: Ctx, runner: Runner) -> Iterator[Issue]:
    """`check --live` on a GPU node: the same judgement with nvidia-smi's memory.total (the smallest GPU here),
    where the spec gave no GPU memory or another one. Silent when nvidia-smi cannot run: the bf16 probe says so."""
    if ctx.cpu:
        return
    try:
        res = runner(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"], PROBE_TIMEOUT)
    except ProbeSkipped:
        return
    mib = [float(x) for x in res.stdout.split() if x.replace(".", "", 1).isdigit()] if res.returncode == 0 else []
    if not mib:
        return
    live = min(mib) / 1024
    static, _ = gpu_memory(ctx.spec)
    if static is not None and abs(static - live) < 0.5:
        return  # the spec-stage checks judged with the same memory
    e = estimate(ctx.spec, ctx.model_config, ctx.trainer_cfg, ctx.layout, live_gpu_gib=live)
    if e.server is not None:
        yield from _server(ctx, e, e.server)
    if e.trainer is not None:
        yield from _trainer(ctx, e, e.trainer)
