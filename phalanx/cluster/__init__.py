"""The scheduler: a cluster of GPUs, its policies, and the engines that run them (simulated or
live). See docs/cluster.md."""
