"""Job functions for the pool tests (tests/e2e/test_daemon_pool.py, tests/lakeshore/). A
daemon runs them when its LAKESHORE_ALLOWED_MODULES names tests.e2e.poolfuncs and its
PYTHONPATH holds the repository root. Each returns the pid of the process it ran in."""

import os
import subprocess
import time

STATE = None  # module-level state: what a warm pool process keeps between invocations


def set_global(value):
    global STATE
    STATE = value
    return {"pid": os.getpid(), "value": STATE}


def get_global():
    return {"pid": os.getpid(), "value": STATE}


def fail(message: str = "failed on purpose"):
    raise RuntimeError(message)


def pid() -> int:
    return os.getpid()


def record(ledger: str, n: int) -> int:
    """Appends `n pid` to the ledger (one write, O_APPEND): one line per run."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{n} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return os.getpid()


def write_pid_then_sleep(path: str, seconds: float) -> int:
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


def leave_child(path: str) -> int:
    """Starts `sleep 300` and returns without waiting for it; writes the child's pid."""
    child = subprocess.Popen(["sleep", "300"])  # noqa: S607 - a test helper
    with open(path, "w") as handle:
        handle.write(str(child.pid))
    return os.getpid()


def leave_orphan(path: str) -> int:
    """A shell starts `sleep 300` in the background and exits: the sleep is orphaned
    (a pool process, as subreaper, becomes its parent). Writes the sleep's pid."""
    subprocess.run(["sh", "-c", f"sleep 300 & echo $! > {path}"], check=True)  # noqa: S607
    return os.getpid()


def leave_thread(seconds: float) -> int:
    import threading

    threading.Thread(target=time.sleep, args=(seconds,)).start()
    return os.getpid()


def change_environment() -> dict:
    """Sets a variable and moves to another directory: a pool process puts both back."""
    os.environ["LEFT_BY_A_JOB"] = "yes"
    os.chdir("/")
    return {"pid": os.getpid()}


def environment() -> dict:
    return {"pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ)}


def allocate(megabytes: int) -> int:
    """Keeps `megabytes` MB alive in the process (module-level), touched."""
    global STATE
    STATE = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(STATE), 4096):
        STATE[i] = 1
    return os.getpid()


def exit_now(code: int = 3) -> None:
    os._exit(code)


def say(text: str) -> int:
    print(text)  # block-buffered when stdout is not a terminal: flushed by the runner
    return os.getpid()


def span(ledger: str, n: int, seconds: float) -> int:
    """Sleeps `seconds`, then appends `n start end` (wall-clock seconds) to the ledger in
    one write: which runs overlapped can be read back."""
    start = time.time()
    time.sleep(seconds)
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{n} {start!r} {time.time()!r}\n".encode())
    finally:
        os.close(fd)
    return os.getpid()
