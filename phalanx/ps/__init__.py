"""Parameter server: shards, key partitioning, worker client, consistency models."""
