"""`python -m launchgen.trainers.grpo` with one addition: the colocated engine's weight digests, written to a file.

    python colocate_digest.py DIGESTS.json --config run.yaml      (from the server venv; tests/ on PYTHONPATH)

The bundled entry runs unchanged; when the trainer closes its backend (after the final save) the in-process
engine still holds what the last sync sent, so its model's effective weights (`worker_ext.effective_digests`,
vLLM's names and fused layout) are written first. test_lora.py compares them with the saved merged model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launchgen.trainers.core import Trainer
from launchgen.trainers.generation.vllm_colocate import VLLMColocateBackend
from launchgen.trainers.grpo import main

from vllm_real.worker_ext import effective_digests


def _install(out: Path) -> None:
    close = Trainer.close

    def close_after_digest(self: Trainer) -> None:
        backend = self.backend
        if isinstance(backend, VLLMColocateBackend) and backend.llm is not None:  # the first close frees the engine
            out.write_text(json.dumps(effective_digests(backend._worker().model_runner.get_model())))
        close(self)

    Trainer.close = close_after_digest  # type: ignore[method-assign]


if __name__ == "__main__":
    _install(Path(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
