"""Checkpoint manifests: made from a directory or the hub, checked on every node by `validate`."""
