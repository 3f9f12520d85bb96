"""`kt bench`: one MoE layer measured against this host's own limits (bandwidth, peak compute)."""

from .runner import BenchConfig, MemoryRefusal, run

__all__ = ["BenchConfig", "MemoryRefusal", "run"]
