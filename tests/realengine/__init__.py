"""The real-engine tier's helpers: tiny real checkpoints, the real vLLM's venv, starting and stopping it."""
