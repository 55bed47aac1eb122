"""Containers per role: the exact command lines each runtime gets, read back against that tool's documented syntax,
and the container checks (LG250-LG259) with `check --live`'s runtime probe.

pyxis and Apptainer cannot be installed on this machine, so their lines are parsed here with their documented
grammars: pyxis' SPANK options (NVIDIA/pyxis args.c: `--container-image`, `--container-mounts=SRC:DST[:FLAGS]`
repeated or comma-separated, `--container-workdir`, `--container-env=NAME[,NAME...]`, ...; srun options before
the command) and `apptainer exec [exec options...] <container> <command>` (`--nv`, `-B/--bind
src[:dest[:opts]]` with opts `ro`/`rw`). charliecloud's `ch-run [OPTION...] IMAGE -- CMD [ARG...]` is also run
for real (tests/test_containers_run.py, tests/slurm/test_containers_slurm.py); here its line is run through the
real `ch-run` with the command replaced by `true`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chimage import build_image, ch_run
from render_cases import plan_for

from launchgen.checks import Ctx
from launchgen.checks.live import containers as containerchecks
from launchgen.input.loader import load_spec_text
from launchgen.planning.plan import build_plan
from launchgen.script.render import render_script, render_steps, words
from launchgen.shared.issues import SpecError

#: pyxis' SPANK options (args.c spank_opts), with whether each takes a value
PYXIS_OPTIONS = {"container-image": True, "container-mounts": True, "container-workdir": True,
                 "container-name": True, "container-save": True, "container-mount-home": False,
                 "no-container-mount-home": False, "container-remap-root": False, "no-container-remap-root": False,
                 "container-entrypoint": False, "no-container-entrypoint": False, "container-entrypoint-log": False,
                 "container-writable": False, "container-readonly": False, "container-env": True}
MOUNT_SPEC = re.compile(r"(?P<src>[^:,]+)(?::(?P<dst>[^:,]+)(?::(?P<opts>[^:,]+))?)?")


def _base(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "job": {"name": "c"},
        "model": {"name_or_path": "org/model"},
        "vllm": {"mode": "server", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 4},
        "train": {"args": {"data": {"path": "d.jsonl"}}},
    }
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k] = {**spec[k], **v}
        else:
            spec[k] = v
    return spec


def _plan(spec: dict[str, Any]) -> Any:
    return build_plan(load_spec_text(yaml.safe_dump(spec), "c.yaml"))


def _srun_lines(script: str) -> list[list[str]]:
    """Every step-starting srun line of the batch script, split as bash would (variables left unexpanded)."""
    out = []
    lines = script.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("srun --export=ALL --overlap --kill-on-bad-exit=1"):
            joined = line.rstrip("\\") + " " + lines[i + 1].strip()
            out.append(shlex.split(joined.replace("</dev/null &", "")))
    return out


def _pyxis_options(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """srun's words -> (pyxis options with their values, the command after the options)."""
    assert argv[0] == "srun"
    opts: dict[str, list[str]] = {}
    k = 1
    while k < len(argv) and argv[k].startswith("-"):
        word = argv[k]
        if word == "-w":
            k += 2
            continue
        name, eq, value = word[2:].partition("=")
        if name.startswith("container") or name.startswith("no-container"):
            assert name in PYXIS_OPTIONS, f"{word}: not a pyxis option"
            assert PYXIS_OPTIONS[name] == bool(eq), f"{word}: pyxis' {name} {'takes' if eq else 'takes no'} value"
            opts.setdefault(name, []).append(value)
        k += 1
    return opts, argv[k:]


