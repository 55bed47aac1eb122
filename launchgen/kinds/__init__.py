"""Trainer kinds: the trainer's config resolved from the spec, and what the topology owns."""
