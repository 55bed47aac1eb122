"""Reads a wandb run file (`run-<id>.wandb`) back: wandb's own Python package ships no reader.

The file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version), then 32 KiB blocks of chunks,
each `crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last)` and the chunk, a
block's tail shorter than a chunk header being zero padding. Each whole record is a `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32768
_HEAD = 7


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, buf = _HEAD, b""
    while pos + _HEAD <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEAD:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + _HEAD])
        if kind == 0 and n == 0:  # the rest of the block is padding
            pos += left
            continue
        buf += data[pos + _HEAD : pos + _HEAD + n]
        pos += _HEAD + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def history(path: Path) -> list[dict[str, Any]]:
    """The logged rows (`run.log`), values decoded from JSON, wandb's own `_*` keys dropped."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
    return rows


def run_info(path: Path) -> dict[str, Any]:
    """The run record: project, display name and the config `wandb.init(config=...)` logged."""
    for rec in records(path):
        if rec.WhichOneof("record_type") == "run":
            cfg = {item.key: json.loads(item.value_json) for item in rec.run.config.update}
            return {"id": rec.run.run_id, "project": rec.run.project, "name": rec.run.display_name, "config": cfg}
    raise AssertionError(f"{path} has no run record")


def wait_closed(path: Path, timeout: float = 30.0) -> None:
    """Until the run's exit record is in the file: wandb's writer process may still be flushing after finish()."""
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout}s"
        time.sleep(0.2)


def wait_runs(root: Path, run_id: str, count: int, timeout: float = 60.0) -> list[Path]:
    """The run files of `run_id` under `root` (oldest first) once there are `count` of them: wandb's writer process
    creates a run's file after init returns, later still on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        runs = sorted(root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
        if len(runs) >= count:
            return runs
        assert time.monotonic() < deadline, f"{len(runs)} run file(s) of {run_id} after {timeout}s, not {count}"
        time.sleep(0.2)


def wait_next_second(run_file: Path) -> None:
    """Until the clock is past the second that names `run_file`'s directory (`offline-run-YYYYMMDD_HHMMSS-<id>`):
    wandb names a run's directory by its start second, so a run started within that second would share it."""
    stamp = run_file.parent.name.split("-")[2]
    while time.strftime("%Y%m%d_%H%M%S") <= stamp:
        time.sleep(0.05)
