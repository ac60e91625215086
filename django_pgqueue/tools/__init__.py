"""Tools beside the queue: the benchmark behind ``queuebench`` and the embedded PostgreSQL."""
