"""Runs an invocation that the Python SDK (dreamlake-lakeshore) submitted, inside a job
process of `lakeshore daemon run` (lakeshore.runner calls `run_envelope`).

The SDK's arguments are an opaque msgpack Envelope. It is run through the SDK's own
documented exec contract, `python -m dreamlake.lakeshore.daemon.entry`:

1. the envelope's bytes, unchanged, go to `<workdir>/args.msgpack`;
2. the entry runs with the workdir as its working directory and DREAMLAKE_WORKDIR,
   DREAMLAKE_INVOCATION_ID and LAKESHORE_ROOT set;
3. exit 0: `result.msgpack` holds the result (wire-packed), reported as it is;
4. otherwise: `error.json` holds {type, message, traceback}, reported as the error.

What may run is this daemon's decision, as for JSON invocations: a function shipped by
reference must be a plain function defined in an allowed module (lakeshore.functions
and LAKESHORE_ALLOWED_MODULES of the daemon host; lakeshore.allow), checked on its name
in the job process and on what it resolves to in the process that runs it (`main`,
which wraps the SDK's entry); a pickled one (a thunk, a lambda, a
function defined in `__main__`) runs only on a daemon started with `--allow-pickled`.
Without the SDK installed where the daemon runs, the invocation fails and says what
to install. The entry runs in this job process's group: a timeout or a kill of the
daemon takes it too."""

import base64
import importlib
import importlib.util
import json
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from lakeshore.allow import name_refusal, parse_modules, target_refusal
from lakeshore.msgpack_count import count_objects

ENTRY = "dreamlake.lakeshore.daemon.entry"
# An Envelope's outer map is a few dozen objects (its arguments are nested bin): a blob
# of more is a bare value, and is never decoded to find out.
ENVELOPE_OBJECTS_MAX = 512


class ResultBlob(str):
    """A result that is the SDK's bytes (base64), reported as result_blob."""


class FinalError(str):
    """An error after which another attempt cannot help (this daemon refuses the
    function): reported with retry false."""


INSTALL_HINT = (
    "this daemon's Python ({python}) cannot import dreamlake.lakeshore, which runs the "
    "Python SDK's invocations: pip install dreamlake-lakeshore==0.5.0 into that "
    "environment, then restart the daemon"
)


