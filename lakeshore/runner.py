"""Runs one invocation in its own process: `python -m lakeshore.runner OUTCOME_FILE`
reads {"function", "args", "kwargs"} as JSON on stdin and writes {"ok": true,
"result": …} or {"ok": false, "error": "<traceback>"} as JSON to OUTCOME_FILE; the
function's own output goes to the daemon's log. A process of its own lets the daemon
stop it (timeout, drop) without stopping itself."""

import importlib
import json
import os
import sys
import traceback

ALWAYS_ALLOWED = ("lakeshore.functions",)


def allowed_modules() -> tuple[str, ...]:
    extra = os.environ.get("LAKESHORE_ALLOWED_MODULES", "")
    return ALWAYS_ALLOWED + tuple(m.strip() for m in extra.split(",") if m.strip())


def is_allowed(function: str) -> bool:
    module = function.rpartition(".")[0]
    return any(module == m or module.startswith(m + ".") for m in allowed_modules())


def refusal(function: str) -> str:
    return (
        f"function {function!r} is not in an allowed module: this daemon runs "
        f"{', '.join(allowed_modules())} (set LAKESHORE_ALLOWED_MODULES to add modules)."
    )


def run(payload: dict) -> dict:
    function = payload["function"]
    if not is_allowed(function):
        return {"ok": False, "error": refusal(function)}
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
