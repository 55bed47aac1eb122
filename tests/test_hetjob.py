"""Heterogeneous jobs (launchgen.planning.hetjob): the server's own partition/account/qos/GPU type renders `#SBATCH hetjob`
with the trainer nodes as component 0 and the server nodes as component 1. The real run is
tests/slurm/test_hetjob_slurm.py; here the rendered lines and what stays a plain job."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from render_cases import plan_for

from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script, render_steps
from launchgen.shared.issues import SpecError


def _spec(**vllm: Any) -> dict[str, Any]:
    return {"job": {"name": "h"}, "model": {"name_or_path": "org/model"},
            "slurm": {"partition": "train", "gpus_per_node": 8, "gpu_type": "h100"},
            "vllm": {"mode": "server", "nodes": 1, "tensor_parallel_size": 8, **vllm},
            "train": {"nodes": 2, "args": {"data": {"path": "d.jsonl"}}}}


def _plan(spec: dict[str, Any]) -> Any:
    return build_plan(load_spec_text(yaml.safe_dump(spec), "h.yaml"))


def _sbatch_lines(script: str) -> list[str]:
    return [x.removeprefix("#SBATCH ") for x in script.splitlines() if x.startswith("#SBATCH ")]


def test_server_partition_makes_two_components() -> None:
    script = render_script(plan_for("hetjob-inference-partition"), "sbatch")
    lines = _sbatch_lines(script)
    sep = lines.index("hetjob")
    trainer, server = lines[:sep], lines[sep + 1:]
    assert "--nodes=2" in trainer and "--partition=train" in trainer and "--gres=gpu:h100:8" in trainer
    assert server == ["--nodes=1", "--ntasks-per-node=1", "--gres=gpu:l40s:8", "--time=12:00:00",
                      "--partition=inference", "--account=my-project", "--exclusive"]
    # job-wide options (output, signal, requeue) are the first component's only
    assert not any(x.startswith(("--output", "--signal", "--requeue", "--job-name")) for x in server)
    # node discovery: component 0's nodes, then component 1's (the plan's positions)
    assert ('scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" && scontrol show hostnames '
            '"$SLURM_JOB_NODELIST_HET_GROUP_1"') in script
    srun = [x for x in script.splitlines() if x.lstrip().startswith(("srun ", "timeout 15 srun "))]
    server_sruns = [x for x in srun if "LG_SERVER_NODELIST" in x]
    trainer_sruns = [x for x in srun if "LG_TRAIN_NODELIST" in x]
    assert server_sruns and all("--het-group=1" in x for x in server_sruns)
    # the trainer's step and the signal step (pid files on the trainer nodes) run in component 0
    assert len(trainer_sruns) == 2 and all("--het-group=0" in x for x in trainer_sruns)
    # a server step is signalled under its component's job id
    assert 'job=$SLURM_JOB_ID_HET_GROUP_1' in script


def test_same_values_as_slurm_stay_one_job() -> None:
    plan = _plan(_spec(partition="train", gpu_type="h100"))
    assert plan.slurm.het_directives == () and plan.trainer.het_group is None
    assert "hetjob" not in render_script(plan, "sbatch")
    plain = plan_for("multi-node-70b")
    assert "HET_GROUP" not in render_script(plain, "sbatch")


def test_account_or_qos_alone_also_splits() -> None:
    plan = _plan(_spec(qos="low"))
    assert plan.slurm.het_directives[-2:] == ("--qos=low", "--exclusive")
    assert "--qos=low" not in plan.slurm.directives
    assert plan.server is not None and plan.server.srun_args == ("--het-group=1",)


def test_cpu_trainer_component_requests_no_gpus() -> None:
    spec = _spec(partition="inference")
    spec["train"].update({"device": "cpu", "precision": "fp32"})
    plan = _plan(spec)
    assert not any(d.startswith("--gres") for d in plan.slurm.directives)
    assert "--gres=gpu:h100:8" in plan.slurm.het_directives


def test_shared_node_is_refused_before_any_plan() -> None:
    from launchgen.checks import run_checks

    spec = _spec(partition="inference", nodes=0, gpus=[0, 1, 2, 3], tensor_parallel_size=4)
    plan, issues = run_checks(load_spec_text(yaml.safe_dump(spec), "h.yaml"), env={})
    assert plan is None and [(i.code, i.path) for i in issues if i.severity == "error"] == [
        ("LG261", "vllm.partition")]


def test_bash_render_is_refused_as_multi_node() -> None:
    with pytest.raises(SpecError) as exc:
        render_script(plan_for("hetjob-inference-partition"), "bash")
    assert [i.code for i in exc.value.issues] == ["LG909"]


def test_steps_are_unchanged_by_the_split() -> None:
    steps = render_steps(plan_for("hetjob-inference-partition"), "sbatch")
    assert "het" not in steps["steps/server.sh"] and "het" not in steps["steps/trainer.sh"]


def test_het_group_and_pyxis_options_share_the_servers_srun_line() -> None:
    script = render_script(plan_for("hetjob-pyxis"), "sbatch")
    line = next(x for x in script.splitlines() if x.startswith("srun ") and "LG_SERVER_NODELIST" in x)
    assert line.index("--het-group=1") < line.index("--container-image=")
    trainer = next(x for x in script.splitlines() if x.startswith("srun ") and "LG_TRAIN_NODELIST" in x)
    assert "--het-group=0" in trainer and "--container-image" not in trainer