def test_pyxis_options_are_on_each_steps_srun_line_in_pyxis_syntax() -> None:
    script = render_script(plan_for("container-pyxis"), "sbatch")
    lines = _srun_lines(script)
    assert len(lines) == 2  # the server's step, then the trainer's
    images = []
    for argv in lines:
        opts, command = _pyxis_options(argv)
        assert command[:2] == ["bash", command[1]] and command[1].startswith("$LG_JOB_DIR/steps/")
        assert len(opts["container-image"]) == 1  # pyxis refuses a second, different one
        images.append(opts["container-image"][0])
        for m in opts["container-mounts"]:
            for entry in m.split(","):  # pyxis splits entries on commas, then SRC:DST[:FLAGS] on colons
                parsed = MOUNT_SPEC.fullmatch(entry)
                assert parsed, entry
                assert parsed["src"].startswith(("/", ".", "${")), entry  # absolute, relative, or one of ours
                if parsed["opts"]:
                    assert set(parsed["opts"].split("+")) <= {"ro", "rw", "rbind", "rprivate"}, entry
        assert opts["container-mounts"][:3] == ["${LG_SUBMIT_DIR}", "${LG_HF_CACHE}", "${LG_JOB_DIR}"]
        assert opts["container-workdir"] == ["${LG_SUBMIT_DIR}"]
    assert images == ["nvcr.io#nvidia/vllm:25.09-py3", "registry.example.org#ml/launchgen-trainer:0.6"]
    trainer_opts, _ = _pyxis_options(lines[1])
    assert trainer_opts["container-env"] == ["WANDB_API_KEY"]
    assert "/lustre/datasets:/data:ro" in trainer_opts["container-mounts"]
    # the signal step reads the pid files on the host: it runs outside any image
    assert "--container-image" not in script.split("lg_signal_trainers() {", 1)[1].split("}", 1)[0]
    # pyxis runs the step script inside the image: its command stays the plain server command
    steps = render_steps(plan_for("container-pyxis"), "sbatch")
    assert "exec vllm serve " in steps["steps/server.sh"]
    assert "\naccelerate launch " in steps["steps/trainer.sh"]


