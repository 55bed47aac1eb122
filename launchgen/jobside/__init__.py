"""Programs the rendered job runs on its nodes (standard library and the shared layer only)."""
