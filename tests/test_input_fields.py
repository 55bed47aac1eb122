"""Field rules that values must not slip past: full-match patterns, command-line words, sbatch directives in
every spelling sbatch accepts (tests/slurm/test_directives_sbatch.py cross-checks them with the real sbatch), and
the underscore spellings of vLLM flags launchgen owns."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from launchgen.checks import run_checks
from launchgen.input import directives
from launchgen.input.loader import load_spec_text
from launchgen.shared.issues import SpecError

BASE: dict[str, Any] = {
    "job": {"name": "demo"},
    "model": {"name_or_path": "org/model"},
    "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4},
    "train": {"trainer": "grpo", "args": {"data": {"path": "prompts.jsonl"}}},
}


def spec_with(section: str, key: str, value: Any) -> str:
    data = json.loads(json.dumps(BASE))
    data.setdefault(section, {})[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def refused(text: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as exc:
        load_spec_text(text, "spec.yaml")
    assert all(i.line is not None for i in exc.value.issues)
    return [(i.code, i.path) for i in exc.value.issues]


# --- full-match patterns ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key", "value", "path"), [
    ("job", "name", "abc\n", "job.name"),
    ("slurm", "env", {"all": {"abc\n": "1"}}, "slurm.env.all"),
    ("slurm", "time", "01:00:00\n", "slurm.time"),
    ("slurm", "time", " 01:00:00", "slurm.time"),
    ("train", "attn_implementation", "kernels-community/flash-attn2\n", "train.attn_implementation"),
    ("train", "attn_implementation", "kernels community/flash-attn2", "train.attn_implementation"),
])
def test_trailing_newlines_and_blanks_do_not_pass_patterns(section: str, key: str, value: Any, path: str) -> None:
    assert refused(spec_with(section, key, value)) == [("LG004", path)]


# --- command-line words ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "key", "value"), [
    ("model", "name_or_path", ""), ("model", "name_or_path", "--help"), ("model", "name_or_path", "a\nb"),
    ("model", "name_or_path", " org/model"), ("model", "name_or_path", "org/\x1b[2Jmodel"),
    ("model", "revision", ""), ("model", "revision", "-x"), ("model", "revision", "main\n"),
    ("model", "revision", "my branch"),
    ("vllm", "bind", ""), ("vllm", "bind", "--help"), ("vllm", "bind", "10.0.0.1\n"), ("vllm", "bind", "a b"),
    ("vllm", "bind", "not_a_host!"), ("vllm", "bind", "999.1.1.1"),
    ("vllm", "executable", ""), ("vllm", "executable", "--version"), ("vllm", "executable", "vllm\n"),
    ("vllm", "executable", "uv run vllm"),
    ("slurm", "partition", "gpu\x1b[31m"), ("slurm", "account", "a\tb"), ("train", "cuda_version", "12.8\n"),
    ("slurm", "partition", "$PARTITION"), ("slurm", "account", "${ACCOUNT}"), ("slurm", "mem", "lots"),
    ("slurm", "mem", "-1"), ("slurm", "gpu_type", "*"), ("slurm", "gpu_type", "h100:8"),
    ("train", "cuda_version", "$(id)"), ("job", "output_dir", "runs/" + "x" * 256 + "/%j"),
])
def test_command_line_words_are_validated(section: str, key: str, value: str) -> None:
    assert refused(spec_with(section, key, value)) == [("LG004", f"{section}.{key}")]


@pytest.mark.parametrize("bind", ["node", "0.0.0.0", "10.0.0.5", "::", "[::1]", "fe80::1", "gpu-node-01",
                                  "n1.cluster.example.org"])
def test_good_bind_addresses_pass(bind: str) -> None:
    assert load_spec_text(spec_with("vllm", "bind", bind), "spec.yaml").spec.vllm is not None


@pytest.mark.parametrize(("key", "value"), [("mem", "0"), ("mem", "500G"), ("mem", "1024"), ("gpu_type", "h100"),
                                            ("gpu_type", "a100_80g"), ("partition", "gpu-long")])
def test_ordinary_sbatch_values_pass(key: str, value: str) -> None:
    load_spec_text(spec_with("slurm", key, value), "spec.yaml")


def test_paths_with_inner_spaces_pass() -> None:
    loaded = load_spec_text(spec_with("model", "name_or_path", "/data/my models/qwen"), "spec.yaml")
    assert loaded.spec.model.name_or_path == "/data/my models/qwen"


def test_empty_revision_is_refused_with_the_way_out() -> None:
    with pytest.raises(SpecError) as exc:
        load_spec_text(spec_with("model", "revision", ""), "spec.yaml")
    assert "must not be empty" in exc.value.issues[0].message


# --- sbatch directives ------------------------------------------------------------------------------------------

BYPASSES = ["-N3", "-pdebug", "-o/dev/null", "--signa=USR1@5", "--no-req", "--outp=x.out", "--partit=debug",
            "--ntasks-per-node=2", "-c4", "-c 4", "--cpus-per-task=4", "--mem=10G", "--export=NONE",
            "--chdir=/tmp", "-D/tmp", "-HN3", "-G2", "-q high", "--gpus-per-task=1", "-J x", "--jo=x",
            "--array=1-3", "-a1-3", "--wrap=hostname", "-t 5", "--exclu", "-e err.log"]


@pytest.mark.parametrize("directive", BYPASSES)
def test_reserved_directives_in_any_spelling(directive: str) -> None:
    assert refused(spec_with("slurm", "extra_directives", ["--constraint=h100", directive])) == [
        ("LG004", "slurm.extra_directives.1")]


@pytest.mark.parametrize("directive", ["--comment=$SCRATCH/x", "--comment=${HOME}", "--comment=$(id)",
                                       "--constraint=h100\n--nodes=2", "--comment='unbalanced", "--ti=5",
                                       "#SBATCH --constraint=x", "constraint=x", "--help", "--test-only",
                                       "--usage", "-x", "--constraint", "-C"])
def test_malformed_directives(directive: str) -> None:
    assert refused(spec_with("slurm", "extra_directives", [directive])) == [("LG004", "slurm.extra_directives.0")]


@pytest.mark.parametrize("directive", ["--constraint=h100", "-C h100", "--comment='a b'", "-x node1",
                                       "--nodelist=node[1-2]", "--mail-type=END", "--mem-per-cpu=1G", "-w node1",
                                       "--comment=cost:5$", "--time-min=10", "--no-kill", "--begin=now+1hour"])
def test_ordinary_directives_pass(directive: str) -> None:
    load_spec_text(spec_with("slurm", "extra_directives", [directive]), "spec.yaml")


@pytest.mark.parametrize(("directive", "field", "value"), [
    ("--mem-per-cpu=1G", "mem", "100G"), ("--mem-per-gpu=1G", "mem", "0"), ("--cpus-per-gpu=4", "cpus_per_task", 8),
    ("--oversubscribe", "exclusive", True), ("-s", "exclusive", True),
])
def test_directives_that_contradict_a_typed_field(directive: str, field: str, value: Any) -> None:
    data = json.loads(json.dumps(BASE))
    data["slurm"] = {field: value, "extra_directives": [directive]}
    assert refused(yaml.safe_dump(data)) == [("LG004", "slurm.extra_directives")]
    data["slurm"] = {"extra_directives": [directive], "exclusive": False}
    load_spec_text(yaml.safe_dump(data), "spec.yaml")


def test_option_parsing_follows_getopt() -> None:
    names = [o.name for o in directives.options("-HN3 --constraint h100 --no-req -pdebug")]
    assert names == ["hold", "nodes", "constraint", "no-requeue", "partition"]
    # `-C -N3`: -C takes the next word as its value, so -N3 is the constraint's value, not an option
    assert [o.name for o in directives.options("-C -N3")] == ["constraint"]


# --- LG802 --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arg", ["--logprobs_mode=raw_logprobs", "--max_logprobs", "--weight_transfer_config",
                                 "--tensor_parallel_size=2", "--gpu_memory_utilization 0.5", "--max_model_len=8",
                                 "--weight-transfer-config.backend=nccl", "--max-model-len=8", "-tp"])
def test_lg802_sees_every_spelling_vllm_accepts(arg: str) -> None:
    loaded = load_spec_text(spec_with("vllm", "extra_args", ["--seed=1", arg]), "spec.yaml")
    _plan, issues = run_checks(loaded, env={})
    assert [(i.code, i.path) for i in issues if i.code == "LG802"] == [("LG802", "vllm.extra_args.1")]


def test_lg802_leaves_other_flags_alone() -> None:
    loaded = load_spec_text(spec_with("vllm", "extra_args", ["--seed=1", "--max_num_seqs=64"]), "spec.yaml")
    _plan, issues = run_checks(loaded, env={})
    assert not [i for i in issues if i.code == "LG802"]


@pytest.mark.parametrize(("value", "seconds"), [
    ("480", 480 * 60), ("30:00", 30 * 60), ("8:00:00", 8 * 3600), ("1-12", 36 * 3600), ("1-00:30", 86400 + 1800),
    ("2-00:00:00", 2 * 86400), ("0:90", 90), ("100:00:00", 100 * 3600),
])
def test_time_limits_read_as_sbatch_reads_them(value: str, seconds: int) -> None:
    from launchgen.input.spec import parse_time_limit

    assert parse_time_limit(value) == seconds


@pytest.mark.parametrize("value", ["1-", "-5", "1:2:3:4", "1h", "08:00:00 ", "1-2-3"])
def test_malformed_time_limits(value: str) -> None:
    assert refused(spec_with("slurm", "time", value)) == [("LG004", "slurm.time")]
