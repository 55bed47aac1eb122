"""A stand-in for `vllm serve` (server.py) and the helpers tests use to run it (harness.py)."""
