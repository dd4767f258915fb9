"""Starting a job process that dies with the daemon and leads a process group of its
own, killing that whole group, and reading a process's resident memory."""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Protocol

PR_SET_PDEATHSIG = 1


class JobHandle(Protocol):
    """A started job process as the daemon holds it: a subprocess.Popen, or a child the
    job template forked (lakeshore.pool.template.Forked)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def wait(self) -> int: ...

    def poll(self) -> int | None: ...


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, bound once here (before any thread starts): the child calls it
    between fork and exec, where loading a library could deadlock."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()
_SIGKILL = int(signal.SIGKILL)
# Signals a job process gets from outside when its whole unit is stopped (the daemon
# itself never sends SIGTERM or SIGINT to a job; a SIGKILL of its own marks it killed).
STOPPED_FROM_OUTSIDE = {int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGKILL)}


def _die_with(parent: int) -> Callable[[], None]:
    """The job's preexec function: SIGKILL when the forking thread dies; and if the
    parent already died before the prctl took effect, exit at once. Runs in the forked
    child of a threaded process, so it does only async-signal-safe-ish work: a bound
    ctypes call, getppid, _exit."""

    def preexec() -> None:
        if _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
            os._exit(71)  # no parent-death signal: better not to run at all
        if os.getppid() != parent:
            os._exit(70)  # the daemon died between fork and prctl

    return preexec


def start_job_process(
    command: list[str],
    env: dict,
    *,
    stdin: int | None = subprocess.PIPE,
    stdout: int | None = None,
    stderr: int | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """A job process that dies with the calling thread (and so with the daemon) and
    leads a process group of its own (see kill_job_group)."""
    return subprocess.Popen(  # noqa: S603 - our own runner, no shell
        command,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
        preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - see _die_with
    )


def kill_job_group(process: JobHandle) -> None:
    """SIGKILL the job's whole process group (its session's: pgid == the job's pid), so
    the processes the job started die with it. The number stays the group's while any
    member or the unreaped leader exists; once the group is empty the call finds
    nothing (ESRCH), short of a full wrap of the pid space in between."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        # A job process forked from the template (lakeshore.pool.template) that has not
        # yet made its own session: it has started nothing, so it alone is killed. Not
        # once it is reaped (returncode set): its number may be another's then.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)
    except PermissionError:
        pass


def resident_mb(pid: int) -> float | None:
    """VmRSS of `pid` in MB, from /proc/PID/status (None: unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None
