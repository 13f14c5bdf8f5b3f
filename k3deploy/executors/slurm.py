"""SlurmExecutor: one node of a Slurm allocation, reached by job steps (`srun --overlap --jobid J -w NODE`).

Every command is a one-task step on the node, run by the `srun` client here (Slurm's own transport: munge
authentication, no SSH). Process control reuses the POSIX scripts (posix.py), run inside such steps.
Traps of Slurm 22.05, met on the rig:
- srun prints `srun: error: NODE: task 0: Exited with exit code N` on stderr for any non-zero exit: that
  line is Slurm's, not the command's, and is dropped from the result.
- SIGTERM to srun ends the step's processes; SIGKILL to srun leaves them running, so a timeout sends TERM.
- A process a step detaches (setsid) outlives the step under proctrack/linuxproc but not under
  proctrack/cgroup, so `start` keeps its step open until the process ends (the step's shell waits for it).
"""
from __future__ import annotations

import math
import os
import re
import select
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import CommandResult, Forward, LineSink, ProcessHandle, sh
from k3deploy.executors.local import process_lines
from k3deploy.executors.posix import LineSplitter, ShellExecutor, check_tag, start_script, started_handle
from k3deploy.executors.target import Capabilities, SlurmTarget

# How long srun may take to set up a step before a command starts (the controller is busy, a node is slow).
STEP_SETUP_S = 30.0
_SRUN_EXIT = re.compile(r"^srun: error: \S+: task \d+: (?:Exited with exit code \d+|Killed|Terminated)(?:\n|$)",
                        re.MULTILINE)


def step_argv(job_id: int, node: str, command: str, *, extra: Sequence[str] = ()) -> list[str]:
    """`srun` running a shell string as one task on `node` of job `job_id`, beside the job's other steps."""
    return ["srun", "--overlap", f"--jobid={int(job_id)}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
            "--quiet", *extra, "sh", "-c", command]


STEP_MARKS = "/tmp/k3deploy-steps"  # on each node: one empty file per timed-out command, removed after 10 min


def bounded(command: str, timeout_s: float, step_tag: str) -> str:
    """The command under coreutils `timeout` on the node, so the step cannot outlive the caller's deadline,
    with `K3_STEP=step_tag` in its environment, which `kill_tagged` finds it by; it does not start at all once
    `kill_tagged` has marked it. On a loaded rig the SIGTERM to srun at the deadline failed to end the
    command in three clean-clone runs (`sleep 4; touch F` under a 1 s timeout touched F), under `timeout`
    too: most likely a step whose task started late and whose `timeout` was then killed by the step's end,
    leaving its children (no longer in the step's tree, but still carrying the environment)."""
    mark = shlex.quote(f"{STEP_MARKS}/{step_tag}")
    return (f"[ ! -e {mark} ] || exit 124; K3_STEP={shlex.quote(step_tag)} "
            f"exec timeout -s KILL {math.ceil(timeout_s) + 1} sh -c {shlex.quote(command)}")


def kill_tagged(step_tag: str) -> str:
    """A shell script that marks the command as timed out (a late start then exits at once) and SIGKILLs every
    process whose environment holds `K3_STEP=step_tag`, twice 2 s apart (a start under way at the first scan
    is caught by the second); marks older than 10 minutes are removed."""
    scan = ("for e in /proc/[0-9]*/environ; do "
            f"if tr '\\0' '\\n' 2>/dev/null < \"$e\" | grep -qxF {shlex.quote('K3_STEP=' + step_tag)}; then "
            'p=${e#/proc/}; kill -9 "${p%/environ}" 2>/dev/null; fi; done')
    return (f"mkdir -p {STEP_MARKS} && : > {shlex.quote(STEP_MARKS + '/' + step_tag)}; {scan}; sleep 2; {scan}; "
            f"find {STEP_MARKS} -type f -mmin +10 -delete 2>/dev/null; true")


