"""The records of deployments and services: what launch writes and status, logs, stop, rollout and validate read."""
