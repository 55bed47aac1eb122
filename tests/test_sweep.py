"""Sweeps (issue 38): the `sweep:` section and `--sweep`, expanded into named points that are checked, planned and
rendered as full specs; one job array per resource shape; the `--bash` driver; the sweep record status reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tools import unwrapped

from launchgen.checks import run_checks
from launchgen.cli import main
from launchgen.input import sweep
from launchgen.input.loader import LoadedSpec, read_spec_data
from launchgen.planning import outdir
from launchgen.script.render import MACHINERY_RULE, render_script
from launchgen.script.sweep import array_range, render_sweep, shapes
from launchgen.shared import jobdir
from launchgen.shared.issues import SpecError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "sweeps" / "cpu-quickstart-lr.yaml"
GOLDEN = Path(__file__).parent / "golden" / "sweeps"
UPDATE = os.environ.get("LAUNCHGEN_UPDATE_GOLDEN") == "1"

BASE = """\
job: {name: sw, output_dir: runs/%j}
model: {name_or_path: org/model}
train:
  device: cpu
  precision: fp32
  args:
    data: {path: d.jsonl}
"""


def _sweep(text: str, cli: tuple[str, ...] = ()) -> sweep.Sweep:
    found = sweep.load(read_spec_data(text, "s.yaml"), cli)
    assert isinstance(found, sweep.Sweep)
    return found


def _codes(exc: pytest.ExceptionInfo[SpecError]) -> list[str]:
    return [i.code for i in exc.value.issues]


def _planned(sw: sweep.Sweep) -> list[tuple[sweep.Point, Any]]:
    out = []
    for ps in sw.points:
        assert ps.loaded is not None, ps.issues
        plan, issues = run_checks(ps.loaded)
        assert plan is not None, [i.format() for i in issues]
        out.append((ps.point, plan))
    return out


# ------------------------------------------------------------------------------------------ expansion ---


def test_a_grid_is_every_combination_first_path_slowest_with_short_stable_names() -> None:
    sw = _sweep(BASE + "sweep:\n  grid:\n    train.args.learning_rate: [1.0e-6, 3.0e-6]\n"
                "    train.args.beta: [0, 0.04]\n  max_parallel: 2\n")
    assert [p.point.name for p in sw.points] == ["lr1e-6_beta0", "lr1e-6_beta0.04", "lr3e-6_beta0",
                                                 "lr3e-6_beta0.04"]
    assert [dict(p.point.values) for p in sw.points][1] == {"train.args.learning_rate": 1e-6, "train.args.beta": 0.04}
    assert sw.max_parallel == 2
    first = sw.points[0].loaded
    assert first is not None and first.spec.train.args["learning_rate"] == 1e-6
    # each point's job directory: the sweep's (%j read as the array's id) and the point's name below it
    assert first.spec.job.output_dir == "runs/%A/lr1e-6_beta0"
    # a value a point set is located at the line of its sweep entry
    assert first.line_of("train.args.beta") == 11


def test_points_are_crossed_with_the_grid_and_names_hold_when_a_value_is_added() -> None:
    text = BASE + "sweep:\n  grid: {train.args.learning_rate: [1.0e-6, 3.0e-6]}\n  points:\n" \
        "    - {train.args.loss_type: grpo}\n    - {train.args.loss_type: dapo}\n"
    names = [p.point.name for p in _sweep(text).points]
    assert names == ["lr1e-6_lossgrpo", "lr3e-6_lossgrpo", "lr1e-6_lossdapo", "lr3e-6_lossdapo"]
    more = [p.point.name for p in _sweep(text.replace("3.0e-6]", "3.0e-6, 1.0e-5]")).points]
    assert set(names) < set(more)


def test_cli_sweeps_add_grid_axes_and_replace_the_same_path() -> None:
    sw = _sweep(BASE + "sweep:\n  grid: {train.args.learning_rate: [1.0e-6]}\n",
                ("train.args.learning_rate=1e-5,2e-5", "vllm.gpus=[0,1],[2,3]"))
    assert [p.point.name for p in sw.points] == ["lr1e-5_gpus0-1", "lr1e-5_gpus2-3", "lr2e-5_gpus0-1",
                                                 "lr2e-5_gpus2-3"]
    assert dict(sw.points[1].point.values)["vllm.gpus"] == [2, 3]
    # no sweep section at all: --sweep makes one
    assert len(_sweep(BASE, ("train.args.seed=1,2,3",)).points) == 3


@pytest.mark.parametrize("item", ["train.args.learning_rate", "=1,2", "x=", "a=[1", "a=*x"])
def test_a_malformed_cli_sweep_is_lg020(item: str) -> None:
    with pytest.raises(SpecError) as exc:
        _sweep(BASE, (item,))
    assert set(_codes(exc)) == {"LG020"}


def test_colliding_and_long_names_get_a_digest_and_stay_file_names() -> None:
    names = sweep.name_points([(("a.x", "p:q"),), (("a.x", "p q"),), (("a.x", "z" * 200),)])
    assert names[0] != names[1] and names[0].startswith("xp-q-") and names[1].startswith("xp-q-")
    assert len(names[2]) <= sweep.NAME_MAX
    for n in names:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n), n
    # two paths with one leaf name are told apart by their parents
    assert sweep.name_points([(("train.nodes", 1), ("vllm.nodes", 1)), (("train.nodes", 2), ("vllm.nodes", 0))]) \
        == ["train-nodes1_vllm-nodes1", "train-nodes2_vllm-nodes0"]


@pytest.mark.parametrize(("section", "code", "fix"), [
    ("grid: {train.argz.learning_rate: [1, 2]}", "LG020", "train.args"),
    ("grid: {version: [1]}", "LG020", ""),
    ("grid: {job.name.x: [a]}", "LG020", "Sweep `job.name` itself"),
    ("grid: {'train.args..x': [1]}", "LG020", ""),
    ("grid: {train.args.seed: [1, 2]}\n  points: [{train.args.seed: 3}]", "LG021", ""),
    ("grid: {train.args.seed: [1, 1]}", "LG021", ""),
    ("{}", "LG021", ""),
    ("grid: {train.args.seed: []}", "LG004", ""),
    ("grid: {" + ", ".join(f"train.args.k{i}: [1, 2, 3, 4]" for i in range(5)) + "}", "LG022", ""),
    ("max_parallel: 0", "LG004", ""),
    ("gird: {train.args.seed: [1]}", "LG002", "grid"),
])
def test_a_bad_sweep_section_names_the_field_and_line(section: str, code: str, fix: str) -> None:
    with pytest.raises(SpecError) as exc:
        _sweep(BASE + "sweep:\n  " + section + "\n")
    assert code in _codes(exc), [i.format() for i in exc.value.issues]
    issue = next(i for i in exc.value.issues if i.code == code)
    assert issue.path.startswith("sweep") and issue.line is not None and issue.line >= 8
    assert fix in issue.fix


def test_a_point_that_does_not_validate_is_named_and_located_at_its_sweep_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = ("job: {name: sw}\nmodel: {name_or_path: org/model}\nvllm: {gpus: [0, 1, 2, 3]}\n"
            "train: {args: {data: {path: d.jsonl}}}\nsweep:\n  grid:\n    vllm.tensor_parallel_size: [4, 3]\n")
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(text)
    res = CliRunner().invoke(main, ["check", "--no-files", "s.yaml"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in unwrapped(res.stderr).splitlines() if " error " in ln]
    assert errors and all("point tp3:" in ln for ln in errors), res.stderr
    assert any(ln.startswith("s.yaml:7: error LG2") for ln in errors), res.stderr
    assert "point tp4" not in unwrapped(res.stderr)


def test_an_issue_of_every_point_is_printed_once_unlabelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(BASE.replace("job: {", "job: {preflight: 7, ") +
                              "sweep: {grid: {train.args.seed: [1, 2]}}\n")
    res = CliRunner().invoke(main, ["check", "--no-files", "s.yaml"])
    assert res.exit_code == 2
    assert res.stderr.count("[job.preflight]") == 1 and "point seed" not in unwrapped(res.stderr), res.stderr


def test_for_point_reads_j_as_the_arrays_id_and_keeps_a_literal_percent() -> None:
    assert outdir.for_point("launchgen-runs/%j", "lr1") == "launchgen-runs/%A/lr1"
    assert outdir.for_point("runs/%%j-%x/", "p") == "runs/%%j-%x/p"
    assert outdir.for_point("~", "p") == "~/p"
    got = outdir.expand(outdir.for_point("r/%j", "p"), job_id="12", array_job_id="10", job_name="n", user="u",
                        env={})
    assert got == "r/10/p"


def test_points_that_may_share_a_node_get_the_job_id_port_offset() -> None:
    sw = _sweep(BASE.replace("job: {", "slurm: {exclusive: false}\njob: {") + "sweep: {grid: {train.args.seed: [1, 2]}}\n")
    assert {ps.loaded.spec.job.port_offset for ps in sw.points if ps.loaded} == {"job_id"}
    sw = _sweep(BASE + "sweep: {grid: {train.args.seed: [1, 2]}}\n")
    assert {ps.loaded.spec.job.port_offset for ps in sw.points if ps.loaded} == {"none"}


# ------------------------------------------------------------------------------------------ rendering ---


def _shellcheck(text: str, tmp: Path, name: str) -> None:
    f = tmp / name
    f.write_text(text)
    subprocess.run(["bash", "-n", str(f)], check=True)
    res = subprocess.run(["shellcheck", "-x", str(f)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout


def _embedded(text: str) -> dict[int, str]:
    """Each point's script in an array script, by its task id."""
    found = re.findall(r"^  (\d+)\)\n.*?\n    exec bash /dev/fd/3 3<<'(\S+)'\n(.*?)^\2$", text, re.M | re.S)
    return {int(i): body for i, _d, body in found}


