"""Local prompt/example files: which `data.path` is local, how to read it whole (trainer) or peek at it (`check`).

Formats: `.jsonl`, `.json` (a list of objects, a one-list wrapper `{"train": [...]}`, or columnar `{col: [...]}`),
`.parquet` (needs pyarrow) and a `datasets` `save_to_disk` directory (a Dataset, or a DatasetDict whose
`data.split` is used; read with pyarrow, as `datasets` itself does). Anything else that is not a local path is a
Hub data set name, loaded by `data.py` with `datasets`.

Standard library only at import time (pyarrow is imported by the functions that need it): `launchgen check` peeks
with these same readers on a login node, so what it accepts is what the trainer reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchgen.trainers.declarations.config import DataSection
from launchgen.trainers.declarations.errors import TrainerSetupError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
#: Files `datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk` write at the top of their directory.
DATASET_FILES = ("dataset_info.json", "state.json")
DATASET_DICT_FILE = "dataset_dict.json"
#: A .json file up to this size is parsed whole when peeking at a shape the incremental reader does not handle.
JSON_PEEK_WHOLE_BYTES = 64 << 20
PEEK_ROWS = 5


class PeekUnavailable(Exception):
    """The file cannot be peeked at here (a package is missing, the shape needs a full read); says why."""


def local_path(path: str) -> Path | None:
    """The local file or directory `data.path` names, or None for a Hub data set name (the trainer's rule)."""
    p = Path(path).expanduser()
    if p.exists() or p.suffix.lower() in LOCAL_SUFFIXES or path.startswith((".", "/", "~")):
        return p
    return None


# --- JSON ------------------------------------------------------------------------------------------------


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TrainerSetupError(f"data.path {path}: line {n} is not JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise TrainerSetupError(f"data.path {path}: line {n} is a {type(row).__name__}, not an object "
                                        "(one JSON object per prompt)")
            yield row


def rows_of_json(obj: Any, path: Path) -> list[dict[str, Any]]:
    """A parsed .json file -> its rows: a list of objects, a one-list wrapper, or a columnar mapping."""
    if isinstance(obj, dict):
        lists = {k: v for k, v in obj.items() if isinstance(v, list)}
        if len(lists) == 1 and all(isinstance(x, dict) for x in next(iter(lists.values()))):
            obj = next(iter(lists.values()))
        elif lists and len(lists) == len(obj) and len({len(v) for v in lists.values()}) == 1:
            keys = list(lists)
            obj = [dict(zip(keys, vals, strict=True)) for vals in zip(*lists.values(), strict=True)]
    if not isinstance(obj, list) or not all(isinstance(x, dict) for x in obj):
        raise TrainerSetupError(f"data.path {path}: expected a list of objects (one per prompt)")
    return obj


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TrainerSetupError(f"data.path {path}: not JSON ({e.msg} at line {e.lineno})") from e


def _peek_json_list(path: Path, n: int) -> list[dict[str, Any]] | None:
    """The first `n` objects of a top-level JSON list, decoded incrementally; None if the file is not a list."""
    dec = json.JSONDecoder()
    with path.open(encoding="utf-8") as fh:
        buf, pos, eof = "", 0, False

        def more() -> bool:
            nonlocal buf, eof
            chunk = fh.read(1 << 20)
            eof = not chunk
            buf += chunk
            return bool(chunk)

        def skip(chars: str) -> None:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in chars:
                    pos += 1
                if pos < len(buf) or not more():
                    return

        skip(" \t\r\n")
        if pos >= len(buf) or buf[pos] != "[":
            return None
        pos += 1
        rows: list[dict[str, Any]] = []
        while len(rows) < n:
            skip(" \t\r\n,")
            if pos >= len(buf) or buf[pos] == "]":
                break
            while True:
                try:
                    obj, end = dec.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    if eof or not more():
                        line = buf.count("\n", 0, e.pos) + 1
                        raise TrainerSetupError(f"data.path {path}: not JSON ({e.msg} at line {line})") from e
            if not isinstance(obj, dict):
                raise TrainerSetupError(f"data.path {path}: expected a list of objects (one per prompt)")
            rows.append(obj)
            pos = end
        return rows


# --- Arrow (parquet, save_to_disk) ------------------------------------------------------------------------


def _pyarrow(path: Path, what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as e:
        raise PeekUnavailable(f"reading {what} {path} needs pyarrow: pip install 'launchgen[data]'") from e
    return pyarrow


@dataclass(frozen=True)
class SavedDataset:
    """A `save_to_disk` folder resolved to one split: its arrow files and its feature (column) names."""

    root: Path
    arrow_files: list[Path]
    columns: list[str] = field(default_factory=list)


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / DATASET_DICT_FILE).is_file() or all((path / f).is_file() for f in DATASET_FILES))


