"""A real multi-host rig on one machine: network namespaces, one sshd per host, for integration tests."""

from .hosts import MAX_HOSTS, HostRig, RigHost
from .netns import MGMT_IFACE, PRIV_IFACE, RigError
from .procs import pid_alive
from .registry import cleanup_stale

__all__ = [
    "MAX_HOSTS",
    "MGMT_IFACE",
    "PRIV_IFACE",
    "HostRig",
    "RigError",
    "RigHost",
    "cleanup_stale",
    "pid_alive",
]
