"""`check --live` probes, against fake `sinfo`/`nvidia-smi` executables on PATH (written here), injected
runners and versions, real sockets, and a real HF-cache layout in a temp dir. With the local SLURM cluster up
(tests/slurm; .ci/run starts it) the sinfo probe also runs against the real `sinfo`.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tools import unwrapped

from launchgen.checks.live import probes as live
from launchgen.checks.live.command import ProbeSkipped, Result, run_command
from launchgen.checks.live.probes import gpus_in_gres, live_checks
from launchgen.cli import main
from launchgen.input.loader import load_spec_text
from launchgen.shared.issues import Issue

SPEC = """\
job: {{name: demo}}
slurm:
  partition: {partition}
  gpus_per_node: {gpn}
  time: "{time}"
model: {{name_or_path: {model}}}
vllm: {{mode: server, nodes: {server_nodes}, tensor_parallel_size: {gpn}, port: {port}, group_port: 29551}}
train:
  nodes: {train_nodes}
  trainer: grpo
  attn_implementation: {attn}
  args: {{data: {{path: d.jsonl}}}}
"""

VERSIONS = {"vllm": None, "torch": "2.13.0", "transformers": "5.22.2", "accelerate": "1.16.0",
            "liger-kernel": None, "kernels": "0.17.2"}


def loaded(**kw: Any) -> Any:
    values = {"partition": "gpu", "gpn": 8, "time": "04:00:00", "model": "org/model", "server_nodes": 1,
              "port": 8000, "train_nodes": 1, "attn": "sdpa"} | kw
    return load_spec_text(SPEC.format(**values), "spec.yaml")


def fake_bin(tmp_path: Path, name: str, script: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return d


def sinfo_script(nodes: str, partitions: str) -> str:
    """A fake sinfo: `-N` lists nodes (%N|%P|%G), otherwise partitions (%P|%s|%l)."""
    return f"""for a in "$@"; do [ "$a" = "-N" ] && {{ printf '%s\\n' {nodes}; exit 0; }}; done
