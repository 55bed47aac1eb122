"""Checks of what the spec names on disk (`stage="files"`): only `launchgen check` runs them, so `render` works on
a machine without the data. Nothing here imports torch, transformers or datasets; data files are peeked at, never
read whole; relative paths start at the current directory (where the job is submitted from)."""
