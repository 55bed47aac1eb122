"""Port rules: the valid and ephemeral ranges, and how `job.port_offset: job_id` shifts a port at run time.

The shift is `(job_id % 1000) * 10` (0..9990), so two jobs on one node get ports 10 apart. A port below the
ephemeral range that the shift would carry into it (e.g. the default group_port 29551 + 9990 = 39541) wraps down
by `WRAP` instead, so it stays in `WRAP_LOW`..32767: no shifted port of a safe base ever enters the range
32768-60999, where the kernel hands out the source ports of outgoing connections and a listener can find its port
taken. Distinct offsets still give distinct ports (the offsets differ by less than `WRAP`).

`shift` is the Python rule (checks, tests); `shell_expr` renders the same rule for the job scripts.

This module is also the one owner of each port's default: the spec (`launchgen/input/spec.py`), the trainer config
(`trainers/declarations/config.py`) and the trainer's vLLM client and backend import them (standard library only, so the
trainers can).
"""

from __future__ import annotations

#: `vllm.port`: the server's HTTP API.
SERVER_HTTP_DEFAULT = 8000
#: `train.main_process_port`: the accelerate / torch.distributed rendezvous on trainer node 0.
MAIN_PROCESS_DEFAULT = 29500
#: `vllm.dp_rpc_port`: vLLM's `--data-parallel-rpc-port` when DP spans nodes.
DP_RPC_DEFAULT = 29550
#: `vllm.master_port`: vLLM's `--master-port` (its torch.distributed rendezvous) on the first node of a server
#: replica that spans several nodes; vLLM's own default, 29501, sits one above main_process_port.
MASTER_DEFAULT = 29552
#: `vllm.group_port`: the weight-transfer rendezvous trainer rank 0 hosts. TRL's 51216 lies in the ephemeral
#: range (an outgoing connection can already hold it); this sits beside the other ports, below that range.
GROUP_DEFAULT = 29551

PORT_MIN, PORT_MAX = 1024, 65535
EPHEMERAL_LOW, EPHEMERAL_HIGH = 32768, 60999
#: Largest run-time shift of `job.port_offset: job_id`: (job_id % 1000) * 10.
MAX_OFFSET = 999 * 10
#: Every run-time offset of `job.port_offset: job_id`.
OFFSETS = range(0, MAX_OFFSET + 1, 10)
#: A shifted port that would enter the ephemeral range moves down by this much (> MAX_OFFSET keeps them distinct).
WRAP = 10000
#: The lowest port a wrapped port can land on.
WRAP_LOW = EPHEMERAL_LOW - WRAP


def offset_for(job_id: int) -> int:
    return (job_id % 1000) * 10


def shift(base: int, offset: int) -> int:
    """The port `base` listens on with the run-time `offset` (0..MAX_OFFSET)."""
    port = base + offset
    if base < EPHEMERAL_LOW <= port:
        port -= WRAP
    return port


def shifted_range(base: int) -> tuple[int, int]:
    """The lowest and highest value `base` can take over every offset."""
    values = [shift(base, o) for o in OFFSETS]
    return min(values), max(values)


def in_ephemeral(port: int) -> bool:
    return EPHEMERAL_LOW <= port <= EPHEMERAL_HIGH


def shell_expr(base: int, offset_var: str) -> str:
    """`shift(base, $offset_var)` as a bash arithmetic expansion (base is an int from the plan, never spec text)."""
    b = int(base)
    if b >= EPHEMERAL_LOW or b + MAX_OFFSET < EPHEMERAL_LOW:  # no offset can carry it into the range
        return f"$(({b} + {offset_var}))"
    return f"$(({b} + {offset_var} >= {EPHEMERAL_LOW} ? {b} + {offset_var} - {WRAP} : {b} + {offset_var}))"


def same_job_clash(a: int, b: int) -> int | None:
    """An offset at which two different base ports of one job land on the same port, if any (the wrap can do it)."""
    return next((o for o in OFFSETS if a != b and shift(a, o) == shift(b, o)), None)


def cross_job_clash(a: int, b: int) -> tuple[int, int] | None:
    """Offsets (of a, of b) of two jobs at which port a of one lands on port b of the other, if any."""
    at = {shift(a, o): o for o in OFFSETS}
    return next(((at[p], o) for o in OFFSETS if (p := shift(b, o)) in at and at[p] != o), None)


def replica_port(base: int, replica: int) -> int:
    """The base port of `vllm.replicas` replica `replica` (0 keeps `base`; launchgen.planning.replicas caps the count at 10,
    so a job's replica ports stay inside the 10 ports between two jobs' offsets)."""
    return base + replica


def bindable(port: int, *, reuse_addr: bool) -> bool:
    """Whether a listener could bind `port` on every address of this host now. `reuse_addr`: as the servers that
    will bind it (uvicorn, torch's TCPStore) do, so connections of an earlier owner in TIME_WAIT do not count as in
    use and only a live listener does; without it, those count too (the stricter view of `check --live`)."""
    import socket  # here, not at the top: `check` and `render` import this module and never bind

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True