def _apptainer(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """`apptainer exec [exec options...] <container> <command>` -> (options, container, command)."""
    assert argv[:2] == ["apptainer", "exec"] or argv[:2] == ["singularity", "exec"], argv[:2]
    opts: dict[str, list[str]] = {}
    k = 2
    takes_value = {"--bind", "-B", "--env", "--pwd"}
    while argv[k].startswith("-"):
        if argv[k] in takes_value:
            opts.setdefault(argv[k], []).append(argv[k + 1])
            k += 2
        else:
            opts.setdefault(argv[k], []).append("")
            k += 1
    return opts, argv[k], argv[k + 1:]


def _exec_line(step: str, marker: str) -> list[str]:
    line = next(x for x in step.splitlines() if marker in x)
    return shlex.split(line.replace("|| lg_rc=$?", "").strip().removeprefix("exec "))


def test_apptainer_lines_follow_apptainer_exec_syntax() -> None:
    steps = render_steps(plan_for("container-apptainer"), "sbatch")
    opts, image, command = _apptainer(_exec_line(steps["steps/server.sh"], "apptainer exec"))
    assert image == "docker://vllm/vllm-openai:v0.32.0" and command[:2] == ["vllm", "serve"]
    assert "--nv" in opts
    assert opts["--bind"] == ["${LG_SUBMIT_DIR}", "${LG_HF_CACHE}", "${LG_JOB_DIR}"]
    opts, image, command = _apptainer(_exec_line(steps["steps/trainer.sh"], "apptainer exec"))
    assert command[:2] == ["accelerate", "launch"] and "--nv" in opts
    for b in opts["--bind"]:
        m = MOUNT_SPEC.fullmatch(b)
        assert m and (m["opts"] is None or m["opts"] in ("ro", "rw")), b
    assert opts["--bind"][-1] == "/scratch/datasets:/data:ro"
    # launchgen's own variables win over the image's environment (APPTAINERENV_<NAME>, set before the exec)
    trainer = steps["steps/trainer.sh"]
    assert 'APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"' in trainer
    assert trainer.index("export APPTAINERENV_CUDA_VISIBLE_DEVICES") < trainer.index("apptainer exec")


def test_singularity_trainer_and_charliecloud_server_with_a_quoted_image() -> None:
    plan = plan_for("containers-charliecloud-singularity")
    steps = render_steps(plan, "bash")
    server = _exec_line(steps["steps/server.sh"], "ch-run ")
    # ch-run [OPTION...] IMAGE -- CMD [ARG...]; --bind=SRC[:DST]
    sep = server.index("--")
    assert server[0] == "ch-run" and server[sep - 1] == "/images/it's a dir" and server[sep + 1:sep + 3] == [
        "vllm", "serve"]
    assert server[1:sep - 1] == ["--bind=${LG_SUBMIT_DIR}", "--bind=${LG_HF_CACHE}", "--bind=${LG_JOB_DIR}",
                                "--bind=/data", "--bind=/a:/b"]
    opts, image, command = _apptainer(_exec_line(steps["steps/trainer.sh"], "singularity exec"))
    assert image == "docker://org/trainer:1" and "--cleanenv" in opts and command[0] == "accelerate"
    assert "SINGULARITYENV_WANDB_API_KEY" in steps["steps/trainer.sh"]
    assert "APPTAINERENV_" not in steps["steps/trainer.sh"]


def test_charliecloud_prefix_runs_under_the_real_ch_run(tmp_path: Path) -> None:
    """The plan's ch-run words, with the variables set and the command replaced by `true`, run as they are."""
    ch_run()
    image = build_image(tmp_path / "img", ["/usr"])
    plan = _plan(_base(container={"runtime": "charliecloud", "image": str(image), "mounts": ["/usr"]}))
    prefix = plan.trainer.container.prefix
    env = {**os.environ, "LG_JOB_DIR": str(tmp_path), "LG_SUBMIT_DIR": str(tmp_path),
           "LG_HF_CACHE": str(tmp_path), "USER": os.environ.get("USER", "root")}
    line = words(prefix) + " /bin/sh -c 'test -f /etc/launchgen-test-image && echo inside'"
    res = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout.strip() == "inside", res.stderr


def test_pyxis_under_bash_is_refused_with_lg254() -> None:
    with pytest.raises(SpecError) as exc:
        render_script(plan_for("container-pyxis"), "bash")
    assert [(i.code, i.path) for i in exc.value.issues] == [("LG254", "vllm.container.runtime")]


def test_role_container_replaces_the_job_wide_one_and_colocate_has_no_server_step() -> None:
    plan = _plan(_base(container={"runtime": "apptainer", "image": "/a.sif"},
                       vllm={"container": {"runtime": "charliecloud", "image": "/srv"}}))
    assert plan.server.container.runtime == "charliecloud" and plan.server.container.source == "vllm.container"
    assert plan.trainer.container.runtime == "apptainer" and plan.trainer.container.source == "container"
    assert plan.trainer.argv[:3] == ("apptainer", "exec", "--nv")
    cpu = _plan(_base(vllm={"device": "cpu", "gpus": None, "tensor_parallel_size": 1},
                      train={"device": "cpu", "precision": "fp32", "args": {"data": {"path": "d.jsonl"}}},
                      container={"runtime": "apptainer", "image": "/a.sif"}, model={"name_or_path": "org/model",
                                                                                      "dtype": "float32"}))
    assert "--nv" not in cpu.trainer.argv  # no CUDA role, no GPU flag


def test_no_container_renders_as_before() -> None:
    plan = plan_for("single-node-split")
    assert plan.trainer.container is None and not plan.containers
    assert "LG_HF_CACHE" not in render_script(plan, "sbatch")


# --- checks ------------------------------------------------------------------------------------------------------


def _issues(spec: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch, files: bool = True,
            env: dict[str, str] | None = None) -> list[Any]:
    from launchgen.checks import run_checks

    monkeypatch.chdir(tmp)
    (tmp / "d.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    loaded = load_spec_text(yaml.safe_dump(spec), str(tmp / "c.yaml"))
    _, issues = run_checks(loaded, env={"HF_HOME": str(tmp / "hf")} if env is None else env, files=files)
    return [i for i in issues if i.code.startswith("LG25")]


def test_local_image_and_mounts_are_checked_in_the_files_stage(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _base(container={"runtime": "apptainer", "image": "images/missing.sif", "mounts": ["/nonexistent-lg:/x"]})
    got = [(i.code, i.path, i.severity) for i in _issues(spec, tmp_path, monkeypatch)]
    assert got == [("LG250", "container.image", "error"), ("LG251", "container.mounts.0", "warning")]
    assert _issues(spec, tmp_path, monkeypatch, files=False) == []  # `check --no-files`, plan, render
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "missing.sif").write_text("sif")
    spec["container"]["mounts"] = [str(tmp_path)]
    assert _issues(spec, tmp_path, monkeypatch) == []
    # registry images are not looked for on disk
    spec["container"]["image"] = "docker://org/img:1"
    assert _issues(spec, tmp_path, monkeypatch) == []


def test_charliecloud_image_directory_needs_its_mount_points(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    image = build_image(tmp_path / "img", ["/usr"])
    spec = _base(container={"runtime": "charliecloud", "image": str(image), "mounts": ["/usr", f"{tmp_path}:/opt/x",
                                                                                        f"{tmp_path}:/tmp/y"]})
    got = [(i.code, i.path) for i in _issues(spec, tmp_path, monkeypatch)]
    assert got == [("LG258", "container.mounts.1")]  # /usr exists in the image; /tmp is ch-run's own bind
    (image / "opt" / "x").mkdir(parents=True)
    assert _issues(spec, tmp_path, monkeypatch) == []
    # the standard mounts: an HF cache outside /tmp needs its mount point; a job directory outside the submit
    # directory and /tmp cannot have one (it is named per job)
    spec["job"]["output_dir"] = "/scratch/runs/%j"
    got = [(i.code, i.path) for i in _issues(spec, tmp_path, monkeypatch, env={"HF_HOME": "/srv/hf-cache"})]
    assert got == [("LG258", "container.image"), ("LG258", "job.output_dir")]
    (image / "srv" / "hf-cache").mkdir(parents=True)
    got = [(i.code, i.path) for i in _issues(spec, tmp_path, monkeypatch, env={"HF_HOME": "/srv/hf-cache"})]
    assert got == [("LG258", "job.output_dir")]


@pytest.mark.parametrize("mount", ["relative/path", "/a:b", "/a b", "/a,b", "/a:/b:rx", "/a:/b:ro:x", "-/x"])
def test_mount_syntax_refused_at_load(mount: str) -> None:
    with pytest.raises(SpecError) as exc:
        _plan(_base(container={"runtime": "apptainer", "image": "/a.sif", "mounts": [mount]}))
    assert exc.value.issues[0].path.startswith("container.mounts")


def test_hostile_values_reach_the_shell_quoted(tmp_path: Path) -> None:
    evil = "/img/$(touch PWNED) `x` ;'\""
    plan = _plan(_base(container={"runtime": "charliecloud", "image": evil, "extra_args": ["--set-env=A=$(x)"]}))
    step = render_steps(plan, "bash")["steps/trainer.sh"]
    line = _exec_line(step, "ch-run ")
    assert evil in line and "--set-env=A=$(x)" in line  # one word each, verbatim


# --- check --live ------------------------------------------------------------------------------------------------


def _ctx(spec: dict[str, Any]) -> Ctx:
    return Ctx(load_spec_text(yaml.safe_dump(spec), "c.yaml"), {})


def test_live_probe_says_what_it_probed() -> None:
    pyxis = _ctx(_base(container={"runtime": "pyxis", "image": "org#img"}))
    with_plugin = "Usage: srun [OPTIONS...] executable [args...]\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"
    got = list(containerchecks.probe_runtimes(pyxis, lambda argv, t: (0, with_plugin), lambda p: "/usr/bin/srun"))
    assert [(i.code, i.severity) for i in got] == [("LG257", "info")] and "`srun --help`" in got[0].message
    got = list(containerchecks.probe_runtimes(pyxis, lambda argv, t: (0, "Usage: srun\n"), lambda p: "/usr/bin/srun"))
    assert [i.code for i in got] == ["LG256"] and "pyxis plugin is not loaded" in got[0].message
    app = _ctx(_base(container={"runtime": "apptainer", "image": "/a.sif"}))
    got = list(containerchecks.probe_runtimes(app, lambda argv, t: (1, ""),
                                              lambda p: "/opt/bin/singularity" if p == "singularity" else None))
    assert [i.code for i in got] == ["LG256"] and "set runtime: singularity" in got[0].message
    ch = _ctx(_base(container={"runtime": "charliecloud", "image": "/img"}, train={
        "container": {"runtime": "charliecloud", "image": "/img2"}, "args": {"data": {"path": "d.jsonl"}}}))
    got = list(containerchecks.probe_runtimes(ch, lambda argv, t: (1, ""), lambda p: "/usr/bin/ch-run"))
    assert [i.code for i in got] == ["LG257"]  # one probe per runtime, whatever the roles


def test_live_probe_through_check_live_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check --live` with charliecloud probes the real PATH (ch-run is installed here, apptainer is not)."""
    from launchgen.checks.live.probes import live_checks

    ch_run()
    spec = _base(container={"runtime": "charliecloud", "image": "/img"},
                 vllm={"container": {"runtime": "apptainer", "image": "/a.sif"}})
    loaded = load_spec_text(yaml.safe_dump(spec), str(tmp_path / "c.yaml"))
    issues = [i for i in live_checks(loaded, env={}) if i.code in ("LG256", "LG257")]
    assert sorted((i.code, i.path) for i in issues) == [("LG256", "vllm.container.runtime"),
                                                        ("LG257", "container.runtime")]



def test_plan_view_names_each_roles_container_and_the_het_components() -> None:
    from launchgen.planning.view import summary_lines

    lines = summary_lines(plan_for("container-pyxis"))
    assert "server container: nvcr.io#nvidia/vllm:25.09-py3 (pyxis, from vllm.container)" in lines
    assert any(x.startswith("trainer container: registry.example.org#ml/launchgen-trainer:0.6 (pyxis, from container")
               for x in lines)
    het = summary_lines(plan_for("hetjob-inference-partition"))
    assert any(x.startswith("heterogeneous job:") and "partition=inference" in x for x in het), het
    assert not any("container" in x or "heterogeneous" in x for x in summary_lines(plan_for("single-node-split")))
