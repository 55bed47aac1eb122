"""launchgen.allocprobe's probes, in-process on real sockets and files (the SLURM scenarios run them in jobs:
tests/slurm/test_preflight_slurm.py; the --bash ones: test_render_faults.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from launchgen import allocprobe as A


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_probes_both_ways_pass_when_each_end_listens_and_reaches() -> None:
    port = _free_port()
    assert A.tcp_probes([("group", "127.0.0.1", port)], [("group", "127.0.0.1", port)], expect=1, window=5) == []


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
    failures, notes = A.vllm_flags(argv, run)
    assert seen == [["python", "-m", "x", "serve", "--help=all"]]
    assert [(c, "--bogus" in m) for c, m in failures] == [("PF103", True)] and notes == []
    assert A.vllm_flags(argv, lambda cmd: None)[0] == []  # could not run it: a note, not a failure
    assert A.vllm_flags(argv, lambda cmd: "no flags here")[1]


def test_output_dir_must_be_writable_with_room(tmp_path: Path) -> None:
    assert A.output_dir(str(tmp_path / "out"), 1) == []
    assert [c for c, _ in A.output_dir(str(tmp_path / "out"), 1 << 60)] == ["PF105"]
    (tmp_path / "file").write_text("x")
    assert [c for c, _ in A.output_dir(str(tmp_path / "file" / "out"), None)] == ["PF105"]


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
