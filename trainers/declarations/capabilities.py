"""What each generation backend can do, by `generation.backend` name: the torch-free half of the backend registry.

`backends.BACKENDS` pairs each of these with its factory; the trainer config (`config.staleness_refusals`) and
`launchgen check` read the capabilities here without importing a backend. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Capabilities:
    #: Generates with the trainer's own (live) weights: no copy to update, no sampler/trainer mismatch to correct.
    shares_policy_weights: bool
    #: Returns the sampled tokens' log-probs (`GenerationOutput.logprobs`), as importance sampling needs.
    returns_logprobs: bool
    #: Needs the full weights after every optimizer step (and after a resume).
    needs_weight_sync: bool
    #: Can generate on a thread while the trainer trains (`generation.max_staleness`): a separate engine on its
    #: own devices, with rank 0's requests free of collectives (`request_all` / `share`, see `async_rollout`).
    generates_ahead: bool = False


_SEPARATE_ENGINE = Capabilities(shares_policy_weights=False, returns_logprobs=True, needs_weight_sync=True)

#: Every backend's capabilities by name (the config's `Backend` literal names the same backends).
CAPABILITIES: dict[str, Capabilities] = {
    "hf": Capabilities(shares_policy_weights=True, returns_logprobs=True, needs_weight_sync=False),
    "vllm_server": replace(_SEPARATE_ENGINE, generates_ahead=True),
    # The colocated engine shares the trainer's GPUs and process, so it cannot generate while the trainer trains.
    "vllm_colocate": _SEPARATE_ENGINE,
}
