"""Pluto's gateway: the process that connects chat platforms to agents."""

__version__ = "0.1.0"
