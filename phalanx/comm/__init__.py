"""Transports, allreduce algorithms, bucketing, byte counters (import the submodules)."""
