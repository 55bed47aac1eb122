"""TRL's own trainers under launchgen: `python -m launchgen.trainers.trl --config run.yaml` runs TRL's trainer class
(GRPOTrainer, RLOOTrainer, ...) with TRL's config class built from the run config, launchgen's data and reward
sections, and launchgen's lifecycle (signal -> checkpoint -> exit 75, resume, metrics.jsonl, completion marker).

This package's `__init__`, `entries`, `config` and `fields` import no torch, transformers or trl: `launchgen check`
reads the entry table and the generated field table (`fields.json`) on a login node.
"""


def main(argv: list[str] | None = None) -> int:
    """`python -m launchgen.trainers.trl` (the entry module the trl.* declarations name)."""
    from launchgen.trainers.trl.run import main as run_main

    return run_main(argv)
