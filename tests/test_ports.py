"""launchgen.shared.ports (issue 17): `job.port_offset: job_id` never carries a port into the ephemeral range, the job
scripts compute exactly what the checks assume, and ports the wrap could make equal are refused."""

from __future__ import annotations

import subprocess

import pytest

from launchgen.checks import run_checks
from launchgen.input.loader import load_spec_text
from launchgen.shared import ports

BASES = [1024, 8000, 22767, 22768, 29500, 29550, 29551, 32000, 32767, 61000, 65535 - ports.MAX_OFFSET]


@pytest.mark.parametrize("base", [b for b in BASES if b < ports.EPHEMERAL_LOW])
def test_no_offset_carries_a_safe_port_into_the_ephemeral_range(base: int) -> None:
    values = [ports.shift(base, o) for o in ports.OFFSETS]
    assert not [v for v in values if ports.in_ephemeral(v)]
    assert len(set(values)) == len(values), "two jobs' offsets gave one port"
    assert min(values) >= ports.PORT_MIN
    assert ports.shifted_range(base) == (min(values), max(values))


def test_the_default_group_port_at_a_job_id_that_pushed_it_into_the_range() -> None:
    job_id = 4322  # (4322 % 1000) * 10 = 3220: 29551 + 3220 = 32771 with the old rule
    assert ports.in_ephemeral(29551 + ports.offset_for(job_id))
    assert ports.shift(29551, ports.offset_for(job_id)) == 22771


def test_the_script_computes_the_same_ports() -> None:
    exprs = [(b, o, ports.shell_expr(b, "OFF")) for b in BASES for o in (0, 10, 3220, 7000, ports.MAX_OFFSET)]
    script = "".join(f"OFF={o}; echo {e}\n" for _, o, e in exprs)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in out] == [ports.shift(b, o) for b, o, _ in exprs]


SPEC = """
job: {{name: p, output_dir: runs/%j, port_offset: job_id}}
slurm: {{gpus_per_node: 8, exclusive: false}}
model: {{name_or_path: m}}
vllm: {{mode: server, gpus: [0, 1, 2, 3], tensor_parallel_size: 4, port: {port}, group_port: {group}}}
train: {{args: {{data: {{path: d.jsonl}}}}}}
"""


def _codes(port: int, group: int) -> list[tuple[str, str]]:
    _plan, issues = run_checks(load_spec_text(SPEC.format(port=port, group=group), "p.yaml"))
    return [(i.code, i.path) for i in issues if i.code.startswith("LG4")]


def test_defaults_pass_and_ports_the_wrap_makes_equal_are_refused() -> None:
    assert _codes(8000, 29551) == []
    # 22005 and 32005: at offset 1000 both become 23005 (32005 + 1000 wraps down by 10000)
    assert ("LG402", "vllm.group_port") in _codes(22005, 32005)


def test_each_port_has_one_default_on_both_sides() -> None:
    # the spec, the trainer config and the trainer's backend and client all take launchgen.shared.ports' defaults: a trainer
    # run with the config launchgen writes, or by hand without one, binds the same rendezvous port
    import inspect

    from launchgen.trainers.declarations.config import VLLMServerSection
    from launchgen.trainers.generation.vllm_client import VLLMClient
    from launchgen.trainers.generation.vllm_server import VLLMServerBackend

    from launchgen.input.spec import TrainSpec, VLLMSpec

    def default(fn: object, name: str) -> object:
        return inspect.signature(fn).parameters[name].default  # type: ignore[arg-type]

    fields = VLLMSpec.model_fields
    assert fields["group_port"].default == VLLMServerSection().group_port == ports.GROUP_DEFAULT
    assert default(VLLMServerBackend.__init__, "group_port") == ports.GROUP_DEFAULT
    assert fields["port"].default == VLLMServerSection().port == ports.SERVER_HTTP_DEFAULT
    assert default(VLLMClient.__init__, "port") == ports.SERVER_HTTP_DEFAULT
    assert fields["dp_rpc_port"].default == ports.DP_RPC_DEFAULT
    assert TrainSpec.model_fields["main_process_port"].default == ports.MAIN_PROCESS_DEFAULT
