"""The job template of `--isolation process`: `python -m lakeshore.pool.forkserver
--control FD [--preload MODULES] [--skip MODULES]`, started once per daemon (and again if it
dies) by lakeshore.pool.template, which asks it for one job process per invocation.

It starts with the scrubbed environment a job gets (no token, no server setting) and
nothing of the daemon's memory: it is a fresh interpreter, told only which modules jobs
may run. Up front it imports what every job process needs (lakeshore.runner and what
that imports) and what the allowed job modules import at their top level (libraries:
never the allowed modules themselves nor anything inside them, whose module-level state
is the user's). An import that fails is left to the job; one that starts a thread (a
process with threads cannot be forked safely) makes the template start over without it.
What a preloaded library sets up at import is copied into every job as it was (Python's
`random` is reseeded at each fork; a library's own generator seeded at import is not).

Each request on the control socket (SOCK_SEQPACKET) is one JSON message, {"env": {...}},
carrying five descriptors: the runner's input and output pipes, the job's stdout and
stderr, and a pipe on which the new job process writes its pid (which the daemon reads
only when the template died before it answered). For each the template
forks one child with clone(CLONE_PARENT): the child's parent is the daemon (the thread
that started the template), exactly as if the daemon had started it itself, so the
daemon reaps it, learns its exit code, kills its process group while it is unreaped,
and the child dies with that thread (PR_SET_PDEATHSIG). The child leaves the template
(new session and process group, the job's environment, stdin from /dev/null, stdout and
stderr to its log pipes, every other descriptor closed) and runs one invocation
(lakeshore.runner.serve --once); then the interpreter exits as a fresh one would
(non-daemon threads joined, atexit handlers run).

The template answers on the control socket: {"ready": pid, "preloaded": [...], "skipped":
{module: why}} once it has started, then {"pid": pid} for each fork (the daemon goes on at
once, without waiting for the child to run), or {"error": "..."} when one fails. It exits
when the control socket closes."""

import ast
import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.machinery
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from lakeshore import runner
from lakeshore.allow import ALWAYS_ALLOWED, in_allowed, parse_modules

FDS = 5  # runner in, runner out, stdout, stderr, pid
MESSAGE_MAX = 1 << 20
# clone(2): the syscall's number and where its child_tid argument goes, by machine.
CLONE = {"x86_64": (56, 3), "aarch64": (220, 4)}
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
PR_SET_PDEATHSIG = 1
TCB_SEARCH = 512  # 32-bit words of the thread control block searched for its tid
# What every job process imports, beyond lakeshore.runner's own imports.
ALWAYS = ("logging", "lakeshore.functions", "lakeshore.sdk_job")


class CannotFork(Exception):
    """This platform's clone(CLONE_PARENT) cannot be used (the daemon then starts a
    fresh interpreter per job, as without a template)."""


def _tid_offset(libc: ctypes.CDLL) -> int:
    """Where glibc keeps a thread's kernel tid in its thread control block: the 32-bit
    word of the block equal to the thread's tid in the main thread and in two others
    (another word may equal one tid by chance, not three). clone writes the child's tid
    there (CLONE_CHILD_SETTID), as fork(3) does, so the C library's view of the child's
    own thread is the child's."""
    self_block = libc.pthread_self
    self_block.restype = ctypes.c_void_p
    self_block.argtypes = []

    def candidates() -> set[int]:
        words = (ctypes.c_int32 * TCB_SEARCH).from_address(self_block())
        tid = threading.get_native_id()
        return {i * 4 for i in range(TCB_SEARCH) if words[i] == tid}

    found = [candidates()]
    for _ in range(2):
        thread = threading.Thread(target=lambda: found.append(candidates()))
        thread.start()
        thread.join()
    common = set.intersection(*found)
    if len(found) != 3 or len(common) != 1:
        raise CannotFork(f"the C library's thread block does not show where the tid is {found}")
    return common.pop()


