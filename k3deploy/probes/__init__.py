"""Stdlib-only modules shipped by source to `python3` on every node (nothing of k3deploy installed there)."""
