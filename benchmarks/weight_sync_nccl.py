"""Weight-sync evidence for the vLLM server backend (issue 6): NCCL on GPUs, gloo + FSDP2 sharded gather on CPU.

Modes (run from the repository root; `pip install -e '.[train]'` first):

  cpu-sharded   Runs anywhere. A stand-in `vllm serve` (tests/vllm_standin, gloo receiver) and a trainer of TWO
                processes (torch.distributed gloo group through accelerate's PartialState) whose tiny model is
                sharded with FSDP2 `fully_shard`; both ranks call `VLLMServerBackend.sync_weights` with an iterator
                of `param.full_tensor()` gathers, rank 0 streams. Checks the stand-in's weights equal the gathered
                full weights bit for bit after every sync, and that `generate` gives each rank its own slice.

  gpu           Needs CUDA. Trainer (this process) on --trainer-gpu, stand-in server on --server-gpu receiving over
                torch NCCL (LAUNCHGEN_STANDIN_TRANSPORT=torch-nccl) in vLLM's packed format (1 GiB buffers).
                Qwen2.5-0.5B- and 1.5B-shaped random bf16 models: time per sync, GB/s, bit-exact check, the raw
                NCCL broadcast bandwidth of the same GPU pair for comparison (target >= 70 %), and a receiver
                killed mid-transfer (the trainer must report an error within its timeout). With both on ONE GPU,
                NCCL normally refuses ("Duplicate GPU detected"): the script reports what NCCL said.

Examples:
  python benchmarks/weight_sync_nccl.py cpu-sharded
  python benchmarks/weight_sync_nccl.py gpu --trainer-gpu 0 --server-gpu 1          # nvidia-h200-x2
  python benchmarks/weight_sync_nccl.py gpu --trainer-gpu 0 --server-gpu 0          # one H200: expect refusal

Every result is printed as one `RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

QWEN_SHAPES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-0.5B and -1.5B config.json values (tied embeddings, vocab 151936)
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2},
    # for --cpu-dry-run, which walks this script's GPU code path on CPU with gloo
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
}  # fmt: skip


def result(**kw: Any) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def digest_of(named: list[tuple[str, Any]]) -> dict[str, str]:
    import torch

    return {
        n: hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        for n, t in named
    }


class _Acc:
    def __init__(self, device: Any) -> None:
        self.device = device
        self.is_main_process = True
        self.process_index = 0
        self.num_processes = 1


# -- CPU: two FSDP2 ranks, gloo ---------------------------------------------------------------------------------
def _sharded_worker(rank: int, model_dir: str, server_port: int, group_port: int, master_port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(master_port), LAUNCHGEN_WEIGHT_TRANSPORT="gloo")  # fmt: skip
    import torch
    from accelerate import PartialState
    from launchgen.trainers.declarations.config import TrainerConfig
    from launchgen.trainers.generation.protocol import SamplingParams
    from launchgen.trainers.generation.vllm_server import VLLMServerBackend
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    state = PartialState(cpu=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (2,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cfg = TrainerConfig.model_validate({
        "trainer": "grpo", "output_dir": tempfile.mkdtemp(), "model": {"name_or_path": model_dir},
        "data": {"path": "unused.jsonl"}, "num_generations": 2,
        "generation": {"backend": "vllm_server", "vllm_server": {
            "port": server_port, "group_port": group_port, "health_timeout": 120, "weight_sync_timeout": 120,
            "control_timeout": 60}},
    })  # fmt: skip
    backend = VLLMServerBackend.from_config(cfg, state)
    report: dict[str, Any] = {"rank": rank, "syncs": []}
    for step in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (step + 1))  # acts on the local shard; the full tensor changes consistently
        gathered: list[tuple[str, Any]] = []

        def full_params(keep: list[tuple[str, Any]] = gathered) -> Any:
            for name, p in model.named_parameters():
                full = p.full_tensor() if hasattr(p, "full_tensor") else p  # collective: every rank, same order
                keep.append((name, full.detach().clone()))
                yield name, full

        t0 = time.perf_counter()
        backend.sync_weights(full_params())
        entry: dict[str, Any] = {"step": step, "seconds": round(time.perf_counter() - t0, 4)}
        if rank == 0:
            assert backend.client is not None
            remote = backend.client.collective_rpc("launchgen_weight_digest")[0]
            entry["bit_exact"] = remote == digest_of(gathered)
        report["syncs"].append(entry)
    prompts = [[rank + 5] * 3, [rank + 5] * 3]
    gen = backend.generate(prompts, SamplingParams(max_tokens=3))
    report["own_slice"] = gen.prompt_ids == prompts and len(gen.completion_ids) == 2
    backend.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    state.wait_for_everyone()


def cpu_sharded() -> int:
    import torch.multiprocessing as mp
    from launchgen.trainers.tiny import build_tiny_model
    from vllm_standin.harness import start_standin

    work = Path(tempfile.mkdtemp(prefix="wsync-cpu-"))
    model_dir = build_tiny_model(work / "model", arch="qwen2")
    server = start_standin(model_dir, work, extra_args=["-tp", "2"])
    ok = False
    try:
        t0 = time.perf_counter()
        mp.spawn(_sharded_worker, args=(str(model_dir), server.port, free_port(), free_port(), str(work)), nprocs=2)
        reports = [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]
        exact = all(s.get("bit_exact") for s in reports[0]["syncs"])
        slices = all(r["own_slice"] for r in reports)
        ok = exact and slices
        result(mode="cpu-sharded", fsdp2_ranks=2, server_world_size=2, bit_exact_every_sync=exact,
               each_rank_own_slice=slices, sync_seconds=[s["seconds"] for s in reports[0]["syncs"]],
               wall_seconds=round(time.perf_counter() - t0, 1), ok=ok)  # fmt: skip
    finally:
        server.stop()
    return 0 if ok else 1


# -- GPU: NCCL ---------------------------------------------------------------------------------------------------
def _link_worker(rank: int, gpus: list[int], port: int, size: int, iters: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(gpus[rank])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    pg: Any = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
    buf = torch.ones(size, dtype=torch.uint8, device="cuda")
    opts = dist.BroadcastOptions()
    for _ in range(2):
        pg.broadcast([buf], opts).wait()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        pg.broadcast([buf], opts).wait()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if rank == 0:
        Path(out).write_text(json.dumps({"gb_per_s": size * iters / dt / 1e9}))


def link_bandwidth(trainer_gpu: int, server_gpu: int) -> float | None:
    import torch.multiprocessing as mp

    out = tempfile.mktemp(suffix=".json")
    try:
        mp.spawn(_link_worker, args=([trainer_gpu, server_gpu], free_port(), 1 << 30, 10, out), nprocs=2)
        gbps = float(json.loads(Path(out).read_text())["gb_per_s"])
        result(mode="link", gpus=[trainer_gpu, server_gpu], broadcast_1GiB_gb_per_s=round(gbps, 2))
        return gbps
    except Exception as exc:
        result(mode="link", gpus=[trainer_gpu, server_gpu], error=f"{type(exc).__name__}: {exc}"[:2000])
        return None


def _build_qwen(shape: str, out: Path, device: str = "cuda") -> Any:
    import torch
    from launchgen.trainers.tiny import build_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151936 if shape != "tiny" else 1024, tie_word_embeddings=True, max_position_embeddings=4096, **QWEN_SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = Qwen2ForCausalLM(cfg)
    model = model.to(dtype=torch.bfloat16)
    model.save_pretrained(out)
    build_tokenizer(out)  # any tokenizer: weight sync never decodes
    return model


def gpu(args: argparse.Namespace) -> int:
    import torch
    from launchgen.trainers.generation.vllm_client import VLLMClient
    from launchgen.trainers.generation.vllm_server import VLLMServerBackend
    from launchgen.trainers.generation.weight_transfer import TorchNCCLTransport, chunk_boundaries
    from vllm_standin.harness import start_standin

    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("gpu mode needs CUDA (or --cpu-dry-run to walk the code path with gloo)", file=sys.stderr)
        return 2
    if dry:
        from launchgen.trainers.generation.weight_transfer import GlooTransport

        link = None
        device = torch.device("cpu")
        args.shapes = "tiny"

        def make_transport() -> Any:
            return GlooTransport()

        env = {"LAUNCHGEN_STANDIN_TRANSPORT": "gloo", "LAUNCHGEN_STANDIN_DEVICE": "cpu"}
    else:
        link = link_bandwidth(args.trainer_gpu, args.server_gpu)
        device = torch.device("cuda", args.trainer_gpu)
        torch.cuda.set_device(device)

        def make_transport() -> Any:
            return TorchNCCLTransport(device)

        env = {"LAUNCHGEN_STANDIN_TRANSPORT": "torch-nccl", "LAUNCHGEN_STANDIN_DEVICE": "cuda:0",
               "CUDA_VISIBLE_DEVICES": str(args.server_gpu)}  # fmt: skip
    env["LAUNCHGEN_STANDIN_GROUP_TIMEOUT"] = "120"
    work = Path(tempfile.mkdtemp(prefix="wsync-gpu-"))
    failures = 0
    for shape in args.shapes.split(","):
        model_dir = work / shape
        model = _build_qwen(shape, model_dir, device.type)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        server = start_standin(model_dir, work, extra_args=["--dtype", "bfloat16"], env=env)
        try:
            client = VLLMClient("127.0.0.1", server.port, control_timeout=120)
            backend = VLLMServerBackend(_Acc(device), client=client, transport=make_transport(),
                                        num_generations=2, group_port=free_port(), health_timeout=300,
                                        weight_sync_timeout=args.timeout, control_timeout=120)  # fmt: skip
            try:
                backend.connect()
            except Exception as exc:
                result(mode="gpu", shape=shape, gpus=[args.trainer_gpu, args.server_gpu], connect_error=str(exc)[:3000],
                       server_log_tail=server.log_text()[-2000:])  # fmt: skip
                failures += 1
                continue
            times, transfer = [], []
            for _ in range(args.syncs + 1):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-3)
                if not dry:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                backend.sync_weights(iter(model.named_parameters()))
                times.append(time.perf_counter() - t0)
                transfer.append(backend.last_transfer_seconds)
            steady = times[1:]  # the first sync also learns the metadata (one request per chunk)
            best = min(steady)
            best_transfer = min(transfer[1:])
            exact = client.collective_rpc("launchgen_weight_digest", timeout=600)[0] == digest_of(
                list(model.state_dict().items())
            )
            gbps = nbytes / best / 1e9
            result(mode="gpu", shape=shape, gpus=[args.trainer_gpu, args.server_gpu], bytes=nbytes,
                   first_sync_s=round(times[0], 4), steady_sync_s=[round(t, 4) for t in steady],
                   gb_per_s=round(gbps, 2), transfer_only_s=[round(t, 4) for t in transfer[1:]],
                   transfer_only_gb_per_s=round(nbytes / best_transfer / 1e9, 2) if best_transfer else None,
                   link_gb_per_s=round(link, 2) if link else None,
                   fraction_of_link=round(gbps / link, 3) if link else None, bit_exact=exact)  # fmt: skip
            failures += 0 if exact else 1
            backend.close()
        finally:
            server.stop()
    # receiver killed mid-transfer: after one full sync (metadata learnt), the server dies part-way through the
    # second, streamed one; the trainer must fail within weight_sync_timeout, not hang in NCCL
    shape = args.shapes.split(",")[0]
    model = _build_qwen(shape, work / "kill", device.type)
    buffer = 64 << 20 if not dry else 20_000
    first = len(chunk_boundaries([p.numel() * p.element_size() for p in model.parameters()], buffer))
    die_at = first + max(2, first // 2)
    server = start_standin(work / "kill", work, extra_args=["--dtype", "bfloat16"],
                           env={**env, "LAUNCHGEN_STANDIN_DIE_DURING_UPDATE": str(die_at)})  # fmt: skip
    try:
        backend = VLLMServerBackend(_Acc(device), client=VLLMClient("127.0.0.1", server.port, control_timeout=60),
                                    transport=make_transport(), num_generations=2, group_port=free_port(),
                                    health_timeout=300, weight_sync_timeout=args.timeout, control_timeout=60,
                                    packed_buffer_size_bytes=buffer)  # fmt: skip
        backend.connect()
        backend.sync_weights(iter(model.named_parameters()))
        t0 = time.perf_counter()
        try:
            backend.sync_weights(iter(model.named_parameters()))
            result(mode="gpu-kill", error_raised=False)
            failures += 1
        except Exception as exc:
            dt = time.perf_counter() - t0
            result(mode="gpu-kill", error_raised=True, died_at_chunk=die_at, first_sync_chunks=first,
                   seconds_to_error=round(dt, 2), timeout=args.timeout,
                   within_timeout=dt < args.timeout + 5, error=f"{type(exc).__name__}: {exc}"[:500])  # fmt: skip
    except Exception:
        traceback.print_exc()
        failures += 1
    finally:
        server.stop()
    sys.stdout.flush()
    # A broadcast thread may still sit in NCCL towards the killed peer; do not let interpreter teardown wait on it.
    os._exit(1 if failures else 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    sub.add_parser("cpu-sharded")
    g = sub.add_parser("gpu")
    g.add_argument("--trainer-gpu", type=int, default=0)
    g.add_argument("--server-gpu", type=int, default=1)
    g.add_argument("--shapes", default="0.5b,1.5b")
    g.add_argument("--syncs", type=int, default=5)
    g.add_argument("--timeout", type=float, default=60.0)
    g.add_argument("--cpu-dry-run", action="store_true", help="walk this mode's code path on CPU with gloo, tiny model")
    a = p.parse_args()
    return cpu_sharded() if a.mode == "cpu-sharded" else gpu(a)


if __name__ == "__main__":
    raise SystemExit(main())
