"""CPU seconds per optimizer step: each `trl.*` entry beside the bundled trainer of the same name, same tiny model
(built in code), same rows and batch (4 rows/completions per step, 6-token completions, fp32, one process).

A step's time is (wall of a 1+N-step run - wall of a 1-step run) / N, so model loading, set-up and the first
step's warm-up cancel out; each trainer first runs one discarded step, so the process's one-time costs do not
land on the 1-step run. Prints one line per trainer and writes JSON to --out.

    python benchmarks/trl_cpu_steps.py --steps 4 --out trl_cpu_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainers"))

PAIRS = {"grpo": "grpo", "rloo": "rloo", "online_dpo": "online_dpo", "sft": "sft", "dpo": None, "gkd": None}


def _wall(cfg: Any, run: Any) -> float:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    t0 = time.perf_counter()
    rc = run(cfg)
    assert rc == 0, rc
    return time.perf_counter() - t0


def trl_run(tmp: Path, model: Path, name: str, steps: int, tag: str = "") -> float:
    from launchgen.trainers.declarations.trl.config import TrlRunConfig
    from launchgen.trainers.trl.run import run
    from trl_runs import trl_cfg

    d = tmp / f"t-{name}-{steps}{tag}"
    d.mkdir(exist_ok=True)
    cfg = trl_cfg(d, model, name, max_steps=steps)
    return _wall(TrlRunConfig.model_validate(cfg), run)


def bundled_run(tmp: Path, model: Path, name: str, steps: int, tag: str = "") -> float:
    from launchgen.trainers.core import run
    from launchgen.trainers.declarations.configs import parse_trainer_config
    from toy_runs import toy_cfg

    d = tmp / f"b-{name}-{steps}{tag}"
    d.mkdir(exist_ok=True)
    over: dict[str, Any] = {"max_steps": steps, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
                            "report_to": ["jsonl"]}
    if name in ("grpo", "rloo"):
        over["num_generations"] = 4
    if name == "sft":
        rows = d / "chats.jsonl"
        rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i} and 7"},
                                                         {"role": "assistant", "content": f"{i} and 7"}]}) + "\n"
                                for i in range(16)))
        over["data"] = {"path": str(rows)}
        over["max_length"] = 32
    cfg = toy_cfg(d, model, "out", name, **over)
    cfg["generation"]["max_completion_length"] = 6
    return _wall(parse_trainer_config(cfg), run)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="trl_cpu_steps.json")
    a = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from launchgen.trainers.tiny import build_tiny_model

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        model = build_tiny_model(tmp / "model")
        for name, bundled in PAIRS.items():
            row: dict[str, Any] = {}
            # a discarded first run: a trainer's first run in the process pays one-time costs (imports, TRL's
            # lazy modules) that would otherwise land on the 1-step run and can make the difference negative
            trl_run(tmp, model, name, 1, "-warm")
            t1, tn = trl_run(tmp, model, name, 1), trl_run(tmp, model, name, 1 + a.steps)
            row["trl"] = (tn - t1) / a.steps
            if bundled is not None:
                bundled_run(tmp, model, bundled, 1, "-warm")
                b1, bn = bundled_run(tmp, model, bundled, 1), bundled_run(tmp, model, bundled, 1 + a.steps)
                row["bundled"] = (bn - b1) / a.steps
            results[name] = row
            both = f"  bundled {row['bundled']:.3f} s/step" if "bundled" in row else ""
            print(f"trl.{name}: {row['trl']:.3f} s/step{both}", flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
