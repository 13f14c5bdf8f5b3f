"""Executors: the only code that touches hosts (local subprocesses, SSH via paramiko, a Ray cluster).

`open_executor(target)` picks the implementation; paramiko is imported only for SSH targets, ray only
for Ray targets.
"""
from k3deploy.executors.base import CommandResult, Executor, ProcessHandle
from k3deploy.executors.fanout import FanOut, Outcome
from k3deploy.executors.target import ExecOverrides, ExecTarget, open_executor, targets_for

__all__ = [
    "CommandResult",
    "ExecOverrides",
    "ExecTarget",
    "Executor",
    "FanOut",
    "Outcome",
    "ProcessHandle",
    "open_executor",
    "targets_for",
]
