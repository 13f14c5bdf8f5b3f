"""Each started node gets its own directory for the engine's IPC sockets, made at start, removed when its engine
ends and at stop.

vLLM 0.32.0 binds about nine ZMQ sockets per launch as `ipc://$VLLM_RPC_BASE_PATH/<uuid4>` (vllm/utils/
network_utils.py get_open_zmq_ipc_path, called by vllm/v1/engine/utils.py, vllm/v1/utils.py and
vllm/distributed/device_communicators/shm_broadcast.py; the base defaults to tempfile.gettempdir(), /tmp) and
leaves the socket files behind when it is killed: 72 in /tmp after 8 launches. Pointing the base at a per-start directory makes
them removable with the node's processes. Other engines ignore the variable; the empty directory goes too.
"""
from __future__ import annotations

import hashlib
import shlex

IPC_ENV = "VLLM_RPC_BASE_PATH"
# A unix socket path is at most 107 bytes: this prefix + 16 hex + "/" + a 36-character uuid4 is 71.
IPC_PREFIX = "/tmp/k3deploy-ipc-"


def ipc_dir(tag: str) -> str:
    """The IPC directory of one node's start (its process tag), short whatever the deployment's name."""
    return IPC_PREFIX + hashlib.sha256(tag.encode()).hexdigest()[:16]


def with_ipc_dir(command: str, tag: str) -> str:
    """The node's shell text, run with its own IPC directory (a user's engine.env export still wins), which
    this shell removes once the engine has ended, whoever ended it: a crash, a kill of the engine alone, a
    SIGTERM to the group (a scheduler's cancel or time limit, the Ray agent's watchdog) that this shell waits
    through. Only a SIGKILL of this shell too leaves the directory, to `stop` (node_stop)."""
    d = shlex.quote(ipc_dir(tag))
    # The engine runs in a subshell (its `exec` replaces that, not this shell); a trapped signal is acted on
    # only once that foreground subshell has ended, and a trap (not an ignore) is not inherited.
    return (f"mkdir -p -m 700 {d}\nexport {IPC_ENV}={d}\ntrap : TERM INT HUP\n(\n{command}\n)\nrc=$?\n"
            f"rm -rf -- {d}\nexit $rc\n")


def remove_ipc_dir(tag: str) -> str:
    """The command that removes the directory and whatever sockets the engine left in it."""
    return shlex.join(["rm", "-rf", "--", ipc_dir(tag)])
