"""The daemon's side of the job template (`--isolation process`): Template starts
`python -m lakeshore.pool.forkserver` (a job process's scrubbed environment, no token,
dies with the spawner thread like a job process) and asks it for one job process per
invocation; Forked is such a process as the daemon holds it (it is the daemon's child:
the template forks it with clone(CLONE_PARENT)), with Popen's pid, wait and poll.

The template answers each fork with the new process's pid. If it dies first, the new
process's own pipe says whether one was made: the template does not keep that pipe, so
when it closes without a pid, no process was made. Until the new process has a session
of its own (its first step), its group is not there to kill: kill_job_group then kills
the process itself, which has started nothing yet. A template found dead (before or
during a fork) is started again and the fork asked once more; if that fails too, the
fork raises OSError (the invocation fails, and says why). Only the spawner thread uses
a Template."""

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from lakeshore.pool.processes import start_job_process

FORKSERVER = "lakeshore.pool.forkserver"
READY_TIMEOUT = 60.0  # seconds for a template to import what it preloads
FORK_TIMEOUT = 10.0  # seconds for a new job process to say its pid
MESSAGE_MAX = 1 << 20


class Forked:
    """A job process the template forked: the daemon's child, so waited for here."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.waiting = threading.Lock()

    def wait(self) -> int:
        with self.waiting:
            if self.returncode is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                    self.returncode = os.waitstatus_to_exitcode(status)
                except ChildProcessError:  # someone else reaped it: its code is lost
                    self.returncode = 255
        return self.returncode

    def poll(self) -> int | None:
        with self.waiting:
            if self.returncode is None:
                with contextlib.suppress(ChildProcessError):
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class TemplateError(OSError):
    """The template could not be started, or could not fork (`said`: and it said why)."""

    said = False


class Template:
    """One template process, started again when it is found dead (spawner only)."""

    def __init__(
        self,
        environment: dict,
        *,
        preload: tuple[str, ...] = (),
        log: Callable[[str], None] = print,
    ):
        self.environment = environment
        self.preload = tuple(preload)
        self.log = log
        self.process: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.starts = 0  # templates started, for figures and tests
        self.preloaded: list[str] = []  # what the running template imported up front

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """A template ready to fork (raises TemplateError if none can be)."""
        self.stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", FORKSERVER, "--control", str(theirs.fileno())]
        if self.preload:
            command += ["--preload", ",".join(self.preload)]
        try:
            self.process = start_job_process(
                command, self.environment, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),)
            )
        except OSError as exc:
            ours.close()
            raise TemplateError(f"could not start the job template: {exc}") from None
        finally:
            theirs.close()
        self.control = ours
        self.starts += 1
        answer = self._answer(READY_TIMEOUT)
        if not answer or "ready" not in answer:
            why = (answer or {}).get("error") or f"it exited (code {self.process.poll()})"
            self.stop()
            raise TemplateError(f"the job template did not start: {why}")
        self.preloaded = list(answer.get("preloaded") or [])
        left = answer.get("skipped") or {}
        note = "; not preloaded: " + ", ".join(f"{m} ({w})" for m, w in left.items())
        self.log(
            f"job template {self.process.pid} ready "
            f"({len(self.preloaded)} modules preloaded{note if left else ''})"
        )

    def _answer(self, timeout: float) -> dict | None:
        """The template's next message, None if it closed or said nothing in time."""
        if self.control is None:
            return None
        ready, _, _ = select.select([self.control], [], [], timeout)
        if not ready:
            return None
        try:
            data = self.control.recv(MESSAGE_MAX)
        except OSError:
            return None
        try:
            return json.loads(data) if data else None
        except ValueError:
            return {"error": "the job template sent something that is not JSON"}

    def fork(self, env: dict, fds: tuple[int, int, int, int]) -> Forked:
        """A new job process with `env`, the runner's input and output pipes and its
        stdout and stderr (`fds`, the child's ends; the caller closes them after).
        Raises TemplateError when none could be made (see fork_many)."""
        (forked,) = self.fork_many([(env, fds)])
        if isinstance(forked, TemplateError):
            raise forked
        return forked

    def ensure(self, when: str = "") -> None:
        """A template running: this one, or a new one if it died."""
        if self.alive():
            return
        if self.process is not None:
            code = self.process.poll()
            self.log(f"job template {self.pid} exited (code {code}){when}; starting another")
        self.start()

    def fork_many(self, requests: list[tuple[dict, tuple[int, int, int, int]]]) -> list:
        """A job process for each (env, fds) request, as `fork` makes one, in one exchange
        with the template: every request is sent before the first answer is read, so
        the template forks them back to back. Answers, in the requests' order, each one's
        Forked or its TemplateError. A request the template could not serve without
        saying why (it died, or went silent) is asked once more, alone, of a template
        started again if need be, as `fork` does."""
        self.ensure()
        sent: list[int] = []  # each sent request's `said` (read end)
        results: list = []
        try:
            for env, fds in requests:
                try:
                    sent.append(self._ask(env, fds))
                except TemplateError:
                    break  # the template is gone: the rest are asked alone below
            gone = False  # after a silence its socket is not read again: a late answer
            for said in sent:  # there would be taken for the next request's
                if gone:
                    pid = self._pid(said)
                    died = TemplateError("the job template died while forking")
                    results.append(died if pid is None else Forked(pid))
                    continue
                try:
                    results.append(self._answered(said))
                except TemplateError as exc:
                    results.append(exc)
                    gone = not exc.said
        finally:
            for said in sent:
                os.close(said)
        for index, (env, fds) in enumerate(requests):
            result = results[index] if index < len(results) else None
            if isinstance(result, Forked) or (result is not None and result.said):
                continue
            try:
                self.ensure(" while forking a job process")
                result = self._fork(env, fds)
            except TemplateError as exc:
                result = exc
            if index < len(results):
                results[index] = result
            else:
                results.append(result)
        return results

    def _fork(self, env: dict, fds: tuple[int, int, int, int]) -> Forked:
        said = self._ask(env, fds)
        try:
            return self._answered(said)
        finally:
            os.close(said)

    def _ask(self, env: dict, fds: tuple[int, int, int, int]) -> int:
        """Sends one fork request; answers the read end of the pipe the new process
        writes its pid on (the caller closes it)."""
        said, say = os.pipe()
        message = json.dumps({"env": env}).encode()
        try:
            if self.control is None:  # ended since `ensure` started it
                raise OSError("its control socket is closed")
            socket.send_fds(self.control, [message], [*fds, say])
        except OSError as exc:
            os.close(said)
            self._end()
            raise TemplateError(f"the job template is gone ({exc})") from None
        finally:
            os.close(say)
        return said

    def _answered(self, said: int) -> Forked:
        """The template's answer to the oldest request not yet answered (`said`, its
        pipe): the new process, or TemplateError."""
        answer = self._answer(FORK_TIMEOUT) or {}
        if isinstance(answer.get("pid"), int):
            return Forked(answer["pid"])
        if answer.get("error"):  # alive, and it said why it could not fork
            error = TemplateError(str(answer["error"]))
            error.said = True
            raise error
        self._end()  # it died or does not answer: it is done with
        pid = self._pid(said)  # a child may have been made all the same
        if pid is None:
            raise TemplateError("the job template died while forking")
        return Forked(pid)

    def _pid(self, said: int) -> int | None:
        """The pid the new process writes on `said`; None once every writer is gone (no
        process was made) or after FORK_TIMEOUT."""
        got = b""
        while True:
            ready, _, _ = select.select([said], [], [], FORK_TIMEOUT)
            if not ready:
                return None
            chunk = os.read(said, 32)
            got += chunk
            if not chunk or got.endswith(b"\n"):
                return int(got) if got.strip().isdigit() and got.endswith(b"\n") else None

    def _end(self) -> None:
        """Waits a second for a template that stopped answering to exit, then kills it
        (its exit code stays for the log)."""
        if self.process is None:
            return
        try:
            self.process.wait(1)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Closes the control socket (the template exits), kills and reaps it."""
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                self.process.kill()
            self.process.wait()
            self.process = None
