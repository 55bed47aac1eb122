"""LG633, LG634, LG637: the accelerate/DeepSpeed files train.distributed names, and the model's stored dtype (the files stage)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from launchgen.checks.context import Ctx
from launchgen.checks.registry import _doc, check
from launchgen.checks.spec.distributed import _D, _DISTRIBUTED_TYPE
from launchgen.input import specfiles
from launchgen.planning.accelerate_config import read_user_config
from launchgen.shared.issues import Issue
from launchgen.shared.precision import resolve_precision

_doc("LG633", "error", "train.distributed.accelerate_config cannot be used: unreadable, not a YAML mapping, or its "
     "distributed_type contradicts train.backend.", "Fix the path (relative paths start at the submit directory) or "
     "the file; train.backend decides the distributed type.")


_doc("LG634", "error", "train.distributed.deepspeed_config needs a DeepSpeed backend and a readable JSON file.",
     "Set train.backend: deepspeed_zero2 or deepspeed_zero3, and fix the path or the file.")


_doc("LG637", "warning", "fp16 training of a model stored in bfloat16: bf16-trained weights and activations can "
     "exceed fp16's range (inf/NaN losses).", "Use train.precision: bf16 (Ampere or newer) or fp32.")


@check("LG633", "LG634", stage="files")
def distributed_files(ctx: Ctx) -> Iterator[Issue]:
    t = ctx.spec.train
    d = t.distributed
    if d.accelerate_config is not None:
        try:
            user = read_user_config(d.accelerate_config)
        except (OSError, ValueError) as e:
            yield ctx.issue("LG633", f"{_D}.accelerate_config", f"cannot read {d.accelerate_config}: {e}")
        else:
            kind = user.get("distributed_type")
            allowed = _DISTRIBUTED_TYPE.get(t.backend, ())
            if t.device == "cuda" and isinstance(kind, str) and kind not in allowed:
                yield ctx.issue("LG633", f"{_D}.accelerate_config",
                                f"{d.accelerate_config} says distributed_type {kind}, train.backend {t.backend} "
                                f"means {' or '.join(allowed)}")
    if d.deepspeed_config is not None:
        path = f"{_D}.deepspeed_config"
        if not t.backend.startswith("deepspeed"):
            yield ctx.issue("LG634", path, f"deepspeed_config with train.backend {t.backend}")
            return
        try:
            data = json.loads(specfiles.read_text(d.deepspeed_config))
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
        except (OSError, ValueError) as e:
            yield ctx.issue("LG634", path, f"cannot read {d.deepspeed_config} as DeepSpeed JSON: {e}")


@check("LG637", stage="files")
def fp16_of_bf16_model(ctx: Ctx) -> Iterator[Issue]:
    if resolve_precision(ctx.spec) != "fp16" or ctx.model_config is None:
        return
    stored = ctx.model_config.data.get("torch_dtype") or ctx.model_config.data.get("dtype")
    if stored == "bfloat16":
        yield ctx.issue("LG637", "train.precision",
                        f"{ctx.spec.model.name_or_path} is stored in bfloat16 ({ctx.model_config.source}); fp16 "
                        "training can overflow")
