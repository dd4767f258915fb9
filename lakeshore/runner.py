"""Runs invocations in a job process: `python -m lakeshore.runner --in FD --out FD [--once]`.

The daemon (lakeshore.pool) talks to it over a pipe pair of its own, one JSON message a
line, never over stdin/stdout. The job's stdout and stderr are pipes the daemon reads
into the invocation's log (lakeshore.joblog): stdout is line-buffered here, so a line
reaches the log when it is printed, and Python `logging` records at INFO and above
that the job does not route elsewhere go to stderr ("LEVEL logger: message"): set up
once the job's module imported logging (this process does not import it for the
jobs that never log: a few milliseconds of every process-isolated job). Both are
flushed before each outcome is written, so an outcome never overtakes its output; a
failure's error (a traceback, a refusal) is written to stderr too.

- in (FD): {"id", "attempt", "function", "args", "kwargs", "allowed_modules"}, and for
  the Python SDK's invocations "wire": "envelope", "args_blob" (base64) and
  "allow_pickled" (lakeshore.sdk_job runs them)
- out (FD): the outcome, as `run` makes it, with the invocation's "id":
  {"id", "ok": true, "result": …} or {"id", "ok": false, "error": "<traceback>"} (an SDK
  invocation: "result_blob" instead of "result", and "final" on a refusal), and
  "leftovers" (a list of reasons) when the invocation left processes or threads running.

With `--once` (isolation "process") it runs one invocation and exits. Without it
(isolation "pool") it runs invocations one after another until its input closes;
between them it puts back its environment and working directory, kills the processes
the invocation left behind (it is their subreaper, so orphaned grandchildren are its
children too) and says so in "leftovers", for the daemon to replace it.

While an invocation runs, LAKESHORE_INVOCATION_ID and LAKESHORE_ATTEMPT are set in
os.environ (and removed after). The daemon decides what may run: `allowed_modules`
comes from the daemon host's LAKESHORE_ALLOWED_MODULES, read by the daemon and sent
with each invocation, and is checked on what the function resolves to (lakeshore.allow).
The runner never reads it from its own environment, which the daemon scrubs (see
lakeshore.worker.environment)."""

import contextlib
import faulthandler
import importlib
import io
import json
import os
import signal
import sys
import traceback
from typing import Any

from lakeshore.allow import ALWAYS_ALLOWED, name_refusal, target_refusal

PR_SET_CHILD_SUBREAPER = 36


def allowed_modules(payload: dict) -> tuple[str, ...]:
    extra = payload.get("allowed_modules") or ()
    return ALWAYS_ALLOWED + tuple(str(m) for m in extra if str(m).strip())


def run(payload: dict) -> dict:
    """One invocation's outcome. What it names is checked twice (lakeshore.allow):
    its module and name before the import, what they resolve to before the call."""
    function = str(payload["function"])
    allowed = allowed_modules(payload)
    _capture_logging()  # the daemon's own modules may have imported it already
    if payload.get("wire") == "envelope":  # the Python SDK's: its own exec contract
        # Here, not at the top: msgpack and the SDK's loader would cost every JSON job's
        # process their import time.
        from lakeshore import sdk_job  # noqa: PLC0415

        return sdk_job.run_envelope(payload, allowed=allowed, timeout=None)
    module_name, _, attr = function.rpartition(".")
    why = name_refusal(module_name, attr, allowed)
    if why:
        return {"ok": False, "error": why}
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as exc:
        why = _dotted(function, module_name, exc)
        return {"ok": False, "error": why or traceback.format_exc()}
    except BaseException:  # noqa: BLE001 - a module that does not import is the outcome
        return {"ok": False, "error": traceback.format_exc()}
    why = target_refusal(function, target, allowed)
    if why:
        return {"ok": False, "error": why}
    _capture_logging()  # its module may have imported logging
    try:
        result = target(*(payload.get("args") or []), **(payload.get("kwargs") or {}))
        json.dumps(result)  # the result must travel as JSON
    except BaseException:  # noqa: BLE001 - everything the function raises is its outcome
        return {"ok": False, "error": traceback.format_exc()}
    return {"ok": True, "result": result}


def _dotted(function: str, module_name: str, exc: ModuleNotFoundError) -> str | None:
    """`pkg.mod.Class.method` does not import as a module: when `pkg.mod` does and
    `Class` is an object of it, the refusal says the path is a dotted qualname."""
    parent, _, name = module_name.rpartition(".")
    module = sys.modules.get(parent) if exc.name == module_name else None
    if module is None or not hasattr(module, name) or isinstance(getattr(module, name), type(sys)):
        return None
    return (
        f"function {function!r} is refused: {name}.{function.rpartition('.')[2]} is a "
        f"dotted path inside module {parent!r} (a method or an object's attribute): a job "
        "runs a module's own function by its plain name."
    )


