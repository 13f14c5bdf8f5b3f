"""SlurmExecutor: one node of a Slurm allocation, reached by job steps (`srun --overlap --jobid J -w NODE`).

Every command is a one-task step on the node, run by the `srun` client here (Slurm's own transport: munge
authentication, no SSH). Process control reuses the POSIX scripts (posix.py), run inside such steps.
Traps of Slurm 22.05, met on the rig:
- srun prints `srun: error: NODE: task 0: Exited with exit code N` on stderr for any non-zero exit: that
  line is Slurm's, not the command's, and is dropped from the result.
- SIGTERM to srun ends the step's processes; SIGKILL to srun leaves them running, so a timeout sends TERM.
- Ending a step kills its processes one by one (proctrack/linuxproc): a shell whose child died first runs
  its next command before its own signal arrives (`sleep 4; touch F`, timed out after 1 s, touched F at
  once, in about one run in four beside a busy loop). A timed-out command's process group is therefore
  killed with one signal first (`kill_tagged`), and only then is srun told to end the step.
- A process a step detaches (setsid) outlives the step under proctrack/linuxproc but not under
  proctrack/cgroup, so `start` keeps its step open until the process ends (the step's shell waits for it).
"""
from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)

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
    `kill_tagged` has marked it. `timeout` leads the command's own process group, which `kill_tagged` kills
    with one signal."""
    mark = shlex.quote(f"{STEP_MARKS}/{step_tag}")
    return (f"[ ! -e {mark} ] || exit 124; K3_STEP={shlex.quote(step_tag)} "
            f"exec timeout -s KILL {math.ceil(timeout_s) + 1} sh -c {shlex.quote(command)}")


KILL_SCANS, KILL_SCAN_GAP_S = 10, 0.2  # at most this many looks for the timed-out command's processes, this far apart


def kill_tagged(step_tag: str) -> str:
    """A shell script that marks the command as timed out (a late start then exits at once) and SIGKILLs every
    process whose environment holds `K3_STEP=step_tag`, printing `killed PID` for each; marks older than 10
    minutes are removed. A process group led by a tagged process (the `timeout` of `bounded` leads the
    command's) is killed with one group-wide signal, which no member outlives: killed one by one, a shell
    whose child died first runs its next command before its own signal arrives (`sleep 4; touch F` touched F
    on the rig, as Slurm's own step kill under proctrack/linuxproc does it). It looks again KILL_SCAN_GAP_S
    later (a start under way is caught by the next look), until a look finds nothing, KILL_SCANS looks at most.
    One `grep` reads every process's environment per look."""
    tag = shlex.quote(f"K3_STEP={step_tag}")
    scan = (f"found=; for e in $(grep -lzxF {tag} /proc/[0-9]*/environ 2>/dev/null); do "
            'p=${e#/proc/}; p=${p%/environ}; found=1; '
            "g=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f3); "
            f'if [ -n "$g" ] && grep -qzxF {tag} /proc/"$g"/environ 2>/dev/null; then kill -s KILL -- -"$g" 2>/dev/null; fi; '
            'kill -9 "$p" 2>/dev/null; echo "killed $p"; done')
    return (f"mkdir -p {STEP_MARKS} && : > {shlex.quote(STEP_MARKS + '/' + step_tag)}; "
            f'i=0; while [ $i -lt {KILL_SCANS} ]; do {scan}; i=$((i+1)); [ -n "$found" ] || [ $i -lt 2 ] || break; '
            f"sleep {KILL_SCAN_GAP_S}; done; find {STEP_MARKS} -type f -mmin +10 -delete 2>/dev/null; true")


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
            # The command's processes go first, all at once (kill_tagged); only then does srun end the step,
            # when nothing is left to kill one by one (srun's own kill lets a shell run its next command).
            failed = self._finish_kill(self._start_kill(step_tag))
            _end_step(proc)
            raise CommandTimeout(f"command timed out after {timeout_s:g} s" + (
                f"; ending it on the node failed ({failed}): it may still be running there" if failed else ""),
                host=self.host) from None
        finally:
            _end_step(proc)
        text = err.decode(errors="replace")
        return CommandResult(exit_code=code, stdout=out.decode(errors="replace"), stderr=_SRUN_EXIT.sub("", text))

    def _start_kill(self, step_tag: str) -> subprocess.Popen[bytes] | None:
        """After a timeout: a step that ends whatever the timed-out command left running (None: srun would
        not start)."""
        try:
            return self._popen(self._argv(kill_tagged(step_tag)), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except ExecError:
            return None

    def _finish_kill(self, killer: subprocess.Popen[bytes] | None) -> str:
        """The killer's step waited for: '' when it ran, else why not (srun's words)."""
        if killer is None:
            return "srun would not start"
        try:
            out, err = killer.communicate(timeout=STEP_SETUP_S)
        except subprocess.TimeoutExpired:
            _end_step(killer)
            return f"its step did not end in {STEP_SETUP_S:g} s"
        killed = sorted({line.split()[1] for line in out.decode(errors="replace").splitlines()
                         if line.startswith("killed ")}, key=int)
        log.debug("%s: after a timeout, killed %s", self.host, ", ".join(killed) or "nothing (already ended)")
        if killer.returncode != 0:
            return _SRUN_EXIT.sub("", err.decode(errors="replace")).strip()[-300:] or f"exit {killer.returncode}"
        return ""

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
