"""The static run record's compact form: runs of alike nodes, ranges of positions.

`launchgen-plan.static.json` is embedded in the job script, and SLURM refuses a script over its
`max_script_size` (4 MB by default). One entry per node made the script grow ~300 bytes a node, so in the
static record

* a run of alike nodes is one entry of `"nodes"` with `"count": N`: the nodes at positions `position` ..
  `position + N - 1`, alike in every key but the ranks, each rank that is not null one higher than the node
  before it (4,096 trainer nodes of one layout are one entry);
* a list of node positions (`trainer.positions`, `server.positions`, `server.replicas[].positions`) is a string
  of ranges, `"0-4095"` or `"0-3,8"`.

`expand_record` gives back the per-node form, the only form readers see: `RunRecord.from_json` applies it, and
the run-record writer the script runs at job start (jobdir.RUN_RECORD_WRITER) carries this module's source and
writes launchgen-plan.json expanded. Standard library only: the writer runs it under the compute node's plain
`python3`.
"""

from __future__ import annotations

from typing import Any

#: the keys of a node entry that go up by one from node to node along a run
RANK_KEYS = ("machine_rank", "server_rank")
#: the keys holding a list of node positions, as (section, key); `replicas` is a list of sections
POSITION_KEYS = (("trainer", "positions"), ("server", "positions"))
#: a hand-edited record cannot make a reader expand more nodes than this (the spec's bound is 65,536)
MAX_EXPANDED = 1 << 20


def ranges(values: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 3, 8] -> [(0, 3), (8, 8)]: the runs of consecutive values, first and last."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return [(lo, hi) for lo, hi in runs]


def ranges_text(values: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8" (empty: "")."""
    return ",".join(span_text(lo, hi) for lo, hi in ranges(values))


def span_text(lo: int, hi: int) -> str:
    """One run of values as text: `3`, or `0-4095`."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def ranges_list(text: str) -> list[int]:
    """"0-3,8" -> [0, 1, 2, 3, 8]; ValueError for text that is not ranges (or names too many)."""
    out: list[int] = []
    for part in text.split(",") if text else []:
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if lo < 0 or hi < lo or len(out) + hi - lo >= MAX_EXPANDED:
            raise ValueError(part)
        out.extend(range(lo, hi + 1))
    return out


def _continues(entry: dict[str, Any], node: dict[str, Any]) -> bool:
    """`node` is the next node of the run `entry` (alike but for its position and ranks)."""
    count = entry.get("count", 1)
    if entry.keys() - {"count"} != node.keys() or node.get("position") != entry["position"] + count:
        return False
    for key, value in node.items():
        if key in RANK_KEYS:
            if (value is None) != (entry[key] is None) or (value is not None and value != entry[key] + count):
                return False
        elif key != "position" and value != entry[key]:
            return False
    return True


def fold_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-node entries (positions in order) -> one entry per run of alike nodes (`count` where more than one)."""
    out: list[dict[str, Any]] = []
    for node in nodes:
        if out and _continues(out[-1], node):
            out[-1]["count"] = out[-1].get("count", 1) + 1
        else:
            out.append(dict(node))
    return out


def expand_nodes(entries: list[Any]) -> list[Any]:
    """The inverse of `fold_nodes`. An entry that is not a well-formed run is kept as it is (a reader of a
    hand-edited record skips what it cannot use)."""
    out: list[Any] = []
    for entry in entries:
        if not _is_run(entry, MAX_EXPANDED - len(out)):
            out.append(entry)
            continue
        for i in range(entry["count"]):
            node = {k: v for k, v in entry.items() if k != "count"}
            node["position"] = entry["position"] + i
            for key in RANK_KEYS:
                if node.get(key) is not None:
                    node[key] += i
            out.append(node)
    return out


def _is_run(entry: Any, room: int) -> bool:
    if not isinstance(entry, dict) or type(entry.get("position")) is not int:
        return False
    count = entry.get("count")
    return type(count) is int and 0 < count <= room and all(type(entry.get(k)) in (int, type(None)) for k in RANK_KEYS)


def fold_record(plan: dict[str, Any]) -> dict[str, Any]:
    """The static record's plan (per-node form) -> its compact form (a new dict; `plan` is left as it is)."""
    out = dict(plan, nodes=fold_nodes(plan["nodes"]))
    for section, key in POSITION_KEYS:
        if isinstance(out.get(section), dict):
            out[section] = dict(out[section], **{key: ranges_text(out[section][key])})
    if isinstance(out.get("server"), dict):
        out["server"]["replicas"] = [dict(r, positions=ranges_text(r["positions"]))
                                     for r in out["server"]["replicas"]]
    return out


def _expand_positions(section: dict[str, Any]) -> dict[str, Any]:
    value = section.get("positions")
    if isinstance(value, str):
        try:
            return dict(section, positions=ranges_list(value))
        except ValueError:
            return section
    return section


def expand_record(plan: dict[str, Any]) -> dict[str, Any]:
    """A run record in either form -> the per-node form (a new dict[str, Any]). Tolerant: what is not in the compact form
    (an expanded record, a hand-edited value) is kept as it is."""
    out = dict(plan)
    if isinstance(out.get("nodes"), list):
        out["nodes"] = expand_nodes(out["nodes"])
    for section, _key in POSITION_KEYS:
        if isinstance(out.get(section), dict):
            out[section] = _expand_positions(out[section])
    server = out.get("server")
    if isinstance(server, dict) and isinstance(server.get("replicas"), list):
        server["replicas"] = [_expand_positions(r) if isinstance(r, dict) else r for r in server["replicas"]]
    return out