class Forker:
    """clone(CLONE_PARENT | CLONE_CHILD_SETTID | SIGCHLD) with CPython's own fork hooks
    around it (os.fork's: locks reinitialized, os.register_at_fork callbacks run)."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux") or platform.machine() not in CLONE:
            raise CannotFork(f"no clone(CLONE_PARENT) on {sys.platform} {platform.machine()}")
        self.number, self.child_tid_at = CLONE[platform.machine()]
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.syscall.argtypes = [ctypes.c_long] * 6
        self.tid_at = _tid_offset(libc)
        self.self_block = libc.pthread_self
        self.prctl = ctypes.CDLL(None, use_errno=True).prctl
        self.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self.prctl.restype = ctypes.c_int
        self.api = ctypes.pythonapi

    def fork(self) -> int:
        """0 in the child; the child's pid in the template (the child is the daemon's)."""
        if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
            raise OSError("the job template has threads: it cannot fork safely")
        args = [CLONE_PARENT | CLONE_CHILD_SETTID | int(signal.SIGCHLD), 0, 0, 0, 0]
        args[self.child_tid_at] = self.self_block() + self.tid_at
        self.api.PyOS_BeforeFork()
        pid = self.syscall(self.number, *args)
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
            return 0
        errno = ctypes.get_errno()
        self.api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(errno, f"clone: {os.strerror(errno)}")
        return int(pid)


# ---------------------------------------------------------------------------- preloading


def _source(module: str) -> str | None:
    """The source text of `module`, found without importing it or its packages."""
    path = None
    spec = None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(
            part if spec is None else f"{spec.name}.{part}", path
        )
        if spec is None:
            return None
        path = spec.submodule_search_locations
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def top_level_imports(source: str) -> list[str]:
    """The absolute imports a module's source runs at its top level (also inside a
    top-level try or if), in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    statements = list(tree.body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, (ast.Try, ast.If)):
            nested = [*node.body, *getattr(node, "handlers", []), *node.orelse]
            statements[:0] = [s for h in nested for s in getattr(h, "body", [h])]
    return list(dict.fromkeys(names))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(allowed: tuple[str, ...], skip: set[str]) -> tuple[list[str], dict[str, str]]:
    """Imports ALWAYS and what the allowed modules import (not the allowed modules nor
    what is inside them). Returns what it imported and what it left out, and why. A
    module whose import started a thread: the template starts over without it."""
    wanted = list(ALWAYS)
    for module in allowed:
        if module in ALWAYS_ALLOWED:
            continue
        source = _source(module)
        if source is not None:
            wanted += [m for m in top_level_imports(source) if not in_allowed(m, allowed)]
    loaded, skipped = [], {}
    for module in dict.fromkeys(wanted):
        if module in skip:
            skipped[module] = "its import starts a thread"
            continue
        if module in sys.modules:
            loaded.append(module)
            continue
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - the job meets it, if it imports it
            skipped[module] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if not _settled():
            _start_over(skip | {module})
        loaded.append(module)
    return loaded, skipped


def _settled() -> bool:
    """One thread left (a thread that just ended may linger in /proc a moment)."""
    for _ in range(100):
        if threading.active_count() == 1 and _threads() == 1:
            return True
        time.sleep(0.002)
    return False


def _start_over(skip: set[str]) -> None:
    argv = [a for a in sys.argv[1:]]
    if "--skip" in argv:
        at = argv.index("--skip")
        del argv[at : at + 2]
    os.execv(  # noqa: S606 - this very program again, without the module
        sys.executable,
        [sys.executable, "-m", __spec__.name, *argv, "--skip", ",".join(sorted(skip))],
    )


# ---------------------------------------------------------------------------- serving


