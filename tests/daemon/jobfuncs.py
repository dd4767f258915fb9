"""Job functions for the daemon fault tests (tests/daemon/test_daemon_faults.py). A daemon
runs them when its LAKESHORE_ALLOWED_MODULES names tests.daemon.jobfuncs and its
PYTHONPATH holds the repository root.

The ledger is a text file the test reads: one line per event, appended in one write
(O_APPEND), `start <pid> <time> overlap=<pids>`, `end <pid> <time>`, `grandchild <pid>`."""

import os
import signal
import subprocess
import time


def _append(ledger: str, line: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has finished: it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def starts(ledger: str) -> list[dict]:
    """The ledger's `start` lines, oldest first: {"pid", "time", "overlap"}."""
    try:
        with open(ledger) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        word, *rest = line.split()
        if word == "start":
            overlap = [int(p) for p in rest[2].removeprefix("overlap=").split(",") if p]
            out.append({"pid": int(rest[0]), "time": float(rest[1]), "overlap": overlap})
    return out


def ledger_sleep(ledger: str, seconds: float) -> int:
    """Appends `start`, sleeps `seconds` on attempt 1 only (LAKESHORE_ATTEMPT), appends
    `end`. `overlap=` lists earlier starts whose process still runs as this one starts:
    two copies of the same work at once."""
    running = [s["pid"] for s in starts(ledger) if alive(s["pid"])]
    overlap = ",".join(str(pid) for pid in running)
    _append(ledger, f"start {os.getpid()} {time.time():.6f} overlap={overlap}")
    if os.environ.get("LAKESHORE_ATTEMPT") == "1":
        time.sleep(seconds)
    _append(ledger, f"end {os.getpid()} {time.time():.6f}")
    return os.getpid()


def with_grandchild(ledger: str, seconds: float) -> None:
    """Starts `sleep 300` (same process group), records its pid, then sleeps."""
    child = subprocess.Popen(["sleep", "300"])  # noqa: S607 - a test helper
    _append(ledger, f"grandchild {child.pid}")
    time.sleep(seconds)


def environment() -> dict:
    """The job's whole environment."""
    return dict(os.environ)


def ignores_term(ledger: str, seconds: float) -> None:
    """Ignores SIGTERM (and SIGINT), records `start <pid>`, then sleeps."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _append(ledger, f"start {os.getpid()} {time.time():.6f} overlap=")
    time.sleep(seconds)


def says_done(line: str) -> str:
    """Prints `line` as its last words and returns it: a job that finishes its work."""
    print(line, flush=True)
    return line
