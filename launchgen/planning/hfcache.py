"""Read-only lookups in a model directory or the local Hugging Face cache, by path alone.

`check` must stay fast and offline, so this never touches the network and never imports huggingface_hub or
transformers: it follows the cache layout those libraries write (`<cache>/models--org--name/refs/<branch>`
holding a commit, `<cache>/models--org--name/snapshots/<commit>/config.json`) and reads JSON with `json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchgen.input import specfiles

#: config.json keys that mark a mixture-of-experts model (vLLM's data parallelism only pays off for these).
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache directory, resolved the way huggingface_hub does from the environment."""
    e = os.environ if env is None else env
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if e.get(key):
            return Path(e[key]).expanduser()
    if e.get("HF_HOME"):
        return Path(e["HF_HOME"]).expanduser() / "hub"
    xdg = e.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def kernels_cache_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where the `kernels` package looks for Hub kernels: KERNELS_CACHE if set, then the hub cache."""
    e = os.environ if env is None else env
    dirs = []
    if e.get("KERNELS_CACHE"):
        dirs.append(Path(e["KERNELS_CACHE"]).expanduser())
    dirs.append(hub_cache_dir(e))
    return dirs


def repo_folder(cache: Path, repo_id: str, repo_type: str = "model") -> Path:
    return cache / f"{repo_type}s--{repo_id.replace('/', '--')}"


def snapshot_dir(cache: Path, repo_id: str, revision: str | None, repo_type: str = "model") -> Path | None:
    """The cached snapshot for `revision` (a branch/tag in refs/, or a commit), or None if not cached."""
    folder = repo_folder(cache, repo_id, repo_type)
    snapshots = folder / "snapshots"
    rev = revision or "main"
    ref = folder / "refs" / rev
    try:  # OSError also for names no path can be (ENAMETOOLONG): not cached
        if not snapshots.is_dir():
            return None
        if ref.is_file():
            commit = ref.read_text().strip()
            if (snapshots / commit).is_dir():
                return snapshots / commit
        if (snapshots / rev).is_dir():
            return snapshots / rev
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class ModelConfig:
    source: str  # the config.json path it was read from
    data: dict[str, Any]

    def _int(self, key: str) -> int | None:
        cfg = self.data.get("text_config") if isinstance(self.data.get("text_config"), dict) else None
        for d in (self.data, cfg or {}):
            v = d.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    @property
    def num_attention_heads(self) -> int | None:
        return self._int("num_attention_heads")

    @property
    def num_key_value_heads(self) -> int | None:
        # Configs without the key use multi-head attention: as many KV heads as query heads.
        return self._int("num_key_value_heads") or self.num_attention_heads

    @property
    def num_hidden_layers(self) -> int | None:
        return self._int("num_hidden_layers")

    @property
    def max_position_embeddings(self) -> int | None:
        return self._int("max_position_embeddings")

    @property
    def is_gqa(self) -> bool | None:
        q, kv = self.num_attention_heads, self.num_key_value_heads
        if q is None or kv is None:
            return None
        return kv < q

    @property
    def is_moe(self) -> bool:
        text = self.data.get("text_config")
        dicts: list[dict[str, Any]] = [self.data, text] if isinstance(text, dict) else [self.data]
        return any(isinstance(d.get(k), int) and d[k] > 1 for d in dicts for k in MOE_KEYS)


def _local_dir(name_or_path: str) -> Path | None:
    """`name_or_path` as an existing local directory; None otherwise, also for names no path can be (too long)."""
    try:
        local = Path(name_or_path).expanduser()
        return local if local.is_dir() else None
    except (OSError, RuntimeError):  # ENAMETOOLONG and the like; RuntimeError: `~user` without that user
        return None


def find_model_config(name_or_path: str, revision: str | None = None,
                      env: Mapping[str, str] | None = None) -> ModelConfig | None:
    """config.json of a local model directory or of the cached Hub snapshot; None when not reachable locally."""
    candidates: list[Path] = []
    local = _local_dir(name_or_path)
    if local is not None:
        candidates.append(local / "config.json")
    else:
        snap = snapshot_dir(hub_cache_dir(env), name_or_path, revision)
        if snap is not None:
            candidates.append(snap / "config.json")
    for c in candidates:
        try:
            data = json.loads(specfiles.read_text(c))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return ModelConfig(str(c), data)
    return None


def model_in_cache(name_or_path: str, revision: str | None, env: Mapping[str, str] | None = None) -> bool:
    """A local directory, or a cached snapshot of the revision holding a config.json."""
    if _local_dir(name_or_path) is not None:
        return True
    snap = snapshot_dir(hub_cache_dir(env), name_or_path, revision)
    return snap is not None and (snap / "config.json").is_file()


def kernel_in_cache(repo_id: str, revision: str | None, env: Mapping[str, str] | None = None) -> bool:
    """A cached Hub kernel at `revision` (a `vN` branch, tag or commit); unpinned: any `v*` ref.

    kernels accepts both the `kernels--` and the legacy `models--` cache layouts (reference 7.2), and
    `LOCAL_KERNELS="org/repo=/path:..."` overrides the cache with local builds.
    """
    e = os.environ if env is None else env
    for item in e.get("LOCAL_KERNELS", "").split(":"):
        name, sep, path = item.partition("=")
        if sep and name.strip() == repo_id and Path(path).expanduser().is_dir():
            return True
    for cache in kernels_cache_dirs(env):
        for repo_type in ("kernel", "model"):
            if revision is not None:
                if snapshot_dir(cache, repo_id, revision, repo_type) is not None:
                    return True
                continue
            refs = repo_folder(cache, repo_id, repo_type) / "refs"
            if refs.is_dir():
                for ref in refs.iterdir():
                    if ref.name.startswith("v") and snapshot_dir(cache, repo_id, ref.name, repo_type):
                        return True
    return False