printf '%s\\n' {partitions}
"""


def only(issues: list[Issue], prefix: str = "LG7") -> list[tuple[str, str]]:
    return [(i.code, i.path) for i in issues if i.code.startswith(prefix) and i.code not in ("LG706", "LG720")]


def run_live(ld: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[Issue]:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return live_checks(ld, env=kw.pop("env", {"HF_HOME": str(tmp_path / "hf")}),
                       versions=kw.pop("versions", VERSIONS), is_free=kw.pop("is_free", lambda p: True), **kw)


@pytest.mark.parametrize(("gres", "gpu_type", "n"), [
    ("gpu:8", None, 8), ("gpu:h100:8(S:0-1)", None, 8), ("gpu:h100:8(S:0-1)", "h100", 8),
    ("gpu:a100:4,gpu:v100:2", None, 6), ("gpu:a100:4,gpu:v100:2", "v100", 2), ("(null)", None, 0),
    ("gpu:h100:4(S:0,2),shard:8", None, 4),
])
def test_gres_parsing(gres: str, gpu_type: str | None, n: int) -> None:
    assert gpus_in_gres(gres, gpu_type) == n


def test_partition_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", "exit 0\n")
    issues = run_live(loaded(), tmp_path, monkeypatch)
    hit = [i for i in issues if i.code == "LG711"]
    assert [(i.path, i.line) for i in hit] == [("slurm.partition", 3)]


def test_sinfo_refusing_the_partition_means_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", "echo 'sinfo: error: Invalid partition name specified' >&2; exit 1\n")
    assert only(run_live(loaded(), tmp_path, monkeypatch)) == [("LG711", "slurm.partition")]
    fake_bin(tmp_path, "sinfo", "echo 'slurm_load_partitions: Unable to contact slurm controller' >&2; exit 1\n")
    issues = run_live(loaded(), tmp_path, monkeypatch)
    assert only(issues) == [] and any(i.code == "LG720" and "controller" in i.message for i in issues)


def test_too_few_gpus_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", sinfo_script("'n1|gpu|gpu:4' 'n2|gpu|gpu:4'", "'gpu|1-infinite|infinite'"))
    issues = run_live(loaded(), tmp_path, monkeypatch)
    assert only(issues) == [("LG712", "slurm.gpus_per_node")]
    assert next(i for i in issues if i.code == "LG712").line == 4


def test_matching_partition_is_clean_and_extra_gpus_are_info(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", sinfo_script("'n1|gpu|gpu:h100:8(S:0-1)' 'n2|gpu|gpu:h100:8(S:0-1)'",
                                             "'gpu|1-infinite|2-00:00:00'"))
    assert only(run_live(loaded(), tmp_path, monkeypatch)) == []
    issues = run_live(loaded(gpn=4), tmp_path, monkeypatch)
    assert only(issues) == [("LG713", "slurm.gpus_per_node")]


def test_node_count_and_max_job_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", sinfo_script("'n1|gpu|gpu:8' 'n2|gpu|gpu:8' 'n3|gpu|gpu:8'",
                                             "'gpu|1-2|infinite'"))
    assert only(run_live(loaded(train_nodes=4), tmp_path, monkeypatch)) == [("LG714", "train.nodes")]
    assert only(run_live(loaded(train_nodes=2), tmp_path, monkeypatch)) == [("LG714", "train.nodes")]
    assert only(run_live(loaded(train_nodes=1), tmp_path, monkeypatch)) == []


def test_time_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", sinfo_script("'n1|gpu|gpu:8' 'n2|gpu|gpu:8'", "'gpu|1-infinite|2:00:00'"))
    assert only(run_live(loaded(time="04:00:00"), tmp_path, monkeypatch)) == [("LG715", "slurm.time")]
    assert only(run_live(loaded(time="01:00:00"), tmp_path, monkeypatch)) == []


def test_default_partition_only_without_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = "'a1|debug*|gpu:8' 'a2|debug*|gpu:8' 'b1|big|gpu:4'"
    fake_bin(tmp_path, "sinfo", sinfo_script(nodes, "'debug*|1-infinite|infinite' 'big|1-infinite|infinite'"))
    ld = load_spec_text(SPEC.format(partition="null", gpn=8, time="01:00:00", model="org/m", server_nodes=1,
                                    port=8000, train_nodes=1, attn="sdpa"), "spec.yaml")
    assert only(run_live(ld, tmp_path, monkeypatch)) == []


def test_sinfo_missing_or_hanging_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    issues = run_live(loaded(), tmp_path, monkeypatch)
    skipped = [i for i in issues if i.code == "LG720" and "partition" in i.message]
    assert skipped and "sinfo" in skipped[0].message and skipped[0].severity == "info"
    fake_bin(tmp_path, "sinfo", "/bin/sleep 5\n")
    monkeypatch.setattr(live, "PROBE_TIMEOUT", 0.3)
    started = time.monotonic()
    issues = run_live(loaded(), tmp_path, monkeypatch)
    assert any(i.code == "LG720" and "did not answer" in i.message for i in issues)
    assert time.monotonic() - started < 3, "the timeout must not wait for the hung child"


def test_injected_runner() -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str], timeout: float) -> Result:
        calls.append(argv)
        if argv[0] == "nvidia-smi":
            raise ProbeSkipped("no GPU here")
        return Result(0, "n1|gpu|gpu:8\nn2|gpu|gpu:8\n" if "-N" in argv else "gpu|1-infinite|infinite\n")

    issues = live_checks(loaded(), runner=runner, env={}, versions=VERSIONS, is_free=lambda p: True)
    assert ["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N|%P|%G"] in calls
    assert only(issues) == []
    assert any(i.code == "LG720" and "no GPU here" in i.message for i in issues)


@pytest.mark.parametrize(("caps", "expected"), [("9.0, NVIDIA H100", []), ("7.0, Tesla V100", ["LG716"]),
                                                 ("8.0, A100\n7.5, T4", ["LG716"])])
def test_bf16_compute_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caps: str,
                                 expected: list[str]) -> None:
    fake_bin(tmp_path, "nvidia-smi", f"printf '{caps}\\n'\n")
    issues = run_live(loaded(), tmp_path, monkeypatch)
    assert [i.code for i in issues if i.code == "LG716"] == expected


def test_port_in_use_on_this_host() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen(1)
        busy = s.getsockname()[1]
        # the real bind test for our port; other ports of the plan may be busy on a shared test host
        issues = live_checks(loaded(port=busy), runner=lambda a, t: Result(1, ""), env={}, versions=VERSIONS,
                             is_free=lambda p: live.port_free(p) if p == busy else True)
    hit = [i for i in issues if i.code == "LG717"]
    assert [(i.path, i.line, i.severity) for i in hit] == [("vllm.port", 7, "warning")]


def test_port_probe_applies_the_job_id_offset() -> None:
    text = SPEC.format(partition="gpu", gpn=8, time="01:00:00", model="org/m", server_nodes=1, port=8000,
                       train_nodes=1, attn="sdpa").replace("job: {name: demo}", "job: {name: demo, port_offset: job_id}")
    ld = load_spec_text(text, "s.yaml")
    probed: list[int] = []

    def is_free(p: int) -> bool:
        probed.append(p)
        return p != 29500 + 420

    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env={"SLURM_JOB_ID": "123042"},
                         versions=VERSIONS, is_free=is_free)
    assert sorted(probed) == [8420, 29920, 29971]
    hit = [i for i in issues if i.code == "LG717"]
    assert [i.path for i in hit] == ["train.main_process_port"] and "job 123042" in hit[0].message
    probed.clear()
    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env={}, versions=VERSIONS, is_free=is_free)
    assert probed == [] and any(i.code == "LG720" and "SLURM_JOB_ID" in i.message for i in issues)


def test_offline_model_and_kernel_cache(tmp_path: Path) -> None:
    hub = tmp_path / "hf" / "hub"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    ld = loaded(model="org/model", attn="kernels-community/flash-attn2@v2")
    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env=env, versions=VERSIONS, is_free=lambda p: True)
    assert [(i.code, i.path) for i in issues if i.code in ("LG718", "LG719")] == [
        ("LG718", "model.name_or_path"), ("LG719", "train.attn_implementation")]
    # populate the cache: model snapshot via refs/main, kernel via refs/v2 in the `kernels--` layout
    for folder, ref, extra in (("models--org--model", "main", "config.json"),
                               ("kernels--kernels-community--flash-attn2", "v2", "build.toml")):
        snap = hub / folder / "snapshots" / "c0ffee"
        snap.mkdir(parents=True)
        (snap / extra).write_text("{}")
        (hub / folder / "refs").mkdir()
        (hub / folder / "refs" / ref).write_text("c0ffee\n")
    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env=env, versions=VERSIONS, is_free=lambda p: True)
    assert [i.code for i in issues if i.code in ("LG718", "LG719")] == []
    # a local build named by LOCAL_KERNELS counts as present, even with an empty cache
    local = tmp_path / "fa2-build"
    local.mkdir()
    env2 = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1",
            "LOCAL_KERNELS": f"kernels-community/flash-attn2={local}"}
    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env=env2, versions=VERSIONS, is_free=lambda p: True)
    assert [i.code for i in issues if i.code in ("LG718", "LG719")] == ["LG718"]


def test_offline_declared_in_spec_env(tmp_path: Path) -> None:
    text = SPEC.format(partition="gpu", gpn=8, time="01:00:00", model="org/absent", server_nodes=1, port=8000,
                       train_nodes=1, attn="sdpa").replace("  time:", "  env: {all: {HF_HUB_OFFLINE: '1'}}\n  time:")
    issues = live_checks(load_spec_text(text, "s.yaml"), runner=lambda a, t: Result(1, ""),
                         env={"HF_HOME": str(tmp_path)}, versions=VERSIONS, is_free=lambda p: True)
    hit = [i for i in issues if i.code == "LG718"]
    assert hit and "slurm.env.all.HF_HUB_OFFLINE" in hit[0].message


def test_not_offline_is_skipped() -> None:
    issues = live_checks(loaded(), runner=lambda a, t: Result(1, ""), env={}, versions=VERSIONS,
                         is_free=lambda p: True)
    assert any(i.code == "LG720" and "HF_HUB_OFFLINE" in i.message for i in issues)


def test_versions_and_flash_attn2_resolution(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"num_attention_heads": 32, "num_key_value_heads": 8}')
    ld = loaded(model=str(model), attn="kernels-community/flash-attn2")
    versions = {**VERSIONS, "transformers": "5.24.0", "torch": "2.9.0", "kernels": "0.17.2"}
    issues = live_checks(ld, runner=lambda a, t: Result(1, ""), env={}, versions=versions, is_free=lambda p: True)
    assert ("LG707", "train.attn_implementation") in only(issues)
    assert ("LG721", "train.attn_implementation") in only(issues)  # v3, but no CUDA 12.8 declared
    text = SPEC.format(partition="gpu", gpn=8, time="01:00:00", model=str(model), server_nodes=1, port=8000,
                       train_nodes=1, attn="kernels-community/flash-attn2").replace(
        "  trainer: grpo", "  trainer: grpo\n  cuda_version: '12.8'")
    issues = live_checks(load_spec_text(text, "s.yaml"), runner=lambda a, t: Result(1, ""), env={},
                         versions=versions, is_free=lambda p: True)
    assert [i.severity for i in issues if i.code == "LG603" and "transformers 5.24.0" in i.message] == ["error"]


def test_check_live_cli_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')  # check peeks at the data
    fake_bin(tmp_path, "sinfo", sinfo_script("'n1|gpu|gpu:4'", "'gpu|1-infinite|infinite'"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(partition="gpu", gpn=8, time="01:00:00", model="org/m", server_nodes=1,
                                port=8000, train_nodes=1, attn="sdpa"))
    env = {"PATH": str(tmp_path / "bin"), "HF_HOME": str(tmp_path / "hf")}
    r = CliRunner().invoke(main, ["check", str(spec)], env=env)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", "--live", str(spec)], env=env)
    assert r.exit_code == 2 and "error LG712 [slurm.gpus_per_node]" in unwrapped(r.stderr)


def _real_sinfo() -> str | None:
    if shutil.which("sinfo") is None:
        return None
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = [ln.strip().rstrip("*") for ln in p.stdout.splitlines() if ln.strip()]
    return parts[0] if p.returncode == 0 and parts else None


@pytest.mark.slurm
def test_real_sinfo_from_local_cluster() -> None:
    partition = _real_sinfo()
    if partition is None:
        pytest.skip("no local SLURM cluster (tests/slurm starts one in CI)")
    info = live.query_partition(partition, None, run_command)
    assert info.nodes, "sinfo listed no nodes"
    gpn = max(info.nodes.values())
    assert gpn > 0
    ok = live_checks(loaded(partition=partition, gpn=gpn, server_nodes=1, train_nodes=1), env=dict(os.environ),
                     versions=VERSIONS, is_free=lambda p: True)
    assert not [i for i in ok if i.code in ("LG711", "LG712")]
    too_many = live_checks(loaded(partition=partition, gpn=min(gpn * 2, 64)), env=dict(os.environ),
                           versions=VERSIONS, is_free=lambda p: True)
    assert [i.code for i in too_many if i.code == "LG712"] == ["LG712"]
    absent = live_checks(loaded(partition="no-such-partition-xyz"), env=dict(os.environ), versions=VERSIONS,
                         is_free=lambda p: True)
    assert any(i.code in ("LG711", "LG720") for i in absent)


def test_bf16_probe_skipped_when_not_training_in_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "nvidia-smi", "printf '7.0, Tesla V100\\n'\n")
    text = SPEC.format(partition="gpu", gpn=8, time="01:00:00", model="org/m", server_nodes=1, port=8000,
                       train_nodes=1, attn="sdpa").replace("  trainer: grpo", "  trainer: grpo\n  fp16: true")
    issues = run_live(load_spec_text(text, "s.yaml"), tmp_path, monkeypatch)
    assert not [i for i in issues if i.code == "LG716"]
    assert any(i.code == "LG720" and "bf16" in i.message for i in issues)


def test_cpu_job_on_gpu_less_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_bin(tmp_path, "sinfo", sinfo_script("'c1|cpu|(null)' 'c2|cpu|(null)'", "'cpu|1-infinite|infinite'"))
    text = "job: {name: cpu}\nslurm: {partition: cpu}\nmodel: {name_or_path: org/m}\n" \
           "train: {device: cpu, trainer: sft, args: {data: {path: d.jsonl}}}\n"
    assert only(run_live(load_spec_text(text, "s.yaml"), tmp_path, monkeypatch)) == []
    gpu_job = text.replace("device: cpu, ", "")
    assert only(run_live(load_spec_text(gpu_job, "s.yaml"), tmp_path, monkeypatch)) == [
        ("LG712", "slurm.gpus_per_node")]


@pytest.mark.parametrize(("release", "refused"), [("slurm-wlm 22.05.8", ["--tres-bind=gres/gpu:closest"]),
                                                  ("slurm 24.11.1", [])])
def test_live_judges_extra_directives_against_this_clusters_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   release: str, refused: list[str]) -> None:
    """Issue 37: `check --live` reads `sbatch --version` (22.05.8 on the local cluster refuses --tres-bind)."""
    fake_bin(tmp_path, "sbatch", f'[ "$1" = --version ] && echo "{release}"\n')
    data = yaml.safe_load(SPEC.format(partition="gpu", gpn=8, time="04:00:00", model="org/model", server_nodes=1,
                                      port=8000, train_nodes=1, attn="sdpa"))
    data["slurm"]["extra_directives"] = ["--tres-bind=gres/gpu:closest", "--constraint=h100"]
    issues = run_live(load_spec_text(yaml.safe_dump(data), "spec.yaml"), tmp_path, monkeypatch)
    found = [i for i in issues if i.code == "LG813"]
    assert [i.message.split(" ")[0] for i in found] == refused, [i.format() for i in found]
    assert all(i.severity == "error" and release in i.message for i in found)
