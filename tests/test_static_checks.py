"""Warnings `check` gives without --live (issue 17): bf16 on a pre-Ampere gpu_type (LG620), idle GPUs on trainer
nodes beside a server that shares node 0 (LG106), a health timeout too short for a local model's size (LG820)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from launchgen.checks import run_checks
from launchgen.checks.spec.static import parameter_count, pre_ampere
from launchgen.input import directives
from launchgen.input.loader import load_spec_text
from launchgen.planning.hfcache import ModelConfig

QWEN2_72B = {"hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 29568, "vocab_size": 152064,
             "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": False}
QWEN2_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944, "vocab_size": 152064,
            "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False}


def _issues(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    base: dict[str, Any] = {"job": {"name": "w"}, "slurm": {"gpus_per_node": 8}, "model": {"name_or_path": "m"},
                            "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4},
                            "train": {"args": {"data": {"path": "d.jsonl"}}}}
    for k, v in spec.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    _plan, issues = run_checks(load_spec_text(yaml.safe_dump(base, sort_keys=False), "w.yaml"))
    return [(i.code, i.path, i.message) for i in issues]


@pytest.mark.parametrize("gpu_type", ["v100", "tesla_v100-sxm2-32gb", "t4", "p100", "V100S"])
def test_bf16_on_a_pre_ampere_gpu_type_warns_without_live(gpu_type: str) -> None:
    found = [i for i in _issues({"slurm": {"gpus_per_node": 8, "gpu_type": gpu_type}}) if i[0] == "LG620"]
    assert found and found[0][1] == "slurm.gpu_type" and "bf16" in found[0][2], found
    # fp16 is what these GPUs train in: no warning
    assert "LG620" not in [i[0] for i in _issues({"slurm": {"gpus_per_node": 8, "gpu_type": gpu_type},
                                                   "train": {"precision": "fp16",
                                                             "args": {"data": {"path": "d.jsonl"}}}})]


@pytest.mark.parametrize("gpu_type", ["a100", "h100", "l40s", "a10g", "h200", "gh200", "rtx4090", "b200"])
def test_ampere_and_newer_do_not_warn(gpu_type: str) -> None:
    assert pre_ampere(gpu_type) is None


def test_idle_gpus_of_trainer_nodes_beside_a_server_on_node_0_are_reported() -> None:
    issues = _issues({"train": {"nodes": 2, "args": {"data": {"path": "d.jsonl"}}}})
    idle = [m for code, _, m in issues if code == "LG106"]
    assert idle == ["GPU(s) 0, 1, 2, 3 of trainer node 1 are used by no role"], issues
    assert not [m for code, _, m in _issues({}) if code == "LG106"]  # one node: every GPU has a role


def _model(tmp_path: Path, cfg: dict[str, Any]) -> str:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_health_timeout_too_short_for_a_local_72b_warns_with_an_estimate(tmp_path: Path) -> None:
    assert parameter_count(ModelConfig("x", QWEN2_72B)) == pytest.approx(72.7e9, rel=0.02)
    issues = _issues({"model": {"name_or_path": _model(tmp_path, QWEN2_72B)},
                      "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4,
                               "health_timeout": 900}})
    [msg] = [m for code, path, m in issues if code == "LG820" and path == "vllm.health_timeout"]
    assert "900 s" in msg and "72.7B" in msg and "expect about" in msg, msg


def test_a_7b_or_a_generous_timeout_does_not_warn(tmp_path: Path) -> None:
    small = _issues({"model": {"name_or_path": _model(tmp_path, QWEN2_7B)}})
    assert "LG820" not in [c for c, _, _ in small]
    (tmp_path / "model" / "config.json").write_text(json.dumps(QWEN2_72B))
    generous = _issues({"model": {"name_or_path": str(tmp_path / "model")},
                        "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4,
                                 "health_timeout": 3600}})
    assert "LG820" not in [c for c, _, _ in generous]


def test_an_option_sbatch_does_not_know_warns_and_known_spellings_do_not() -> None:
    # a unique prefix (`--constrain`, `--comm`) is what sbatch's getopt_long accepts; a letter too many is not
    extra = ["--constraints=a100", "--mail-type=END", "--comm=x", "-Z", "--constrain=a100", "--begin now"]
    found = [i for i in _issues({"slurm": {"gpus_per_node": 8, "extra_directives": extra}}) if i[0] == "LG809"]
    assert [(p, m.split(" in ")[0]) for _c, p, m in found] == [
        ("slurm.extra_directives.0", "--constraints=a100"), ("slurm.extra_directives.3", "-Z")]
    assert "unrecognized option" in found[0][2]


def _severities(extra: list[str], **slurm: Any) -> list[tuple[str, str, str]]:
    return [(c, p, m) for c, p, m in _issues({"slurm": {"gpus_per_node": 8, "extra_directives": extra, **slurm}})
            if c in ("LG809", "LG813", "LG814")]


def test_an_option_newer_than_the_clusters_slurm_is_refused_and_warned_about_without_a_release() -> None:
    """Issue 37: --tres-bind, --segment, ... passed check and then this cluster's sbatch 22.05 refused the
    script. With slurm.version the option is judged against that release; without, against 22.05, as a warning."""
    extra = ["--tres-bind=gres/gpu:closest", "--segment=2", "--constraint=h100"]
    assert _severities(extra, version="24.05") == []
    old = _severities(extra, version="23.02")
    assert [(c, p) for c, p, _m in old] == [("LG813", "slurm.extra_directives.0"), ("LG813", "slurm.extra_directives.1")]
    assert "--tres-bind=gres/gpu:closest came with Slurm 23.11; sbatch 23.02" in old[0][2], old
    unset = [i for i in _issues({"slurm": {"gpus_per_node": 8, "extra_directives": extra}}) if i[0] == "LG813"]
    assert len(unset) == 2 and "set slurm.version" in unset[0][2]
    loaded = load_spec_text(yaml.safe_dump({"job": {"name": "w"}, "model": {"name_or_path": "m"},
                                            "slurm": {"extra_directives": extra},
                                            "train": {"args": {"data": {"path": "d.jsonl"}}}}), "w.yaml")
    _plan, issues = run_checks(loaded)
    assert {i.severity for i in issues if i.code == "LG813"} == {"warning"}


def test_a_nodelist_of_another_size_than_the_plan_is_refused() -> None:
    # the base spec plans one node (the server shares it)
    assert _severities(["-w node1"]) == [] and _severities(["--nodelist=gpu[07]"]) == []
    [(code, path, msg)] = _severities(["--nodelist=gpu[01-03],login1"])
    assert (code, path) == ("LG814", "slurm.extra_directives.0")
    assert "names 4 node(s); the plan asks for 1" in msg, msg
    assert [c for c, _p, _m in _severities(["--nodel node[1-2]"])] == ["LG814"]


def _nodefile_issues(extra: list[str]) -> list[tuple[str, str, str]]:
    """LG814 as `check` judges it (the files stage reads the node file), from the current directory."""
    base = {"job": {"name": "w"}, "slurm": {"gpus_per_node": 8, "extra_directives": extra},
            "model": {"name_or_path": "m"}, "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4},
            "train": {"nodes": 2, "args": {"data": {"path": "d.jsonl"}}}}
    _plan, issues = run_checks(load_spec_text(yaml.safe_dump(base, sort_keys=False), "w.yaml"), files=True)
    return [(i.code, i.severity, i.message) for i in issues if i.code == "LG814"]


def test_a_node_file_of_another_size_than_the_plan_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """-F/--nodefile, and a -w value with a `/` (sbatch reads it as a file), judged like --nodelist: the hosts
    of the file (hostlists between commas, spaces and line breaks) against the plan's 2 nodes. A relative path
    starts where `check` runs, as sbatch's does where it is submitted."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two").write_text("gpu01\ngpu02\n")
    (tmp_path / "five").write_text("gpu[01-03], login1\n  login2")
    for fine in (["-F two"], ["--nodefile=two"], ["--nodef", "two"], [f"-F{tmp_path}/two"], ["-w ./two"]):
        assert _nodefile_issues([" ".join(fine)]) == [], fine
    for extra in (["-F five"], ["--nodefile five"], ["--nodelist=./five"], [f"-w {tmp_path / 'five'}"]):
        [(code, severity, msg)] = _nodefile_issues(extra)
        assert (code, severity) == ("LG814", "error") and "names 5 node(s); the plan asks for 2" in msg, msg
        assert "the node file" in msg and "five" in msg
    # without the files stage (render), the file is not read, and a `/` value is not counted as one host
    assert _severities(["-w ./five"]) == [] and _severities(["-F five"]) == []


