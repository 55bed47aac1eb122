"""The hostile matrix: every string field of the spec x hostile payloads.

Each (field, payload) is either refused (every error has a code and a line, nothing raises) or renders scripts
that bash parses, with the value on its own `#SBATCH` line where it is a directive value. Then, per payload, one
spec carrying it in every field that accepted it is run as the rendered `--bash` script with recording
stand-ins for `vllm` and `accelerate`: every value arrives byte for byte (argv, environment, trainer config, job
directory) and the canary an injection would create never appears. A hypothesis test throws generated text at
random fields the same way. Alias bombs and raw NUL bytes are in test_input_yaml.py. `slurm.setup` is shell code by design and is not in the matrix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from recorders import install_recorders
from tools import path_with_venv

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.input.spec import Spec
from launchgen.script.render import render_script
from launchgen.shared.issues import Issue, SpecError

CANARY = "CANARY"
PAYLOADS = {
    "metachars": "a;b|c&d>e<f",
    "subst": f"$(touch {CANARY})",
    "subst-nospace": f"$(touch${{IFS}}{CANARY})",
    "backticks": f"`touch {CANARY}`",
    "single-quote": f"'; touch {CANARY}; '",
    "double-quote": f'"; touch {CANARY}; "',
    "newline": f"a\ntouch {CANARY}",
    "trailing-newline": "abc\n",
    "nul": "a\x00b",
    "unicode": "ünïcödé-☃",
    "leading-dash": "--help",
    "dash": "-x",
    "long": "x" * 5000,
    "variable": "${HOME}",
    "glob": "*",
    "blank": "a  b",
    "empty": "",
    "escape": "\x1b[2J",
    "backslash": "a\\b",
    "percent-j": "%j",
}
BASE: dict[str, Any] = {
    "job": {"name": "hostile", "output_dir": "runs/%j"},
    "slurm": {"gpus_per_node": 2, "env": {"all": {"QT_ALL": "1"}}},
    "model": {"name_or_path": "org/model"},
    "vllm": {"mode": "server", "gpus": [0], "health_timeout": 120},
    "train": {"gpus": [1], "args": {"data": {"path": "prompts.jsonl"}, "max_steps": 1}},
}
#: trainer arguments that are plain strings (the trainer config is the spec's too)
ARGS_FIELDS = ("train.args.data.path", "train.args.data.system_prompt", "train.args.data.prompt_column")
SKIP = {"slurm.setup"}  # shell code by design
CODE = re.compile(r"LG\d{3}")


def string_fields(model: type[BaseModel] = Spec, prefix: str = "") -> Iterator[str]:
    """Dotted paths of every string a user writes: str fields, list items (`.0`), dict keys/values (`.<key>`,
    `.=`)."""
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        tp = f.annotation
        alts = get_args(tp) if get_origin(tp) is not None and get_origin(tp) not in (list, dict) else (tp,)
        for alt in map(_plain, alts):
            if isinstance(alt, type) and issubclass(alt, BaseModel):
                yield from string_fields(alt, f"{path}.")
            elif alt is str:
                yield path
            elif get_origin(alt) is list and get_args(alt) and _plain(get_args(alt)[0]) is str:
                yield f"{path}.0"
            elif get_origin(alt) is dict and get_args(alt)[1] is str:
                yield f"{path}.<key>"
                yield f"{path}.="
    if model is Spec:
        yield from ARGS_FIELDS


def _plain(tp: Any) -> Any:
    """`Annotated[str, ...]` -> str."""
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


FIELDS = sorted(f for f in string_fields() if f not in SKIP and not f.startswith("slurm.setup"))


def with_value(field: str, value: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """BASE (or `data`, changed in place) with `value` at `field`."""
    data = json.loads(json.dumps(BASE)) if data is None else data
    parts = field.split(".")
    node = data
    for p in parts[:-2] if parts[-1] in ("0", "<key>", "=") else parts[:-1]:
        node = node.setdefault(p, {})
    last = parts[-1]
    if last == "0":
        node[parts[-2]] = [value]
    elif last == "<key>":
        node.setdefault(parts[-2], {})[value] = "v"
    elif last == "=":
        node.setdefault(parts[-2], {})[f"QT_{parts[-2].upper()}"] = value
    else:
        node[last] = value
    return data


def outcome(data: dict[str, Any]) -> tuple[list[Issue], Any]:
    try:
        loaded = load_spec_text(yaml.safe_dump(data, allow_unicode=True), "spec.yaml")
    except SpecError as exc:
        return exc.issues, None
    plan, issues = run_checks(loaded, env={"HF_HOME": "/nonexistent-hf-home"})
    return issues, plan


def test_matrix_covers_every_string_field() -> None:
    expected = {"job.name", "job.output_dir", "model.name_or_path", "model.revision", "vllm.bind",
                "vllm.executable", "vllm.extra_args.0", "slurm.extra_directives.0", "slurm.partition",
                "slurm.env.all.<key>", "slurm.env.trainer.=", "train.attn_implementation", "vllm.version"}
    assert expected <= set(FIELDS), sorted(expected - set(FIELDS))
    assert len(FIELDS) >= 25


#: payload name -> fields that accept it (filled by the matrix test, reused by the run test)
_ACCEPTED: dict[str, list[str]] = {}


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_each_field_refuses_with_a_code_and_line_or_renders(payload: str) -> None:
    value = PAYLOADS[payload]
    accepted = []
    for field in FIELDS:
        issues, plan = outcome(with_value(field, value))
        errors = [i for i in issues if i.severity == "error"]
        for i in errors:
            assert CODE.fullmatch(i.code) and i.line is not None and i.message, (field, i)
        if plan is None:
            assert errors, (field, issues)
            continue
        sbatch = render_script(plan, "sbatch")
        bash = render_script(plan, "bash")
        for script in (sbatch, bash):
            r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (field, r.stderr)
        header = [ln for ln in sbatch.splitlines() if ln.startswith("#SBATCH ")]
        first_body = sbatch.splitlines().index(header[-1]) + 1
        # nothing ended the header early: every directive launchgen owns is still there, each on its line
        assert {"--signal=B:USR2@120", "--requeue", "--open-mode=append"} <= {h[8:] for h in header}, (field, header)
        assert not any(ln.startswith("#SBATCH") for ln in sbatch.splitlines()[first_body:])
        if field.startswith("slurm.") and field.split(".")[1] in ("partition", "account", "qos"):
            assert f"#SBATCH --{field.split('.')[1]}={value}" in header
        accepted.append(field)
    _ACCEPTED[payload] = accepted
    # the words that become command-line arguments never take a leading dash, a NUL or a line break
    if payload in ("leading-dash", "dash", "newline", "trailing-newline", "nul", "empty", "escape"):
        for field in ("model.name_or_path", "model.revision", "vllm.bind", "vllm.executable", "job.name"):
            assert field not in accepted, (payload, field)


#: fields whose value the recorded run shows, and where
RUN_FIELDS = ("model.name_or_path", "model.revision", "vllm.executable", "vllm.extra_args.0", "slurm.env.all.=",
              "slurm.env.server.=", "slurm.env.trainer.=", "slurm.env.all.<key>", "job.output_dir",
              *ARGS_FIELDS)


def combined(payload: str, fields: list[str]) -> dict[str, Any]:
    data = json.loads(json.dumps(BASE))
    for field in fields:
        with_value(field, PAYLOADS[payload], data)
    return data


# (subst-nospace and variable add nothing here that subst and metachars do not)
RUN_PAYLOADS = ["metachars", "subst", "backticks", "single-quote", "double-quote", "unicode", "glob", "blank",
                "backslash", "percent-j", "newline", "trailing-newline", "escape", "leading-dash", "empty"]


@pytest.mark.parametrize("payload", RUN_PAYLOADS)
def test_accepted_values_arrive_byte_exact_and_never_execute(payload: str) -> None:
    if payload not in _ACCEPTED:
        test_each_field_refuses_with_a_code_and_line_or_renders(payload)
    value = PAYLOADS[payload]
    fields = [f for f in _ACCEPTED[payload] if f in RUN_FIELDS]
    if "vllm.executable" in fields and len(value.encode()) > 255:
        fields.remove("vllm.executable")
    data = combined(payload, fields)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        issues, plan = outcome(data)
        assert plan is not None, [i.format() for i in issues]
        (root / "job.sh").write_text(render_script(plan, "bash"))
        rec, bindir = root / "rec", root / "bin"
        rec.mkdir()
        install_recorders(bindir, value if "vllm.executable" in fields else "vllm")
        env = {**os.environ, "PATH": path_with_venv(None, bindir), "REC_DIR": str(rec), "REC_WAIT_SERVER": "1"}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        res = subprocess.run(["bash", str(root / "job.sh")], cwd=root, env=env, capture_output=True, text=True,
                             timeout=90)
        assert not (root / CANARY).exists() and not list(root.rglob(CANARY)), "a spec value was executed"
        assert res.returncode == 0, res.stderr[-3000:]
        server = json.loads((rec / "server.json").read_text())
        trainer = json.loads((rec / "trainer.json").read_text())
        _assert_arrived(fields, value, server, trainer, root)


def _assert_arrived(fields: list[str], value: str, server: dict[str, Any], trainer: dict[str, Any],
                    root: Path) -> None:
    cfg = trainer["config"]
    checks = {
        "model.name_or_path": lambda: server["argv"][2] == value and cfg["model"]["name_or_path"] == value,
        "model.revision": lambda: value in server["argv"] and cfg["model"]["revision"] == value,
        "vllm.executable": lambda: Path(server["argv"][0]).name == value,
        "vllm.extra_args.0": lambda: server["argv"][-1] == value,
        "slurm.env.all.=": lambda: server["env"]["QT_ALL"] == value == trainer["env"]["QT_ALL"],
        "slurm.env.server.=": lambda: server["env"]["QT_SERVER"] == value and "QT_SERVER" not in trainer["env"],
        "slurm.env.trainer.=": lambda: trainer["env"]["QT_TRAINER"] == value and "QT_TRAINER" not in server["env"],
        "slurm.env.all.<key>": lambda: trainer["env"][value] == "v",
        "job.output_dir": lambda: (root / value.replace("%j", "local")).is_dir(),
        "train.args.data.path": lambda: cfg["data"]["path"] == value,
        "train.args.data.system_prompt": lambda: cfg["data"]["system_prompt"] == value,
        "train.args.data.prompt_column": lambda: cfg["data"]["prompt_column"] == value,
    }
    for field in fields:
        assert checks[field](), (field, value)


HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from("$`'\"\\;|&<>(){}[]*?!#~%\n\t\x00\x1b- aZ9é/=:@"), max_size=30),
    st.sampled_from(list(PAYLOADS.values())).flatmap(lambda p: st.text(max_size=8).map(lambda t: p + t)),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=HOSTILE_TEXT)
def test_random_values_refused_cleanly_or_rendered_intact(field: str, value: str) -> None:
    issues, plan = outcome(with_value(field, value))
    for i in issues:
        assert CODE.fullmatch(i.code) and (i.line is not None or i.severity != "error") and i.message, i
    if plan is None:
        assert any(i.severity == "error" for i in issues)
        return
    sbatch = render_script(plan, "sbatch")
    r = subprocess.run(["bash", "-n"], input=sbatch, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    header = [ln[8:] for ln in sbatch.splitlines() if ln.startswith("#SBATCH ")]
    assert {"--signal=B:USR2@120", "--requeue", "--open-mode=append"} <= set(header)
