"""Runs one invocation in its own process: `python -m lakeshore.runner OUTCOME_FILE`
reads {"function", "args", "kwargs", "allowed_modules"} as JSON on stdin and writes
{"ok": true, "result": …} or {"ok": false, "error": "<traceback>"} as JSON to
OUTCOME_FILE; the function's own output goes to the daemon's log. A process of its own
lets the daemon stop it (timeout, drop) without stopping itself.

The daemon decides what may run: `allowed_modules` comes from the daemon host's
LAKESHORE_ALLOWED_MODULES, read by the daemon and sent in the payload. The runner never
reads it from its own environment, which the daemon scrubs (see lakeshore.worker)."""

import importlib
import json
import sys
import traceback

ALWAYS_ALLOWED = ("lakeshore.functions",)


def parse_modules(text: str) -> tuple[str, ...]:
    """`"a.b, c"` → `("a.b", "c")`: the LAKESHORE_ALLOWED_MODULES syntax."""
    return tuple(m.strip() for m in (text or "").split(",") if m.strip())


def allowed_modules(payload: dict) -> tuple[str, ...]:
    extra = payload.get("allowed_modules") or ()
    return ALWAYS_ALLOWED + tuple(str(m) for m in extra if str(m).strip())


def is_allowed(function: str, allowed: tuple[str, ...]) -> bool:
    module = function.rpartition(".")[0]
    return any(module == m or module.startswith(m + ".") for m in allowed)


def refusal(function: str, allowed: tuple[str, ...]) -> str:
    return (
        f"function {function!r} is not in an allowed module: this daemon runs "
        f"{', '.join(allowed)} (set LAKESHORE_ALLOWED_MODULES where the daemon runs to "
        "add modules)."
    )


def run(payload: dict) -> dict:
    function = payload["function"]
    allowed = allowed_modules(payload)
    if not is_allowed(function, allowed):
        return {"ok": False, "error": refusal(function, allowed)}
    module_name, _, attr = function.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr)
        result = target(*payload.get("args", []), **payload.get("kwargs", {}))
        json.dumps(result)  # the result must travel as JSON
    except BaseException:  # noqa: BLE001 - everything the function raises is its outcome
        return {"ok": False, "error": traceback.format_exc()}
    return {"ok": True, "result": result}


def main() -> None:
    payload = json.loads(sys.stdin.read())
    outcome = run(payload)
    with open(sys.argv[1], "w") as handle:
        json.dump(outcome, handle)


if __name__ == "__main__":
    main()
