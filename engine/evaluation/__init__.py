"""Recall@K harness, benchmark loaders, truncation analysis."""
