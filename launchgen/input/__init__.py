"""Reading what the user wrote: the spec's YAML, its models, the files it names, hints."""
