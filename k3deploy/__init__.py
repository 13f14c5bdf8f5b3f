"""k3deploy: plan, render, launch and validate multi-node Kimi K3 deployments."""
__version__ = "0.1.0"
