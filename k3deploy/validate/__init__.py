"""`k3deploy validate`: the staged checklist (shards, kernels, topology, short, long, prefix-cache, effort)."""
