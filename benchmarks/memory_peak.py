"""Where a run's peak of GPU memory goes: the caching allocator's history, replayed to the peak, by allocating code.

    with memory_peak.recording() as rec:
        run()
    print(memory_peak.breakdown(rec.snapshot))

`torch.cuda.memory._record_memory_history` logs every block's alloc and free with the Python stack that asked
for it. Replaying that log gives the set of blocks live at the moment the allocated total was highest (the
number `max_memory_allocated` reports), and grouping those blocks by the frames that allocated them says what
the peak is made of: weights, optimizer state, saved activations of which module, temporaries of which op.
Blocks allocated before recording began have no alloc event; they are reported as one "before recording" row
(start recording before the model loads and that row is empty).

Seen on torch 2.11: a run with compiled decoder layers (launchgen's full fine-tuning) fails inside the compiled
backward with `SystemError: ... returned NULL without setting an exception` while the history is recorded; eager
models (LoRA's layers) record fine.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
#: Files whose frames say nothing about *what* a block is for (the allocator's and autograd's own plumbing).
_PLUMBING = ("torch/utils/", "torch/_tensor.py", "torch/autograd/", "torch/overrides.py", "torch/_ops.py",
             "torch/nn/modules/module.py", "torch/_compile.py", "torch/_dynamo/", "contextlib.py",
             "torch/utils/_contextlib.py", "memory_peak.py")
#: Our own code: the first of these frames names the launchgen step that is responsible for the block.
_OURS = ("launchgen/", "/trainers/", "benchmarks/")


@dataclass
class Recording:
    snapshot: dict[str, Any] = field(default_factory=dict)
    allocated_at_start: int = 0


@contextlib.contextmanager
def recording(max_entries: int = 3_000_000) -> Iterator[Recording]:
    import torch

    rec = Recording(allocated_at_start=torch.cuda.memory_allocated())
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield rec
    finally:
        rec.snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)


def _site(frames: list[dict[str, Any]], ours: bool) -> str:
    for f in frames:
        name = str(f.get("filename", ""))
        if any(p in name for p in _PLUMBING):
            continue
        if ours and not any(p in name for p in _OURS):
            continue
        short = "/".join(name.split("/")[-2:])
        return f"{short}:{f.get('line')} {f.get('name')}"
    return "(no frame)" if not ours else "(no launchgen frame)"


def peak_blocks(snapshot: dict[str, Any], device: int = 0) -> tuple[int, dict[int, dict[str, Any]], int]:
    """(peak traced bytes, blocks live at that peak by address, number of events replayed)."""
    traces = snapshot.get("device_traces") or []
    events: list[dict[str, Any]] = traces[device] if device < len(traces) else []
    # the allocated total drops when the block is handed back (free_completed); old builds log only free_requested
    free = "free_completed" if any(e.get("action") == "free_completed" for e in events) else "free_requested"
    live: dict[int, dict[str, Any]] = {}
    total = peak = 0
    at_peak: dict[int, dict[str, Any]] = {}
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = e
            total += int(e["size"])
            if total > peak:
                peak = total
                at_peak = dict(live)
        elif action == free and e["addr"] in live:
            total -= int(live.pop(e["addr"])["size"])
    return peak, at_peak, len(events)


def breakdown(rec: Recording, top: int = 18, device: int = 0) -> str:
    peak, blocks, n = peak_blocks(rec.snapshot, device)
    lines = [f"peak of the traced blocks {peak / GIB:.2f} GiB + {rec.allocated_at_start / GIB:.2f} GiB allocated "
             f"before recording = {(peak + rec.allocated_at_start) / GIB:.2f} GiB ({len(blocks)} blocks, "
             f"{n} events)"]
    for title, ours in (("by the innermost non-plumbing frame", False), ("by the innermost launchgen frame", True)):
        size: dict[str, int] = defaultdict(int)
        count: dict[str, int] = defaultdict(int)
        for b in blocks.values():
            key = _site(b.get("frames") or [], ours)
            size[key] += int(b["size"])
            count[key] += 1
        lines.append(f"-- {title}")
        for key, s in sorted(size.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{s / GIB:8.3f} GiB {count[key]:6d}  {key}")
    return "\n".join(lines)
