"""Executors: the only code that touches hosts (local subprocesses, SSH via paramiko, a Ray cluster).

`NodeFleet` is every node of a deployment as one object; `open_executor(target)` picks the implementation; paramiko is imported only for SSH targets, ray only
for Ray targets.
"""
from k3deploy.executors.base import CommandResult, Executor, ProcessHandle
from k3deploy.executors.factory import open_executor
from k3deploy.executors.fleet import NodeFleet, NodeOutcome
from k3deploy.executors.target import Capabilities, ExecTarget, LocalTarget, RayTarget, SshTarget

__all__ = ["Capabilities", "CommandResult", "ExecTarget", "Executor", "LocalTarget", "NodeFleet", "NodeOutcome",
           "ProcessHandle", "RayTarget", "SshTarget", "open_executor"]
