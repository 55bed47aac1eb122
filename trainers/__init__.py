"""Bundled trainer modules run by launchgen's scripts: `python -m launchgen.trainers.<name> --config run.yaml`.

Importing this package is cheap: torch, transformers and vllm are imported only by the modules that use them.
"""
