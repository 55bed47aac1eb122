"""Trainer kinds (`registry`): the trainer's config resolved from the spec, and what the topology decides (`ownership`)."""