def describe(envelope: bytes) -> dict:
    """The envelope's function: {"kind": "ref"|"pickle", "module", "qualname"}. Only
    the outer map is read (the arguments are nested bin). ValueError when the bytes are
    not an Envelope (a bare value). The server reads submits with it too (jobs/sdk.py)."""
    import msgpack  # noqa: PLC0415 - comes with the SDK: the CLI alone does without

    if count_objects(envelope, ENVELOPE_OBJECTS_MAX) > ENVELOPE_OBJECTS_MAX:
        raise ValueError("more objects than an SDK Envelope holds: a bare value")
    try:
        outer = msgpack.unpackb(envelope, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - whatever msgpack refuses is not an Envelope
        raise ValueError(f"not msgpack: {exc}") from None
    fn = outer.get("fn") if isinstance(outer, dict) else None
    if (
        not isinstance(outer, dict)
        or not isinstance(outer.get("v"), int)
        or not isinstance(fn, dict)
    ):
        raise ValueError("the invocation's arguments are not an SDK Envelope")
    module, qualname = fn.get("module"), fn.get("qualname")
    return {
        "kind": str(fn.get("kind", "ref")),
        "module": module if isinstance(module, str) else "",
        "qualname": qualname if isinstance(qualname, str) else "",
    }


def refusal(fn: dict, *, allowed: tuple[str, ...], allow_pickled: bool) -> str | None:
    """Why this daemon will not run the function, or None."""
    if fn["kind"] in ("pickle", "pickle-ref"):
        if allow_pickled:
            return None
        return (
            f"this daemon refuses pickled functions ({fn['qualname'] or 'unnamed'}): a "
            "thunk, a lambda or a function defined in __main__ travels as code to "
            "execute; start the daemon with --allow-pickled if you trust who submits "
            "to its queues, or define the function in a module the daemon can import"
        )
    module = fn["module"]
    if fn["kind"] != "ref" or not module:
        return f"unknown SDK function transport {fn['kind']!r}"
    return name_refusal(module, fn["qualname"], allowed)


def entry_command(allowed: tuple[str, ...]) -> list[str]:
    """The process that runs an SDK invocation: this module's `main`, which checks
    what the envelope's function resolves to, then runs the SDK's entry in itself."""
    return [sys.executable, "-m", "lakeshore.sdk_job", "--allowed", ",".join(allowed)]


def sdk_installed() -> bool:
    try:
        return importlib.util.find_spec(ENTRY) is not None
    except ModuleNotFoundError:
        return False


def run_envelope(payload: dict, *, allowed: tuple[str, ...], timeout: float | None) -> dict:
    """The outcome of one SDK invocation: {"ok": True, "result_blob": base64} or
    {"ok": False, "error": text}."""
    if not sdk_installed():
        return {"ok": False, "error": INSTALL_HINT.format(python=sys.executable)}
    envelope = base64.b64decode(payload.get("args_blob") or "")
    try:
        fn = describe(envelope)
    except Exception as exc:  # noqa: BLE001 - a blob that is not an envelope
        return {"ok": False, "error": f"cannot read the SDK envelope: {exc}"}
    why = refusal(fn, allowed=allowed, allow_pickled=bool(payload.get("allow_pickled")))
    if why:
        return {"ok": False, "error": why, "final": True}
    with tempfile.TemporaryDirectory(prefix="lakeshore-sdk-") as workdir:
        work = Path(workdir)
        (work / "args.msgpack").write_bytes(envelope)
        env = {
            **os.environ,
            "DREAMLAKE_WORKDIR": workdir,
            "DREAMLAKE_INVOCATION_ID": str(payload.get("id", "")),
            "LAKESHORE_ROOT": os.environ.get("LAKESHORE_ROOT") or os.getcwd(),
        }
        # the function's module is found where the daemon runs (its working directory)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p
        )
        try:
            done = subprocess.run(
                entry_command(allowed),
                cwd=workdir,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout:g} s", "timeout": True}
        if done.returncode == 0:
            result = work / "result.msgpack"
            if not result.exists():
                return {"ok": False, "error": "the SDK's entry exited 0 without result.msgpack"}
            return {"ok": True, "result_blob": base64.b64encode(result.read_bytes()).decode()}
        error = _error(work / "error.json")
        if error.get("refused"):  # lakeshore.sdk_job's main refused the function
            return {"ok": False, "error": str(error.get("message")), "final": True}
        return {"ok": False, "error": _error_text(error, done.returncode)}


def _error(path: Path) -> dict:
    try:
        error = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return error if isinstance(error, dict) else {}


def _error_text(error: dict, status: int) -> str:
    if not error:
        return f"the SDK's entry exited with status {status} (no error.json)"
    text = f"{error.get('type', 'Error')}: {error.get('message', '')}"
    trace = error.get("traceback")
    return f"{text}\n{trace}" if trace else text


# ---------------------------------------------------------------------------- the entry


def main(argv: list[str]) -> int:
    """`python -m lakeshore.sdk_job --allowed A,B` in the invocation's workdir: refuses
    an envelope whose function by reference resolves to something `lakeshore.allow`
    refuses (error.json says so, with "refused": true), else runs the SDK's entry in
    this same process, so what was checked is what runs. A pickled function gets here
    only when the daemon allows pickled functions (`refusal`, in the job process)."""
    if len(argv) != 2 or argv[0] != "--allowed":
        raise SystemExit("usage: python -m lakeshore.sdk_job --allowed MODULE[,MODULE…]")
    allowed = parse_modules(argv[1])
    workdir = Path(os.environ.get("DREAMLAKE_WORKDIR") or Path.cwd())
    try:
        fn = describe((workdir / "args.msgpack").read_bytes())
        if fn["kind"] not in ("pickle", "pickle-ref"):
            why = refusal(fn, allowed=allowed, allow_pickled=False)
            if not why:
                target = getattr(importlib.import_module(fn["module"]), fn["qualname"])
                why = target_refusal(f"{fn['module']}.{fn['qualname']}", target, allowed)
            if why:
                _write_error(workdir, {"type": "Refused", "message": why, "refused": True})
                return 1
    except Exception as exc:  # noqa: BLE001 - as the SDK's entry: the failure is reported
        error = {"type": type(exc).__name__, "message": str(exc)}
        _write_error(workdir, error | {"traceback": traceback.format_exc()})
        return 1
    runpy.run_module(ENTRY, run_name="__main__", alter_sys=True)  # exits with its status
    return 0


def _write_error(workdir: Path, error: dict) -> None:
    (workdir / "error.json").write_text(json.dumps(error))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
