"""Benchmarks that back the engine's tuned constants; run with `python -m engine.bench.<name>`."""