def saved_dataset(path: Path, split: str) -> SavedDataset:
    """Resolve a save_to_disk directory (a DatasetDict picks `split`); reads only its small JSON files."""
    root = path
    if (path / DATASET_DICT_FILE).is_file():
        try:
            splits = json.loads((path / DATASET_DICT_FILE).read_text(encoding="utf-8")).get("splits", [])
        except (json.JSONDecodeError, AttributeError) as e:
            raise TrainerSetupError(f"data.path {path}: {DATASET_DICT_FILE} is not valid") from e
        if split not in splits:
            raise TrainerSetupError(f"data.split {split!r} is not a split of the saved DatasetDict {path} "
                                    f"(splits: {', '.join(map(str, splits)) or 'none'}); set data.split")
        root = path / split
    try:
        state = json.loads((root / "state.json").read_text(encoding="utf-8"))
        info = json.loads((root / "dataset_info.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TrainerSetupError(f"data.path {root}: not a complete datasets save_to_disk folder ({e})") from e
    files = [root / str(f.get("filename")) for f in state.get("_data_files", []) if isinstance(f, dict)]
    if not files:
        raise TrainerSetupError(f"data.path {root}: no rows (state.json lists no data files)")
    features = info.get("features") if isinstance(info, dict) else None
    return SavedDataset(root, files, list(features) if isinstance(features, dict) else [])


def _arrow_rows(files: list[Path], limit: int | None) -> list[dict[str, Any]]:
    pa = _pyarrow(files[0], "a save_to_disk data set")
    rows: list[dict[str, Any]] = []
    for f in files:
        with pa.memory_map(str(f)) as src:
            reader = pa.ipc.open_stream(src)
            for batch in reader:
                rows.extend(batch.to_pylist())
                if limit is not None and len(rows) >= limit:
                    return rows[:limit]
    return rows


def _parquet_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    pa = _pyarrow(path, "parquet")
    if limit is None:
        return list(pa.parquet.read_table(path).to_pylist())
    pf = pa.parquet.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=limit):
        return list(batch.to_pylist())
    return []


# --- whole read (trainer) and peek (check) ------------------------------------------------------------------


def _refuse_dir(path: Path) -> TrainerSetupError:
    return TrainerSetupError(f"data.path {path} is a directory but not a datasets save_to_disk folder (no "
                             f"{DATASET_DICT_FILE}, or no {' + '.join(DATASET_FILES)}); point it at a "
                             f"{'/'.join(LOCAL_SUFFIXES)} file or a save_to_disk folder")


def _unsupported(path: Path) -> TrainerSetupError:
    return TrainerSetupError(f"data.path {path}: unsupported file type {path.suffix!r} (use "
                             f"{', '.join(LOCAL_SUFFIXES)} or a datasets save_to_disk folder)")


def read_local(path: Path, split: str) -> list[dict[str, Any]]:
    """Every row of a local file or save_to_disk folder (before column_mapping)."""
    if path.is_dir():
        if not is_saved_dataset(path):
            raise _refuse_dir(path)
        try:
            return _arrow_rows(saved_dataset(path, split).arrow_files, None)
        except PeekUnavailable as e:
            raise TrainerSetupError(str(e)) from e
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return list(_jsonl_rows(path))
    if suffix == ".json":
        return rows_of_json(_load_json(path), path)
    if suffix == ".parquet":
        try:
            return _parquet_rows(path, None)
        except PeekUnavailable as e:
            raise TrainerSetupError(str(e)) from e
    raise _unsupported(path)


@dataclass(frozen=True)
class Peek:
    """The first rows of a local data source (before column_mapping) and its column names."""

    rows: list[dict[str, Any]]
    columns: list[str]  # of the first row, or of the schema when no row could be read


def _peek_json(path: Path, n: int) -> list[dict[str, Any]]:
    rows = _peek_json_list(path, n)
    if rows is not None:
        return rows
    if path.stat().st_size > JSON_PEEK_WHOLE_BYTES:
        raise PeekUnavailable(f"{path} is a JSON mapping larger than {JSON_PEEK_WHOLE_BYTES >> 20} MiB; peeking "
                              "needs a full parse (JSON Lines can be peeked at)")
    return rows_of_json(_load_json(path), path)[:n]


def peek_local(path: Path, split: str, n: int = PEEK_ROWS) -> Peek:
    """The first `n` rows without reading the whole file; TrainerSetupError when the trainer would fail on it."""
    if path.is_dir():
        if not is_saved_dataset(path):
            raise _refuse_dir(path)
        saved = saved_dataset(path, split)
        try:
            rows = _arrow_rows(saved.arrow_files, n)
        except PeekUnavailable:
            if not saved.columns:
                raise
            return Peek([], saved.columns)  # dataset_info.json names the columns; pyarrow would give rows
        if not rows:
            raise TrainerSetupError(f"data.path {path}: no rows")
        return Peek(rows, list(rows[0]))
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        for row in _jsonl_rows(path):
            rows.append(row)
            if len(rows) >= n:
                break
    elif suffix == ".json":
        rows = _peek_json(path, n)
    elif suffix == ".parquet":
        rows = _parquet_rows(path, n)
    else:
        raise _unsupported(path)
    return Peek(rows, list(rows[0]) if rows else [])


def mapped(row: dict[str, Any], data: DataSection) -> dict[str, Any]:
    return {data.column_mapping.get(k, k): v for k, v in row.items()} if data.column_mapping else row


def detect_sft_format(row: dict[str, Any], prompt_column: str) -> str:
    """Which of the SFT row formats a (mapped) row is: messages, prompt_completion or text."""
    if "messages" in row:
        return "messages"
    if prompt_column in row and "completion" in row:
        return "prompt_completion"
    if "text" in row:
        return "text"
    raise TrainerSetupError(
        f"data: sft needs a `messages` column (chat), `{prompt_column}` + `completion` columns, or a `text` column; "
        f"found {', '.join(sorted(row)) or 'none'}: rename with data.column_mapping (or set data.prompt_column)"
    )
