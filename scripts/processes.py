"""Processes for `make run` (scripts/run.py): a death signal, a subreaper, and
signals that find a process gone."""

import contextlib
import ctypes
import os
import signal

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: neither of them
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)


def die_with_parent() -> None:
    """In a child: get SIGTERM when its parent dies, even by kill -9 (Linux)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def with_suppress(action, *args) -> None:
    with contextlib.suppress(psutil.Error, ProcessLookupError):
        action(*args)


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (each child here leads its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
