"""A tiny JSON-lines protocol between the bench and a helper process that must run
apart from it (procrastinate in its own venv; the Django probes in a process with the
bench database's settings). Standard library only: both venvs import it.

Request: {"cmd": "name", ...arguments}. Answer: {"ok": true, ...} or
{"ok": false, "error": "..."}."""

import json
import subprocess
import sys
from pathlib import Path


def serve(handler) -> None:
    """Answer requests from stdin by calling handler.<cmd>(**arguments), until EOF."""
    for line in sys.stdin:
        request = json.loads(line)
        command = request.pop("cmd")
        try:
            answer = {"ok": True, **(getattr(handler, command)(**request) or {})}
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which goes on
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


class LineClient:
    """The bench's side: start the helper, send requests, raise on its errors."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict | None, log: Path):
        self.log = log
        with open(log, "wb") as stderr:  # this run's
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def call(self, command: str, **arguments) -> dict:
        self.process.stdin.write(json.dumps({"cmd": command, **arguments}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the helper process exited; see {self.log}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(answer["error"])
        return answer

    def close(self, timeout: float = 30) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