# ---------------------------------------------------------------------------- the loop


def serve(source: int, sink: int, *, once: bool) -> None:
    """Runs the invocations read from fd `source`, writes each outcome to fd `sink`."""
    os.set_inheritable(source, False)  # what a job starts does not get the protocol
    os.set_inheritable(sink, False)
    if not once:
        _become_subreaper()
    home = os.getcwd()
    environ = dict(os.environ)
    _capture_output()
    with os.fdopen(source, "rb") as reader, os.fdopen(sink, "wb", buffering=0) as writer:
        for line in reader:
            message = json.loads(line)
            os.environ["LAKESHORE_INVOCATION_ID"] = str(message.get("id", ""))
            os.environ["LAKESHORE_ATTEMPT"] = str(message.get("attempt", ""))
            try:
                outcome = run(message)
                if not outcome.get("ok") and outcome.get("error"):  # the log says why too
                    sys.stderr.write(f"{str(outcome['error']).rstrip()}\n")
            finally:
                _flush()  # the job's output reaches the log before its outcome
            outcome["id"] = message.get("id")
            if not once:
                _put_back_logging()
                left = _clean_up(home, environ)
                if left:
                    outcome["leftovers"] = left
            writer.write(json.dumps(outcome).encode() + b"\n")
            if once:
                return


def _capture_output() -> None:
    """Each line the job prints reaches its log at once; a crash of the interpreter
    itself (a segfault in an extension) leaves its Python traceback there too."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        with contextlib.suppress(ValueError):
            sys.stdout.reconfigure(line_buffering=True)
    with contextlib.suppress(RuntimeError, ValueError):
        faulthandler.enable()


_LOGGING: dict = {}  # the root logger as it was before the first capture


def _capture_logging() -> None:
    """Records at INFO and above that no handler of the job's takes go to stderr (so to
    the job's log), once the job's code imported logging."""
    logging: Any = sys.modules.get("logging")  # the job's, if it imported it: not ours
    if logging is None or _LOGGING:
        return
    root = logging.getLogger()
    _LOGGING.update(level=root.level, handlers=list(root.handlers), last=logging.lastResort)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.lastResort = handler
    root.setLevel(logging.INFO)


def _put_back_logging() -> None:
    """What one invocation did to the root logger does not reach the next one."""
    logging: Any = sys.modules.get("logging")
    if logging is None or not _LOGGING:
        return
    root = logging.getLogger()
    root.setLevel(_LOGGING["level"])
    for handler in list(root.handlers):
        if handler not in _LOGGING["handlers"]:
            root.removeHandler(handler)
    logging.lastResort = _LOGGING["last"]
    _LOGGING.clear()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a job may close or replace its streams
            stream.flush()


def _clean_up(home: str, environ: dict) -> list[str]:
    """Puts back the environment and working directory; kills the child processes the
    invocation left (what left the process group too: orphans are ours as subreaper).
    Returns why this process should not run another invocation: [] when clean."""
    os.environ.pop("LAKESHORE_INVOCATION_ID", None)
    os.environ.pop("LAKESHORE_ATTEMPT", None)
    if os.environ != environ:  # the job changed it
        os.environ.clear()
        os.environ.update(environ)
    try:
        if os.getcwd() != home:
            os.chdir(home)
    except OSError:
        return ["its working directory is gone"]
    reasons = []
    children = _children()
    for pid in children:  # our children: their pids cannot be reused before we reap them
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if children:
        reasons.append(f"it left {len(children)} process(es) running (killed)")
    threading = sys.modules.get("threading")  # no threading module: no Python threads
    if threading is not None:
        main = threading.main_thread()
        left = [t for t in threading.enumerate() if t is not main and not t.daemon]
        if left:
            reasons.append(f"it left {len(left)} thread(s) running")
    return reasons


def _children() -> list[int]:
    """This process's child processes (any of its threads'), from /proc."""
    pids: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
                pids.extend(int(pid) for pid in handle.read().split())
        except (OSError, ValueError):
            continue
    return pids


def _become_subreaper() -> None:
    """Processes orphaned below this one become its children (not init's), so it sees
    and kills what an invocation left behind after their parent exited."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes  # noqa: PLC0415 - Linux only, and only in job processes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> None:
    options: dict[str, int | None] = {"--in": None, "--out": None}
    once = False
    words = iter(argv)
    for word in words:
        if word == "--once":
            once = True
        elif word in options:
            options[word] = int(next(words))
        else:
            raise SystemExit(f"lakeshore.runner: unknown argument {word!r}")
    if options["--in"] is None or options["--out"] is None:
        raise SystemExit("usage: python -m lakeshore.runner --in FD --out FD [--once]")
    serve(options["--in"], options["--out"], once=once)


if __name__ == "__main__":
    main(sys.argv[1:])