def serve(control: socket.socket, forker: Forker, daemon: int) -> Callable[[], None] | None:
    """Forks a job process for each request until the control socket closes. Returns
    None in the template (it exits) and, in each child, the function that runs its job:
    the child leaves this loop and everything the template holds."""
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, MESSAGE_MAX, FDS, socket.MSG_CMSG_CLOEXEC)
        except ConnectionResetError:
            return None
        if not message:
            for fd in fds:
                os.close(fd)
            return None
        try:
            if len(fds) != FDS:
                raise OSError(f"a request with {len(fds)} descriptors, not {FDS}")
            env = json.loads(message)["env"]
            pid = forker.fork()
        except (OSError, ValueError, KeyError) as exc:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                control.send(json.dumps({"error": str(exc)}).encode())
            continue
        if pid == 0:
            return lambda: _child(control, forker, daemon, env, fds)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            control.send(json.dumps({"pid": pid}).encode())


def _child(
    control: socket.socket, forker: Forker, daemon: int, env: dict, fds: list[int]
) -> NoReturn:
    """The job process: dies with the daemon's thread, leaves the template's session,
    says its pid, takes the job's streams and environment, runs one invocation."""
    if forker.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        os._exit(71)  # no parent-death signal: better not to run at all
    if os.getppid() != daemon:
        os._exit(70)  # the daemon died before the prctl took effect
    runner_in, runner_out, out, err, said = fds
    os.setsid()  # a session and process group of its own (see kill_job_group)
    with contextlib.suppress(OSError):  # read only if the template died meanwhile
        os.write(said, f"{os.getpid()}\n".encode())
    os.close(said)
    control.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    low = 0
    for fd in [*sorted({0, 1, 2, runner_in, runner_out}), os.sysconf("SC_OPEN_MAX")]:
        if fd > low:
            os.closerange(low, fd)  # everything else the template held
        low = fd + 1
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():  # the template's, mostly: only what differs is set
        if os.environ.get(name) != value:
            os.environ[name] = value
    sys.argv = [runner.__file__, "--in", str(runner_in), "--out", str(runner_out), "--once"]
    try:
        runner.serve(runner_in, runner_out, once=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: a traceback, code 1
        traceback.print_exc()
        code = 1
    else:
        code = 0
    Leaving.code = code
    sys.exit(code)


class Leaving:
    """A job process's exit code, once its invocation ran (None in the template)."""

    code: int | None = None


def _leave_quickly() -> None:
    """The last exit function (the template registers it before it imports anything
    that registers one): a job process has ended as a fresh interpreter's end looks from
    outside (its non-daemon threads joined, every other exit function run); its streams
    are flushed and it exits without tearing down each module the template imported.
    That teardown writes to every object shared with the template (a copy of each page)
    and took 15 ms a job."""
    if Leaving.code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a job may close or replace its streams
            stream.flush()
    os._exit(Leaving.code)


def main(argv: list[str]) -> None:
    options: dict[str, str | None] = {"--control": None, "--preload": "", "--skip": ""}
    words = iter(argv)
    for word in words:
        if word not in options:
            raise SystemExit(f"lakeshore.pool.forkserver: unknown argument {word!r}")
        options[word] = next(words, "")
    if options["--control"] is None:
        raise SystemExit("usage: python -m lakeshore.pool.forkserver --control FD")
    control = socket.socket(fileno=int(options["--control"]))
    atexit.register(_leave_quickly)  # first registered, so run last
    daemon = os.getppid()
    try:
        forker = Forker()
    except (CannotFork, OSError, AttributeError) as exc:
        control.send(json.dumps({"error": f"cannot fork job processes here: {exc}"}).encode())
        raise SystemExit(3) from None
    allowed = ALWAYS_ALLOWED + parse_modules(options["--preload"] or "")
    loaded, skipped = preload(allowed, set(parse_modules(options["--skip"] or "")))
    if not _settled():
        control.send(json.dumps({"error": "the job template has threads of its own"}).encode())
        raise SystemExit(3)
    gc.freeze()  # what the template holds stays out of every child's collections
    ready = {"ready": os.getpid(), "preloaded": loaded, "skipped": skipped}
    control.send(json.dumps(ready).encode())
    job = serve(control, forker, daemon)
    if job is not None:  # a child: the template's loop is behind it
        job()


if __name__ == "__main__":
    main(sys.argv[1:])