def test_one_shape_is_one_array_whose_tasks_run_exactly_each_points_own_script(tmp_path: Path) -> None:
    sw = _sweep(BASE + "sweep:\n  grid: {train.args.learning_rate: [1.0e-6, 3.0e-6, 1.0e-5]}\n  max_parallel: 2\n")
    planned = _planned(sw)
    (script,) = render_sweep(sw, planned, "sbatch")
    assert script.array and "\n#SBATCH --array=0-2%2\n" in script.text
    assert script.text.index("#SBATCH --array") < script.text.index("\nset -euo pipefail")
    _shellcheck(script.text, tmp_path, "array.sbatch")
    bodies = _embedded(script.text)
    assert sorted(bodies) == [0, 1, 2]
    for point, plan in planned:
        record = jobdir.SweepRecord(point.index, tuple((p.point.index, p.point.name, dict(p.point.values))
                                                       for p in sw.points))
        assert bodies[point.index] == render_script(plan, "sbatch", {jobdir.SWEEP_FILE: record.to_text()})
        _shellcheck(bodies[point.index], tmp_path, f"point{point.index}.sbatch")
    parsed = jobdir.SweepRecord.from_text(record.to_text())
    assert parsed is not None and parsed.name == "lr1e-5" and [n for _i, n, _v in parsed.points] == \
        ["lr1e-6", "lr3e-6", "lr1e-5"]


