"""Spec values cannot break out of shell quoting: they arrive verbatim and nothing in them executes.

Each case renders a --bash script from a spec whose free-text fields hold generated strings (spaces, quotes,
`$()`, backticks, newlines, globs, `;`) plus injection attempts that would create a canary file, runs the whole
script with recording stand-ins for `vllm` and `accelerate`, then checks that every value reached the server's
argv/env and the trainer's argv/env/parsed config byte for byte, and that the canary never appeared.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from recorders import install_recorders
from tools import path_with_venv, unwrapped

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.planning import outdir
from launchgen.planning.plan import PlanInvariantError, build_plan
from launchgen.script.render import render_script

INJECTIONS = [
    "$(touch {c})", "`touch {c}`", "'; touch {c}; '", '"; touch {c}; "', "$(touch {c})\n", "\n touch {c}\n",
    "${{IFS}}touch${{IFS}}{c}", "*", "a b  c", "\\", "'\"'\"'", "%j", "--flag=$HOME",
]

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("\n\t"),
               max_size=12)
PRINTABLE = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
                    min_size=1, max_size=10).filter(
    # job.output_dir refuses non-printables (LG910); `/` would only add directory levels
    lambda s: s.isprintable() and s.strip() and "/" not in s and s not in (".", ".."))


def _bin(dirpath: Path) -> None:
    install_recorders(dirpath)


def _argument(text: str) -> str:
    """`text` made a valid command-line argument (model.name_or_path): one line, trimmed, no leading `-`."""
    one = "".join(" " if not c.isprintable() else c for c in text).strip()
    return "m" + one if not one or one.startswith("-") else one


def _bareword(text: str) -> str:
    """`text` made a valid model.revision: an argument without blanks."""
    return _argument("".join(c for c in text if not c.isspace()))


def _case(value: str, injection: str, dirname: str, with_server: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        canary = root / "CANARY"
        inj = injection.format(c=canary)
        nasty = value + inj
        # model.name_or_path and model.revision become command-line words, so the spec refuses line breaks,
        # leading dashes (and, for the revision, blanks); vllm.bind must be an address. Everything else is free.
        name, revision, bind = _argument(nasty), _bareword(inj), "127.0.0.1"
        spec = {
            "job": {"name": "q", "output_dir": f"runs/{dirname}/%j"},
            "slurm": {"gpus_per_node": 2, "env": {"all": {"LG_TEST_ALL": nasty},
                                                  "server": {"LG_TEST_SERVER": inj + value},
                                                  "trainer": {"LG_TEST_TRAINER": nasty + "'"}}},
            "model": {"name_or_path": name, "revision": revision},
            "train": {"gpus": [1] if with_server else [0, 1],
                      "args": {"data": {"path": nasty, "system_prompt": inj}, "max_steps": 1}},
        }
        # LG_* is reserved for launchgen's own variables: rename the test's
        spec["slurm"]["env"] = {role: {k.replace("LG_", "QT_"): v for k, v in env.items()}
                                for role, env in spec["slurm"]["env"].items()}
        if with_server:
            spec["vllm"] = {"mode": "server", "gpus": [0], "bind": bind,
                            "extra_args": [nasty, inj, value], "health_timeout": 60}
        if outdir.problems(spec["job"]["output_dir"]):  # shell syntax the run-time expansion refuses (LG911)
            _, issues = run_checks(load_spec_text(yaml.safe_dump(spec), f"spec {inj}.yaml"), env={})
            assert "LG911" in [i.code for i in issues if i.severity == "error"]
            with pytest.raises(PlanInvariantError):
                build_plan(load_spec_text(yaml.safe_dump(spec), f"spec {inj}.yaml"))
            return
        plan = build_plan(load_spec_text(yaml.safe_dump(spec), f"spec {inj}.yaml"))
        script = root / "job.sh"
        script.write_text(render_script(plan, "bash"))
        rec = root / "rec"
        rec.mkdir()
        _bin(root / "bin")
        env = {**os.environ, "PATH": path_with_venv(None, root / "bin"), "REC_DIR": str(rec),
               "REC_WAIT_SERVER": "1" if with_server else "0"}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        res = subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=60)
        assert not canary.exists(), "a spec value was executed"
        try:  # the run-time expansion (launchgen.planning.outdir: $NAME, %j, %x, ...), relative to the submit directory
            job_dir = root / outdir.expand(spec["job"]["output_dir"], job_id="local", job_name="q",
                                           user=os.environ.get("USER") or getpass.getuser(), env=env)
        except outdir.UnsetVariable:
            assert res.returncode != 0 and "not set" in unwrapped(res.stderr), res.stderr[-3000:]
            return
        assert res.returncode == 0, res.stderr[-3000:]

        trainer = json.loads((rec / "trainer.json").read_text())
        assert trainer["env"]["QT_TEST_ALL"] == nasty
        assert trainer["env"]["QT_TEST_TRAINER"] == nasty + "'"
        assert "QT_TEST_SERVER" not in trainer["env"]
        cfg = trainer["config"]
        assert cfg["model"]["name_or_path"] == name and cfg["model"]["revision"] == revision
        assert cfg["data"]["path"] == nasty and cfg["data"]["system_prompt"] == inj
        assert cfg["output_dir"] == str(job_dir.resolve() / "trainer")
        # the embedded copy of the spec is the resolved spec, byte for byte
        assert (job_dir / "spec.yaml").read_text() == plan.spec_yaml
        if with_server:
            server = json.loads((rec / "server.json").read_text())
            argv = server["argv"][1:]  # [0] is the stand-in's own path
            expected = list(plan.server.commands[0].argv[1:])  # type: ignore[union-attr]
            assert len(argv) == len(expected)
            for got, want in zip(argv, expected, strict=True):
                if isinstance(want, str):
                    assert got == want
            assert argv[1] == name and argv[-3:] == [nasty, inj, value]
            assert server["env"]["QT_TEST_SERVER"] == inj + value and server["env"]["VLLM_SERVER_DEV_MODE"] == "1"
            assert cfg["generation"]["vllm_server"]["host"] == bind


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=TEXT, injection=st.sampled_from(INJECTIONS), dirname=PRINTABLE, with_server=st.booleans())
@example(value="a b'c\"d$(e)`f`\n*", injection="$(touch {c})", dirname="we ird'$(x)*", with_server=True)
@example(value="", injection="'; touch {c}; '", dirname="%j&x", with_server=False)
@example(value="v", injection="*", dirname="$HOME%x-%%j-${USER}", with_server=False)
@example(value="v", injection="*", dirname="$LG_NO_SUCH_VARIABLE", with_server=False)
def test_spec_values_arrive_verbatim_and_never_execute(value: str, injection: str, dirname: str,
                                                       with_server: bool) -> None:
    _case(value, injection, dirname, with_server)