class SlurmExecutor(ShellExecutor):
    """Runs commands on one node of an allocation as job steps, through the srun client on this machine."""

    capabilities: Capabilities = SlurmTarget.capabilities

    def __init__(self, target: SlurmTarget) -> None:
        self.host = target.host
        self.target = target

    @property
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.target.slurm_conf:
            env["SLURM_CONF"] = self.target.slurm_conf
        return env

    def _argv(self, command: str, extra: Sequence[str] = ()) -> list[str]:
        if self.target.job_id is None:
            raise ExecError("no Slurm allocation to run in (the target has no job id)", host=self.host,
                            hint="run it through `k3deploy launch` with `launch.executor: slurm`, which submits the job and "
                            "records its id, or submit the exported job (`k3deploy render TOPOLOGY --format slurm`)")
        return step_argv(self.target.job_id, self.host, command, extra=extra)

    def _popen(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(argv, env=self._env, start_new_session=True, **kw)  # type: ignore[call-overload]
        except OSError as exc:
            raise ExecError(f"cannot run srun here: {exc}", host=self.host) from exc

    def connect(self) -> None:
        """A trivial step: the allocation exists, holds this node, and the node runs steps."""
        res = self._run("true", STEP_SETUP_S, None)
        if not res.ok:
            raise ExecError(f"job {self.target.job_id} cannot run a step on {self.host}: "
                            f"{res.stderr.strip()[-400:]}", host=self.host)

    def _run(self, command: str, timeout_s: float, on_line: LineSink | None) -> CommandResult:
        """One step; past `timeout_s` srun gets SIGTERM, which ends the step's processes on the node."""
        step_tag = uuid.uuid4().hex
        proc = self._popen(self._argv(bounded(command, timeout_s, step_tag)), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        lines = LineSplitter(on_line)
        deadline = time.monotonic() + timeout_s
        streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        try:
            while streams:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(command, timeout_s)
                ready, _, _ = select.select(list(streams), [], [], min(left, 0.5))
                for fd in ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        del streams[fd]
                        continue
                    streams[fd].extend(chunk)
                    if streams[fd] is out:
                        lines.feed(chunk)
            lines.flush()
            code = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _end_step(proc)
            self._kill_tagged(step_tag)
            raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host) from None
        finally:
            _end_step(proc)
        text = err.decode(errors="replace")
        return CommandResult(exit_code=code, stdout=out.decode(errors="replace"), stderr=_SRUN_EXIT.sub("", text))

    def _kill_tagged(self, step_tag: str) -> None:
        """After a timeout: a step that ends whatever the timed-out command left running (best effort)."""
        proc = self._popen(self._argv(kill_tagged(step_tag)), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(STEP_SETUP_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _end_step(proc)

    def _stream(self, command: str, stop: threading.Event | None) -> Iterator[str]:
        proc = self._popen(self._argv(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
        return process_lines(proc, stop, _end_step)

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        """A step that starts `command` detached, prints its PID, and lasts as long as the process does."""
        tag = check_tag(tag or "k3deploy")
        script = start_script(command, log_path, workdir, tag) + 'exec 1>&- 2>&-\nwait "$p"\n'
        with tempfile.TemporaryDirectory(prefix="k3slurm-") as tmp:
            said = os.path.join(tmp, "started")
            # The srun client outlives this call (and k3deploy): a shell here backgrounds it and exits, so
            # it is no child of ours; its output is the start script's `PID TICKS` line and exit status.
            inner = shlex.join(self._argv(sh(script))) + f" > {shlex.quote(said)} 2>&1 < /dev/null; " \
                f"echo \"rc $?\" >> {shlex.quote(said)}"
            launcher = self._popen(["/bin/sh", "-c", f"({inner}) & "], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            launcher.wait(10)
            deadline = time.monotonic() + STEP_SETUP_S + self.control_timeout_s
            text = ""
            for _ in range(10**6):
                text = _read(said)
                if "\n" in text and (text.split()[0].isdigit() or text.startswith("rc ")) or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        first = text.splitlines()[0] if text.strip() else ""
        if first.split() and first.split()[0].isdigit():
            res = CommandResult(exit_code=0, stdout=first, stderr="")
        else:
            rc = re.search(r"^rc (\d+)$", text, re.MULTILINE)
            res = CommandResult(exit_code=int(rc.group(1)) if rc else 1, stdout="",
                                stderr=_SRUN_EXIT.sub("", text) or "no answer from srun in time")
        return started_handle(self.host, res, log_path, workdir, tag)

    def put(self, local_path: str, remote_path: str) -> None:
        """The file as the step's stdin, written on the node."""
        self._copy(f"cat > {shlex.quote(remote_path)}", local_path, "rb", f"put {local_path} -> {remote_path}")

    def get(self, remote_path: str, local_path: str) -> None:
        """The node's `cat` of the file, as the step's stdout."""
        self._copy(f"cat {shlex.quote(remote_path)}", local_path, "wb", f"get {remote_path} -> {local_path}")

    def _copy(self, command: str, local_path: str, mode: str, what: str) -> None:
        try:
            fh = open(local_path, mode)  # noqa: SIM115 (closed below, after the step)
        except OSError as exc:
            raise ExecError(f"{what}: {exc}", host=self.host) from exc
        with fh:
            reading = mode == "rb"
            proc = self._popen(self._argv(command), stdin=fh if reading else subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL if reading else fh, stderr=subprocess.PIPE)
            try:
                _, err = proc.communicate(timeout=STEP_SETUP_S + 600)
            except subprocess.TimeoutExpired:
                _end_step(proc)
                raise ExecError(f"{what}: timed out", host=self.host) from None
        if proc.returncode != 0:
            raise ExecError(f"{what}: {_SRUN_EXIT.sub('', err.decode(errors='replace')).strip()[-400:]}",
                            host=self.host)

    def forward(self, remote_host: str, remote_port: int) -> Forward | None:
        """Slurm carries no TCP connections: HTTP checks run on the node itself."""
        return None

    def close(self) -> None:
        """Nothing is held open between steps."""


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _end_step(proc: subprocess.Popen[bytes]) -> None:
    """srun ends the step on SIGTERM (not on SIGKILL, which orphans it); SIGKILL only if it hangs."""
    if proc.poll() is None:
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
