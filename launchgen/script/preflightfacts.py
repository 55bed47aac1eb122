"""What the in-allocation preflight needs to know that a node cannot: rendered into `steps/preflight.json` beside
`steps/preflight.py` (launchgen.jobside.allocprobe, standard library only, so it carries no launchgen table itself).

* `vllm_flags`: for each release in compat's flag table, the server command's flags that release lacks (empty:
  it accepts them all). The node finds its installed release from package metadata and reads its row here; a
  release without a row makes it run `vllm serve --help=all` instead.
* `routes`: the routes launchgen's client calls, with the release that brought each (compat.VLLM_CLIENT_ROUTES);
  empty for TRL's own trainers, whose client is TRL's.
* `plugin`: the vllm.general_plugins entry point the server's weight-transfer engine needs (gloo), or None.
* `bf16`: the roles that ask for bf16 on GPUs (the trainer's precision, the server's dtype).
* `server_image`: the image a pyxis server runs in (its `vllm` is not on the host the preflight runs on: nothing
  of the server's installation is judged there), or None.
* `trainer_image`: the same for a pyxis trainer (its `accelerate` and Python are inside the image), or None.
* `trainer_modules`: what the trainer's Python must import (`launchgen.jobside.rank`, the trainer's module, `trl` for TRL's
  trainers): the node asks that Python with `importlib.util.find_spec`, which runs none of them.
* `checkpoint_bytes_per_param`: what one checkpoint holds per model parameter (full fine-tuning with a bundled
  trainer: weights and AdamW state, `estimate.checkpoint_bytes_per_param`); None where only the weights' size is
  known to be written (LoRA: the adapters, then the merged model; TRL's trainers). The node multiplies it by the
  parameter count it reads off the model's files.
"""

from __future__ import annotations

import json
import re
from typing import Any

from launchgen.jobside import rank
from launchgen.planning.model import Plan
from launchgen.shared import compat
from launchgen.shared.estimate import checkpoint_bytes_per_param
from launchgen.shared.precision import resolve_precision, server_dtype, trainable_weight_dtype
from launchgen.trainers.declarations.config import TrainerConfig

#: The vllm.general_plugins entry point that registers the gloo weight-transfer engine (pyproject.toml).
GLOO_PLUGIN = "launchgen_gloo"

_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*")


def server_flags(argv: list[str]) -> list[str]:
    """The `--flag` words after `serve` in a server command, as vLLM's help spells them (`_` -> `-`)."""
    if "serve" not in argv:
        return []
    words = argv[argv.index("serve") + 1:]
    return sorted({w.split("=", 1)[0].replace("_", "-") for w in words if _FLAG.fullmatch(w.split("=", 1)[0])})


def trainer_modules(module: str) -> list[str]:
    """What the trainer's interpreter imports to run `module` under the job's rank wrapper."""
    return [rank.__name__, module, *(["trl"] if module.startswith("launchgen.trainers.trl") else [])]


def facts(plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    out: dict[str, Any] = {"vllm_flags": {}, "routes": {}, "plugin": None, "bf16": [], "server_image": None,
                           "trainer_image": None, "trainer_modules": trainer_modules(plan.trainer.module),
                           "checkpoint_bytes_per_param": None}
    tc = plan.trainer.container
    if tc is not None and not tc.prefix:
        out["trainer_image"] = tc.image
    if plan.server is not None:
        c = plan.server.container
        if c is not None and not c.prefix:  # pyxis: the command runs inside the image, srun's options put it there
            out["server_image"] = c.image
        wanted = sorted({f for c in plan.server.commands for f in server_flags([str(w) for w in c.argv])})
        out["vllm_flags"] = {release: [f for f in wanted if f not in known]
                             for release, known in sorted(compat.vllm_serve_flag_table().items())}
        if not plan.trainer.module.startswith("launchgen.trainers.trl"):
            out["routes"] = dict(compat.VLLM_CLIENT_ROUTES)
        if spec.vllm is not None and spec.vllm.transfer_backend == "gloo":
            out["plugin"] = GLOO_PLUGIN
        if spec.vllm is not None and spec.vllm.device == "cuda" and server_dtype(spec) == "bfloat16":
            out["bf16"].append("server")
    if spec.train.device == "cuda" and resolve_precision(spec) == "bf16":
        out["bf16"].append("trainer")
    cfg = plan.trainer.config
    if isinstance(cfg, TrainerConfig) and cfg.peft is None:
        precision = resolve_precision(spec)
        dtype = trainable_weight_dtype(cfg.model.dtype, precision, lora=False, modules_to_save=False)
        out["checkpoint_bytes_per_param"] = checkpoint_bytes_per_param(
            plan.trainer.backend.startswith("deepspeed"), precision, dtype)
    return out


def facts_json(plan: Plan) -> str:
    return json.dumps(facts(plan), indent=1, sort_keys=True) + "\n"
