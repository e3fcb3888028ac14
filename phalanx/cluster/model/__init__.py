"""Throughput models: measured profiles, the perf model, the online fit of a job's speed, CPU
core sharing."""
