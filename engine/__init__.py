"""Longlens engine: everything that computes or stores. Never imports Qt."""

__version__ = "0.1.0"
