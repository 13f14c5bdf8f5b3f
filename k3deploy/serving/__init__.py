"""Is a deployment serving: where rank 0 is asked from, what a node's log says of its end, what a router says."""