def test_a_node_file_that_cannot_be_read_is_a_warning_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # the regular-file guard: a FIFO would block `check`
    (tmp_path / "dir").mkdir()
    for name, why in (("missing", "No such file"), ("fifo", "a FIFO"), ("dir", "a directory")):
        [(code, severity, msg)] = _nodefile_issues([f"-F {name}"])
        assert (code, severity) == ("LG814", "warning"), msg
        assert f"cannot read the node file {name}" in msg and why in msg, msg


@pytest.mark.parametrize(("directive", "said"), [
    ("--tasks-per-node=2", "it is --ntasks-per-node"), ("--ntasks-per-tres=1", "it is --ntasks-per-gpu"),
    ("--tres-per-task=cpu:4", "--cpus-per-task"), ("--tres-per-task=gres/gpu:1", "--gpus-per-task"),
    ("--container=/x", "the hazard LG262 refuses"), ("--container-id=c1", "the hazard LG262 refuses"),
])
def test_synonyms_of_reserved_options_and_oci_containers_are_refused(directive: str, said: str) -> None:
    with pytest.raises(directives.DirectiveError, match="is refused") as exc:
        directives.validate(directive)
    assert said in str(exc.value), exc.value


def test_the_option_table_knows_each_release() -> None:
    assert directives.newer_than("--tres-per-task=cpu:1 --prefer=a --spread-segments", "22.05") == [
        ("--tres-per-task=cpu:1", "23.02"), ("--spread-segments", "25.11")]
    assert directives.newer_than("--oom-kill-step", "slurm 24.11.1") == []
    assert directives.node_count("gpu[01-04,07],login1") == 6 and directives.node_count("n[a-b]") is None