def test_the_array_script_refuses_to_run_outside_an_array(tmp_path: Path) -> None:
    sw = _sweep(BASE + "sweep: {grid: {train.args.seed: [1, 2]}}\n")
    (script,) = render_sweep(sw, _planned(sw), "sbatch")
    f = tmp_path / "a.sbatch"
    f.write_text(script.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", str(f)], capture_output=True, text=True, env=env, check=False)
    assert res.returncode != 0 and "submit it with sbatch" in unwrapped(res.stderr)
    res = subprocess.run(["bash", str(f)], capture_output=True, text=True, env={**env, "SLURM_ARRAY_TASK_ID": "7"},
                         check=False)
    assert res.returncode == 2 and "no point of this script" in unwrapped(res.stderr)


def test_points_of_different_shapes_and_hetjobs_get_scripts_of_their_own() -> None:
    sw = _sweep(BASE + "sweep:\n  grid: {slurm.time: ['01:00:00', '02:00:00'], train.args.seed: [1, 2]}\n")
    planned = _planned(sw)
    groups = shapes(planned)
    assert [[p.index for p, _ in g] for g in groups] == [[0, 1], [2, 3]]
    scripts = render_sweep(sw, planned, "sbatch")
    assert ["--array=0-1" in s.text and "--array=2-3" not in s.text for s in scripts] == [True, False]
    het = _sweep("job: {name: h}\nmodel: {name_or_path: org/m}\nslurm: {partition: train}\n"
                 "vllm: {nodes: 1, tensor_parallel_size: 8, partition: infer}\n"
                 "train: {nodes: 1, args: {data: {path: d.jsonl}}}\nsweep: {grid: {train.args.seed: [1, 2]}}\n")
    scripts = render_sweep(het, _planned(het), "sbatch")
    assert [s.array for s in scripts] == [False, False]
    assert all("#SBATCH hetjob" in s.text and "--array" not in s.text for s in scripts)


def test_array_range() -> None:
    assert array_range([0, 1, 2], None) == "0-2"
    assert array_range([0, 2, 3, 4, 7], 3) == "0,2-4,7%3"


def test_render_writes_one_file_per_script_and_keeps_existing_ones(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(BASE + "sweep: {grid: {slurm.time: ['01:00:00', '02:00:00']}}\n")
    runner = CliRunner()
    res = runner.invoke(main, ["render", str(spec)])
    assert res.exit_code == 2 and "pass -o FILE" in unwrapped(res.stderr)
    res = runner.invoke(main, ["render", str(spec), "-o", str(tmp_path / "job.sbatch")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.glob("job*.sbatch")) == ["job.1.sbatch", "job.2.sbatch"]
    assert "LG025" in unwrapped(res.stderr)
    res = runner.invoke(main, ["render", str(spec), "-o", str(tmp_path / "job.sbatch")])
    assert res.exit_code == 2 and "--force" in unwrapped(res.stderr)


def test_plan_sums_the_gpu_hours_of_every_point(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("job: {name: g}\nmodel: {name_or_path: org/m}\nvllm: {gpus: [0, 1, 2, 3], "
                    "tensor_parallel_size: 4}\ntrain: {gpus: [4, 5, 6, 7], args: {data: {path: d.jsonl}, "
                    "max_steps: 100}}\nestimate: {step_time_s: 36}\n")
    res = CliRunner().invoke(main, ["plan", str(spec), "--sweep", "train.args.max_steps=100,300",
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["sweep"]
    assert [p["gpu_hours"] for p in got["points"]] == pytest.approx([8.0, 24.0])
    assert got["gpu_hours"] == pytest.approx(32.0)
    res = CliRunner().invoke(main, ["plan", str(spec), "--sweep", "train.args.max_steps=100,300", "--point",
                                    "steps300"])
    assert res.exit_code == 0 and "%A/steps300" in res.stdout, res.output


# ------------------------------------------------------------------------------------------ the example ---


@pytest.mark.parametrize("scheduler", ["sbatch", "bash"])
def test_the_example_checks_and_renders_one_script_as_its_golden(scheduler: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # where it is run from: its paths are relative to the repository
    runner = CliRunner()
    res = runner.invoke(main, ["check", "--no-files", str(EXAMPLE.relative_to(ROOT))])
    assert res.exit_code == 0, res.output
    assert "LG023" in unwrapped(res.stderr) and "share a job array" in unwrapped(res.stderr)
    args = ["render", str(EXAMPLE.relative_to(ROOT)), *(["--bash"] if scheduler == "bash" else [])]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    _shellcheck(res.stdout, tmp_path, "sweep.sh")
    golden = GOLDEN / f"cpu-quickstart-lr.{scheduler}.request.sh"
    text = _golden_text(res.stdout)
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.read_text() == text, f"{golden} differs: regenerate with LAUNCHGEN_UPDATE_GOLDEN=1, review"


def _golden_text(text: str) -> str:
    """What the sweep's golden keeps (as tests/test_render_golden.py keeps of a one-job script that is not a full
    golden): the driver whole, and of each point's script what varies with its spec, up to the machinery rule. That
    each point's script is the one-job script of its point is held by the array test above."""
    def request(m: re.Match[str]) -> str:
        body = m.group(3)
        return (f"{m.group(1)}{body[:body.index(MACHINERY_RULE)]}"
                f"# [golden: the rest of this point's script, launchgen's machinery, is in the full goldens]\n"
                f"{m.group(2)}\n")
    return re.sub(r"^([^\n]*3<<'(\S+)'\n)(.*?)^\2\n", request, text, flags=re.M | re.S)


# ------------------------------------------------------------------------------------------ hostile values ---

_HOSTILE = st.one_of(
    st.text(min_size=0, max_size=30),
    st.sampled_from(["$(touch /tmp/lg-pwned)", "`id`", "a'b\"c", "x\ny", "--flag", "%j/$HOME", "\x00", "\x1b[31m"]),
    st.integers(-5, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(),
    st.lists(st.integers(0, 9), max_size=3),
)
_PATHS = st.sampled_from(["job.name", "job.output_dir", "model.name_or_path", "train.args.learning_rate",
                          "train.args.data.path", "slurm.setup", "slurm.env.all.X", "train.script_args",
                          "slurm.partition", "model.revision", "train.args.generation.max_completion_length"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=_PATHS, values=st.lists(_HOSTILE, min_size=1, max_size=3, unique_by=lambda v: json.dumps(v)))
def test_hostile_sweep_values_are_refused_or_carried_verbatim(path: str, values: list[Any]) -> None:
    """A value is refused with a code (the sweep's LG0xx, or the point's own checks), or its point's script is
    exactly the one-job script of that point (whose quoting the one-job tests hold) inside a driver that bash
    parses, with one header line per point and a name that is a plain file name."""
    text = BASE + yaml.safe_dump({"sweep": {"grid": {path: values}}}, allow_unicode=True)
    try:
        sw = _sweep(text)
    except SpecError as exc:
        assert all(re.fullmatch(r"LG0\d\d", i.code) for i in exc.issues)
        return
    planned = []
    for ps in sw.points:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", ps.point.name)
        if ps.loaded is None:
            assert ps.issues
            continue
        plan, issues = run_checks(ps.loaded)
        if plan is None:
            assert any(i.severity == "error" for i in issues)
            continue
        planned.append((ps.point, plan))
    if not planned:
        return
    (script,) = render_sweep(sw, planned, "bash")
    subprocess.run(["bash", "-n"], input=script.text, text=True, check=True)
    header = script.text[:script.text.index("\nset -uo pipefail")]
    assert len(re.findall(r"^#   \d+  ", header, re.M)) == len(planned)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", header)


@settings(max_examples=40, deadline=None)
@given(item=st.text(max_size=40))
def test_any_cli_sweep_is_taken_or_refused_with_exit_2(item: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = tmp_path_factory.mktemp("cli") / "s.yaml"
    spec.write_text(BASE)
    res = CliRunner().invoke(main, ["check", "--no-files", str(spec), "--sweep", item])
    assert res.exit_code in (0, 2), res.output
    assert "Traceback" not in unwrapped(res.output) and "internal error" not in unwrapped(res.output)


def test_yaml_of_the_example_is_a_sweep() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert "sweep" in data and isinstance(sweep.load(read_spec_data(EXAMPLE.read_text(), str(EXAMPLE))), sweep.Sweep)
    assert not isinstance(sweep.load(read_spec_data(BASE, "b.yaml")), sweep.Sweep)
    assert isinstance(sweep.load(read_spec_data(BASE, "b.yaml")), LoadedSpec)


def test_check_json_lists_every_point_and_live_probes_run_per_point(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(BASE + "sweep: {grid: {train.args.seed: [1, 2]}}\n")
    res = CliRunner().invoke(main, ["check", "--no-files", "--format", "json", str(spec), "--sweep",
                                    "train.args.learning_rate=1e-5"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["ok"] and [p["name"] for p in got["points"]] == ["seed1", "seed2"]
    assert all(p["ok"] and p["values"]["train.args.learning_rate"] == 1e-5 for p in got["points"])
    assert [i["code"] for i in got["issues"]].count("LG023") == 1


def test_array_task_ids_as_scontrol_prints_them() -> None:
    from launchgen.readback.sweep import task_ids

    assert task_ids("3") == [3]
    assert task_ids("3-5") == [3, 4, 5]
    assert task_ids("[3-5]%2") == [3, 4, 5]
    assert task_ids("1,4,6-7") == [1, 4, 6, 7]


def test_status_reads_a_sweep_directory_the_scheduler_forgot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status <array id>` once scontrol no longer knows the array: launchgen-runs/<id> below the current directory;
    a point that never started is still a row (its name from another point's record)."""
    table = ((0, "lr1e-5", {"train.args.learning_rate": 1e-5}), (1, "lr3e-5", {"train.args.learning_rate": 3e-5}))
    done = tmp_path / "launchgen-runs" / "98765" / "lr1e-5"
    (done / "trainer").mkdir(parents=True)
    (done / jobdir.SWEEP_FILE).write_text(jobdir.SweepRecord(0, table).to_text())
    (done / "trainer" / jobdir.METRICS_FILE).write_text('{"step": 1, "reward": 0.5, "loss": 0.25}\n'
                                                        '{"step": 2, "reward": 0.75, "loss": 0.125}\n')
    (done / "trainer" / jobdir.COMPLETE_MARKER).write_text("{}")
    (done / "logs" / "attempt-0").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["status", "98765", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["points"]
    assert [(r["name"], r["state"], r["steps"], r["reward"], r["loss"], r["attempts"]) for r in rows] == [
        ("lr1e-5", "COMPLETED", 2, 0.75, 0.125, 1), ("lr3e-5", "NOT STARTED", None, None, None, 0)]


def test_a_bash_driver_runs_as_many_points_side_by_side_as_the_gpus_hold(tmp_path: Path) -> None:
    """Each point takes 2 GPUs (server on 0, trainer on 1); 4 visible GPUs hold 2 of the 3 points asked for at once:
    slots 0 and 1, each its own slice of CUDA_VISIBLE_DEVICES and its own port offset; the third starts after them.
    (The points themselves fail fast here, with no vllm on this machine: the driver's own schedule is the subject.)"""
    sw = _sweep("job: {name: g, output_dir: runs/%j}\nmodel: {name_or_path: org/m}\nslurm: {gpus_per_node: 2}\n"
                "vllm: {gpus: [0]}\ntrain: {gpus: [1], args: {data: {path: d.jsonl}}}\n"
                "sweep: {grid: {train.args.seed: [1, 2, 3]}, max_parallel: 3}\n")
    assert {ps.loaded.spec.job.port_offset for ps in sw.points if ps.loaded} == {"job_id"}
    (script,) = render_sweep(sw, _planned(sw), "bash")
    _shellcheck(script.text, tmp_path, "gpu-sweep.sh")
    # each point's script replaced by one that says what it was given
    slots = re.sub(r"^lg_sweep_start (\S+) 3<<'(\S+)'\n.*?^\2\n",
                   lambda m: f'lg_sweep_start {m[1]} 3<<\'EOF\'\necho "$LAUNCHGEN_SWEEP_SLOT $CUDA_VISIBLE_DEVICES"'
                             f' >{tmp_path}/{m[1]}.seen\nEOF\n', script.text, flags=re.S | re.M)
    assert slots.count("3<<'EOF'") == 3
    (tmp_path / "slots.sh").write_text(slots)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    res = subprocess.run(["bash", str(tmp_path / "slots.sh")], capture_output=True, text=True, env=env, timeout=60,
                         check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "4 GPU(s) here, 2 per point: 2 point(s) at a time" in unwrapped(res.stderr)
    seen = {n: (tmp_path / f"{n}.seen").read_text().split() for n in ("seed1", "seed2", "seed3")}
    assert seen == {"seed1": ["0", "4,5"], "seed2": ["1", "6,7"], "seed3": ["0", "4,5"]}
    log = res.stderr
    assert log.index("point seed2 ended") < log.index("point seed3 (slot 0)")
