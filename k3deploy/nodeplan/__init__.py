"""The per-node record (NodeJob) made once by launch's preparation and read by preflight, launch, status, logs and
validate; and which executor target reaches each node."""
