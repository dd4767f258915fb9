"""One job process as the daemon sees it (JobProcess: a `lakeshore.runner` process and
the pipe pair to it, one JSON line each way), and Running, an invocation the daemon
runs."""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from lakeshore.joblog import ERR, OUT, Lines
from lakeshore.pool.processes import JobHandle, kill_job_group, start_job_process
from lakeshore.pool.template import Template

RUNNER = "lakeshore.runner"
READ_CHUNK = 1 << 16
OUTPUT_READ_MAX = 1 << 20  # bytes of one stream read at one wake: the others get a turn


@dataclass
class Running:
    """An invocation this daemon runs."""

    invocation: dict
    daemon_id: str | None = None  # the registration that claimed it (reports go there)
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False  # the server no longer counts it as ours: stop, don't report
    process: "JobProcess | None" = None
    signalled_until: float = 0.0  # an operator's TERM/INT: its grace ends then (monotonic)

    @property
    def id(self) -> str:
        return str(self.invocation["id"])

    @property
    def deadline(self) -> float | None:
        timeout_s = self.invocation.get("timeout_s")
        return self.started + float(timeout_s) if timeout_s else None


class JobProcess:
    """One `lakeshore.runner` process and its pipes. Only the monitor thread reads its
    pipe and closes its descriptors; any thread may kill it."""

    def __init__(
        self,
        process: JobHandle,
        to_runner: int,
        from_runner: int,
        once: bool,
        output: dict[str, int] | None = None,
    ):
        self.process = process
        self.to_runner = to_runner  # we write invocations here (blocking)
        self.from_runner = from_runner  # outcomes come here (non-blocking)
        self.once = once
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd: EOF means exit
            self.pidfd = os.pidfd_open(process.pid)
        self.buffer = bytearray()
        self.current: Running | None = None
        self.outcome: dict | None = None  # once: read before the exit that ends it
        self.tasks = 0
        self.killed = False  # out of service: killed, or on its way out
        self.closed = False
        self.io = threading.Lock()  # send against close
        self.sent: str | None = None  # the id of the last invocation written to it
        self.output = output or {}  # stream letter → the read end of its stdout, stderr
        self.lines = {stream: Lines(stream) for stream in self.output}

    @classmethod
    def start(cls, env: dict, *, once: bool, template: "Template | None" = None) -> "JobProcess":
        """A new `lakeshore.runner` process: a fresh interpreter, or (once, with a
        template) a child forked from the warm template, which runs the same runner."""
        pipes = _Pipes()
        command = [sys.executable, "-m", RUNNER, "--in", str(pipes.runner_in)]
        command += ["--out", str(pipes.runner_out)]
        process: JobHandle
        try:
            if template is not None and once:
                process = template.fork(env, pipes.child_ends)
            else:
                process = start_job_process(
                    [*command, "--once"] if once else command,
                    env,
                    stdin=subprocess.DEVNULL,  # a job that reads stdin finds nothing
                    stdout=pipes.out_write,
                    stderr=pipes.err_write,
                    pass_fds=(pipes.runner_in, pipes.runner_out),
                )
        except BaseException:
            pipes.close_ours()
            raise
        finally:
            pipes.close_child_ends()
        return pipes.job_process(process, once)

    @classmethod
    def fork_many(cls, envs: list[dict], template: Template) -> list:
        """A job process (once) for each env, forked from the warm template in one
        exchange with it (Template.fork_many). Answers each one's JobProcess, or the
        OSError that says why it could not be made, in the order of `envs`."""
        pipes = [_Pipes() for _ in envs]
        try:
            requests = [(env, made.child_ends) for env, made in zip(envs, pipes, strict=True)]
            forked = template.fork_many(requests)
        except BaseException:
            for made in pipes:
                made.close_ours()
            raise
        finally:
            for made in pipes:
                made.close_child_ends()
        processes: list = []
        for made, process in zip(pipes, forked, strict=True):
            if isinstance(process, OSError):
                made.close_ours()
                processes.append(process)
            else:
                processes.append(made.job_process(process, True))
        return processes

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: dict, item_id: str) -> bool:
        """Hands it an invocation; False if it is gone (it never got it). Holds `io`,
        so the monitor cannot close the descriptor (whose number another pipe or socket
        could then take) while this writes to it, and knows afterwards whether the
        invocation went out (`sent`)."""
        data = json.dumps(message).encode() + b"\n"
        with self.io:
            if self.closed or self.to_runner < 0:
                return False
            try:
                while data:
                    data = data[os.write(self.to_runner, data) :]
            except OSError:  # BrokenPipeError: it died
                return False
            self.sent = item_id
            if self.once:
                self._close_input()
        return True

    def read(self) -> tuple[list[bytes], bool]:
        """The complete lines it wrote since the last read, and whether its end closed."""
        eof = False
        while True:
            try:
                chunk = os.read(self.from_runner, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        lines = []
        while (end := self.buffer.find(b"\n")) >= 0:
            lines.append(bytes(self.buffer[:end]))
            del self.buffer[: end + 1]
        return lines, eof

    def read_output(self, stream: str) -> tuple[list[str], bool]:
        """The lines of stdout ("o") or stderr ("e") written since the last read (up to
        OUTPUT_READ_MAX bytes), and whether it closed (every writer gone)."""
        fd = self.output.get(stream, -1)
        if fd < 0:
            return [], True
        lines: list[str] = []
        taken = 0
        while taken < OUTPUT_READ_MAX:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return lines, False
            except OSError:
                chunk = b""
            if not chunk:
                return lines + self.lines[stream].end(), True
            taken += len(chunk)
            lines += self.lines[stream].feed(chunk)
        return lines, False

    def line_ends(self) -> dict[str, list[str]]:
        """What each stream holds without a line end: the invocation ended."""
        return {stream: lines.end() for stream, lines in self.lines.items()}

    def kill(self) -> None:
        kill_job_group(self.process)

    def reap(self) -> int:
        """Kills its group, waits for it, closes its descriptors: its exit code. The
        group is killed while its leader is still unreaped (a zombie keeps the number)."""
        if self.closed:
            return self.process.wait()
        kill_job_group(self.process)
        code = self.process.wait()
        self.close()
        return code

    def _close_input(self) -> None:
        if self.to_runner >= 0:
            with contextlib.suppress(OSError):
                os.close(self.to_runner)
            self.to_runner = -1

    def close(self) -> None:
        with self.io:  # a write in progress ends first (EPIPE: the process is dead)
            if self.closed:
                return
            self.closed = True
            self._close_input()
            for fd in (self.from_runner, self.pidfd, *self.output.values()):
                if fd is not None and fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)


class _Pipes:
    """The pipes of one new job process: the runner's input and output, and its stdout
    and stderr (the job's log). The child's ends are closed once it has them (or could
    not be made); ours become its JobProcess's."""

    def __init__(self) -> None:
        self.runner_in, self.to_runner = os.pipe()
        self.from_runner, self.runner_out = os.pipe()
        self.out_read, self.out_write = os.pipe()
        self.err_read, self.err_write = os.pipe()

    @property
    def child_ends(self) -> tuple[int, int, int, int]:
        return (self.runner_in, self.runner_out, self.out_write, self.err_write)

    def close_child_ends(self) -> None:
        for fd in self.child_ends:
            os.close(fd)

    def close_ours(self) -> None:
        for fd in (self.to_runner, self.from_runner, self.out_read, self.err_read):
            os.close(fd)

    def job_process(self, process: JobHandle, once: bool) -> JobProcess:
        for fd in (self.from_runner, self.out_read, self.err_read):
            os.set_blocking(fd, False)
        output = {OUT: self.out_read, ERR: self.err_read}
        return JobProcess(process, self.to_runner, self.from_runner, once, output)
