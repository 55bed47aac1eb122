"""Tests against a real CPU vLLM server; see conftest.py for when they run."""
