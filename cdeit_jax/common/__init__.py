"""The platform layer: errors, paths and object stores, logs, compile cache, device memory,
sharding, CPU tuning."""
