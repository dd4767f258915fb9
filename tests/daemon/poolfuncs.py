"""Job functions for the pool tests (tests/daemon/test_daemon_pool.py, test_pool.py). A
daemon runs them when its LAKESHORE_ALLOWED_MODULES names tests.daemon.poolfuncs and its
PYTHONPATH holds the repository root. Each returns the pid of the process it ran in."""

import atexit
import logging
import os
import subprocess
import sys
import threading
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
    print(text)  # the runner line-buffers stdout: the line reaches the log at once
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


def chatter(lines: int, tag: str = "") -> int:
    """`lines` lines to stdout and as many to stderr, interleaved, each numbered."""
    for i in range(lines):
        print(f"{tag}out {i}")
        print(f"{tag}err {i}", file=sys.stderr)
    return os.getpid()


def crash(message: str = "crashed on purpose") -> None:
    print("about to crash")
    raise RuntimeError(message)


def print_then_die(path: str) -> None:
    """Prints, writes its pid to `path`, then waits to be killed (kill -9 from outside)."""
    print("before the kill", flush=True)
    print("an unended line", end="", flush=True)
    with open(path, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(60)


def log_records() -> int:
    logging.getLogger("trainer").info("epoch 1 loss 0.5")
    logging.getLogger("trainer").debug("not shown: below INFO")
    return os.getpid()


def no_newline(text: str) -> int:
    sys.stdout.write(text)
    return os.getpid()


def flood(megabytes: int, line_bytes: int = 8192) -> int:
    """`megabytes` MiB to stdout, in lines of `line_bytes` bytes, numbered."""
    line = "z" * (line_bytes - 12)
    for i in range(megabytes * 1024 * 1024 // line_bytes):
        sys.stdout.write(f"{i:010d} {line}\n")
    return os.getpid()


def ticker(lines: int, every: float) -> int:
    """A line every `every` seconds, `lines` of them: a job a reader watches live."""
    for i in range(lines):
        print(f"tick {i}")
        time.sleep(every)
    return os.getpid()


def leave_state(value: str) -> dict:
    """Leaves state behind three ways: this module's global, an environment variable,
    and an attribute of a module the job template preloads (subprocess, imported at the
    top of this module)."""
    global STATE
    STATE = value
    os.environ["LEFT_BY_A_JOB"] = value
    subprocess.LEFT_BY_A_JOB = value
    return seen_state()


def seen_state() -> dict:
    """What this process sees of the state leave_state leaves."""
    return {
        "pid": os.getpid(),
        "global": STATE,
        "env": os.environ.get("LEFT_BY_A_JOB"),
        "module": getattr(subprocess, "LEFT_BY_A_JOB", None),
    }


def whoami() -> dict:
    """This process's parent, session, group, open descriptors and arguments."""
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "argv": sys.argv,
        "env": dict(os.environ),
        "main": getattr(sys.modules["__main__"], "__spec__", None) is not None,
    }


def read_environ(pid: int) -> list[str]:
    """Another process's environment (its NAME=value entries), as a job could read it."""
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return [entry.decode(errors="replace") for entry in handle.read().split(b"\0") if entry]


def at_exit_writes(path: str, text: str) -> int:
    """Registers an exit function that writes `text` to `path` as the process ends."""

    def write() -> None:
        with open(path, "w") as handle:
            handle.write(text)

    atexit.register(write)
    return os.getpid()
