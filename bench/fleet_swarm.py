"""A fleet of idle daemons that send what `lakeshore daemon run` sends, in one process of
asyncio + httpx (no Django): the load generator of `make bench`'s "N idle daemons" rows
(bench/compare/fleet.py starts one or a few of these and merges what they print).

    python -m bench.fleet_swarm < {"base", "token", "operator", "daemons", "first",
                                   "queue", "ramp", "start_file", "windows", "window",
                                   "submits"}

Each daemon does what the daemon's own code does when it has nothing to run, with the
daemon's own constants and rules (imported, not copied):

- registers with the bootstrap `token` (retried with lakeshore.worker.calls' back-off),
  then speaks with its own credential from the answer;
- claims with the daemon's idle `claim_wait` (Worker's default) and its WIRES, back to
  back; on Retry-After (lakeshore.client.retry_after) it waits that long plus up to as
  long again at random, as ClaimLoop._claim_later does;
- heartbeats (with the ids it holds: none) every --heartbeat seconds (the command's
  default), shortened to what heartbeat.interval_within picks from the register answer's
  `heartbeat_timeout`, except when the daemon's own rule
  (lakeshore.worker.heartbeat.claims_renew) says to skip it: the daemon holds nothing,
  and a claim of its is waiting on the server or was answered within the interval (its
  polls renew it);
- a job it claims (one of the `submits` the submitter sends) it reports at once in an
  exchange (wait 0, as ClaimLoop._exchange), then goes back to waiting;
- on 409 daemon_lost it registers again (Worker._not_live); on daemon_terminated or
  a revoked token it stops.

Daemons register at random moments of the first `ramp` seconds (a fleet coming up),
at most REGISTERING_AT_ONCE at a time a process (the others wait their turn).
From `start_at`, which the parent writes to `start_file` once the whole fleet has
registered (time.monotonic(), which is system-wide on Linux, so the parent and several
generators share it), come `windows` windows of `window` seconds; each event counts in
the window it happens in. `submits` jobs a window are submitted to `queue`, one at a
time, evenly spaced, with the `operator` token, by the generator that runs daemon 0 (its
`first`). After the last window every daemon stops as `lakeshore daemon run` does at its
first SIGTERM: it sends no new poll, and says so in a heartbeat (`drain`), which answers
its waiting poll at once (each within DRAIN_SPREAD seconds, at random, as a fleet told
to stop does not stop in one instant); the fleet waits for every poll and heartbeat
still out (one wait + LATE at most, so a poll never answered is still seen). Then
everything stops, and one JSON object is printed. A poll is timed until its answer or
the end of the last window, whichever comes first: one still within its wait at the end
was held as asked, and what its answer then waits for is the stop's burst of drains, not
the server's hold. Per window: of the polls sent in it, how many were answered, held
(let wait: no Retry-After) and answered within their wait + LATE, answered late, refused
with Retry-After, or never answered; errors by kind, the latencies of the heartbeats
sent and how many were skipped, the gaps between a daemon's renewals (its register, each
answered poll or exchange, each answered heartbeat: what keeps it alive on the server)
and the longest silence of any daemon. And each submit (sent, answered, its invocation)
and each claim's moment by invocation id (bench/compare/fleet.py pairs them:
submit-to-claim latency)."""

import asyncio
import contextlib
import inspect
import json
import math
import random
import resource
import ssl
import sys
import time

import httpx

from lakeshore.client import TIMEOUT_SECONDS, long_poll, retry_after
from lakeshore.commands.daemon_run import run as daemon_run_command
from lakeshore.pool.job_process import Running
from lakeshore.worker.calls import BACKOFF_MAX, BACKOFF_START, DAEMON_LOST, DAEMON_TERMINATED
from lakeshore.worker.claim_loop import WIRES
from lakeshore.worker.daemon import Worker
from lakeshore.worker.heartbeat import claims_renew, interval_within
from lakeshore.worker.reporting import Outcome

# What `lakeshore daemon run` uses when nobody passes flags.
HEARTBEAT_DEFAULT = next(p.default for p in daemon_run_command.params if p.name == "heartbeat")
CLAIM_WAIT = inspect.signature(Worker).parameters["claim_wait"].default
LATE = 2.0  # a poll answered later than its wait plus this was not answered in time
# Registrations a generator process has in flight at once, at most: the rest of its
# daemons wait their turn. Without a bound, a server slower than the ramp queued the
# registrations past the client's timeout, each daemon registered again (a row no one
# renews), and 5,000 daemons took minutes to come up, hundreds marked lost meanwhile.
REGISTERING_AT_ONCE = 8
DRAIN_SPREAD = 2.0  # seconds over which the daemons say they stop, after the last window


def renew_interval(heartbeat_timeout) -> float:
    """The heartbeat interval a daemon started with the default --heartbeat ends up
    with, given the register answer's heartbeat_timeout: the daemon's own rule
    (lakeshore.worker.heartbeat.interval_within)."""
    return interval_within(HEARTBEAT_DEFAULT, heartbeat_timeout)


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


class Window:
    def __init__(self):
        # Polls sent in this window, and what became of them (whenever it did).
        self.sent = self.answered = self.held = self.late = self.refused = 0
        self.unanswered = 0  # still waiting past their wait + LATE when the fleet stopped
        self.errors: dict[str, int] = {}
        self.beats: list[float] = []  # latencies of the heartbeats sent (s; inf: failed)
        self.skipped = 0  # heartbeats skipped (claims_renew: an answered poll renewed it)
        # The gaps between a daemon's renewals that end in this window (s, to the ms).
        self.gaps: list[float] = []
        self.silence = 0.0  # the longest time any daemon went without renewing (s)
        self.lost = 0  # answers daemon_lost (the server had given the daemon up)

    def as_dict(self) -> dict:
        return {**vars(self)}


class Fleet:
    def __init__(self, args: dict):
        self.args = args
        self.base = args["base"]
        self.start_at = self.end = math.inf  # until the parent says (start_file)
        self.started = asyncio.Event()
        self.window = args["window"]
        if "start_at" in args:  # known from the start
            self.begin(args["start_at"])
        self.windows = [Window() for _ in range(args["windows"])]
        self.warm = Window()  # before start_at (the ramp): kept apart
        self.after = Window()  # after the last window: not counted, but its errors
        self.ending = asyncio.Event()  # the last window is over: each daemon stops
        self.submits: list[dict] = []  # {"sent", "answered", "id"}: the submitter's
        self.claimed: dict[str, float] = {}  # invocation id → the claim answer carrying it
        self.registered = 0
        self.registering = asyncio.Semaphore(REGISTERING_AT_ONCE)
        self.ids: list = []  # every daemon id a register answer gave (again after lost)
        self.renewed: dict[int, float] = {}  # daemon → its last renewal (monotonic)
        self.polling: dict[int, float] = {}  # daemon → when its poll in flight was sent
        self.beating: dict[int, float] = {}  # daemon → when its heartbeat in flight was sent
        # One TLS context for every client (the server speaks plain HTTP): httpx would
        # load the CA bundle for each client, about 10 ms of a core and 1 MiB each.
        self.no_tls = ssl.create_default_context()
        self.no_tls.check_hostname = False
        self.no_tls.verify_mode = ssl.CERT_NONE

    def at(self, moment: float) -> Window:
        if moment < self.start_at:
            return self.warm
        if moment >= self.end:
            return self.after
        return self.windows[int((moment - self.start_at) // self.window)]

    def failed(self, kind: str) -> None:
        errors = self.at(time.monotonic()).errors
        errors[kind] = errors.get(kind, 0) + 1

    def renew(self, daemon: int, moment: float) -> None:
        last = self.renewed.get(daemon)
        if last is not None:
            window = self.at(moment)
            window.silence = max(window.silence, moment - last)
            if window is not self.after and window is not self.warm:
                window.gaps.append(round(moment - last, 3))
        self.renewed[daemon] = moment

    def client(self, token: str, connections: int = 2) -> httpx.AsyncClient:
        # A client (two connections: the claim loop's, the heartbeat's) a daemon, as each
        # daemon process has its own; one client of 10,000 connections spends its time
        # in its pool's bookkeeping.
        return httpx.AsyncClient(
            base_url=self.base,
            headers={"Authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=connections),
            timeout=TIMEOUT_SECONDS,  # the daemon's client's
            verify=self.no_tls,
        )

    async def start(self) -> None:
        """The first window's moment, once the parent has written it (start_file: when
        the whole fleet registered, and some)."""
        while not self.started.is_set():
            try:
                with open(self.args["start_file"]) as file:
                    self.begin(json.load(file)["start_at"])
            except FileNotFoundError:
                await asyncio.sleep(0.2)

    def begin(self, start_at: float) -> None:
        self.start_at = start_at
        self.end = start_at + self.args["windows"] * self.window
        self.started.set()

    async def run(self) -> dict:
        count, first = self.args["daemons"], self.args["first"]
        tasks = [asyncio.create_task(self.daemon(first + i)) for i in range(count)]
        if first == 0 and self.args["submits"]:
            tasks.append(asyncio.create_task(self.submitter()))
        await self.start()
        await asyncio.sleep(max(0.0, self.end - time.monotonic()))
        last = self.windows[-1]
        for moment in self.renewed.values():  # silences still running at the end
            last.silence = max(last.silence, self.end - moment)
        await self.stop_all()
        for sent in self.polling.values():
            self.at(sent).unanswered += 1
        for sent in self.beating.values():  # never answered: never renewed
            self.at(sent).beats.append(math.inf)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "registered": self.registered,
            "ids": self.ids,
            "warm": self.warm.as_dict(),
            "windows": [window.as_dict() for window in self.windows],
            "submits": self.submits,
            "claimed": self.claimed,
            "heartbeat_interval": self.interval,
            "claim_wait": CLAIM_WAIT,
            "drain_errors": self.after.errors,
        }

    async def stop_all(self) -> None:
        """Every daemon stops (see `heartbeats`); waits until no poll or heartbeat is out,
        or one wait + LATE has passed (what is still out then was never answered)."""
        self.ending.set()
        deadline = time.monotonic() + CLAIM_WAIT + LATE
        while (self.polling or self.beating) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    interval = HEARTBEAT_DEFAULT

    async def daemon(self, index: int) -> None:
        await asyncio.sleep(random.uniform(0, self.args["ramp"]))  # noqa: S311
        async with self.client(self.args["token"]) as client:
            while True:
                async with self.registering:
                    me = await self.register(client, index)
                self.registered += 1
                self.ids.append(me["id"])
                self.renew(index, time.monotonic())
                self.interval = renew_interval(me.get("heartbeat_timeout"))
                # answered: when a claim or exchange was last answered (the daemon's
                # claim_answered); busy: it holds a job it has not reported yet.
                state = {"id": me["id"], "answered": -math.inf, "busy": False, "again": False}
                beat = asyncio.create_task(self.heartbeats(client, index, state))
                try:
                    await self.claims(client, index, state)
                    if self.ending.is_set():  # its poll may have come back first:
                        await beat  # its heartbeat loop still says drain, then ends
                finally:
                    beat.cancel()
                if not state["again"]:
                    return

    async def register(self, client: httpx.AsyncClient, index: int) -> dict:
        body = {"name": f"fleet-{index}", "queues": [self.args["queue"]]}
        bootstrap = {"Authorization": f"Bearer {self.args['token']}"}
        delay = BACKOFF_START
        while True:
            try:
                answer = await client.post(
                    "/api/v1/daemons/register/", json=body, headers=bootstrap
                )
                if answer.status_code == 201:
                    me = answer.json()
                    if me.get("token"):  # its own credential from now on
                        client.headers["Authorization"] = f"Bearer {me['token']}"
                    return me
                self.failed(f"register {answer.status_code} {_code(answer)}".rstrip())
            except httpx.HTTPError as exc:
                self.failed(f"register {type(exc).__name__}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    def _not_live(self, answer: httpx.Response, state: dict) -> bool:
        """A 409 or 401: the daemon registers again (lost) or stops; True if so."""
        if answer.status_code not in (401, 409):
            return False
        code = _code(answer)
        if code == DAEMON_LOST:
            self.at(time.monotonic()).lost += 1
            state["again"] = True
        elif code != DAEMON_TERMINATED:
            self.failed(f"{answer.status_code} {code}")
        return True

    async def claims(self, client: httpx.AsyncClient, index: int, state: dict) -> None:
        url = f"/api/v1/daemons/{state['id']}/claim/"
        body = {"limit": 1, "wait": CLAIM_WAIT, "wires": WIRES}
        delay = BACKOFF_START
        while not self.ending.is_set():  # a stopping daemon sends no new poll
            sent = time.monotonic()
            self.at(sent).sent += 1
            self.polling[index] = sent
            try:
                answer = await client.post(url, json=body, timeout=long_poll(CLAIM_WAIT))
            except httpx.HTTPError as exc:
                self.failed(f"claim {type(exc).__name__}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            finally:
                self.polling.pop(index, None)
            now = time.monotonic()
            window = self.at(sent)  # what became of the polls sent in it
            if self._not_live(answer, state):
                return
            if answer.status_code != 200:
                self.failed(f"claim {answer.status_code} {_code(answer)}".rstrip())
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_START
            window.answered += 1
            state["answered"] = now  # as ClaimLoop._claimed: the server saw us
            self.renew(index, now)  # the claim renewed the daemon's liveness
            pause = retry_after(answer)
            # Timed until its answer or the fleet's end, whichever first: the stop's
            # drains come all at once, and the answers they bring (a poll within its
            # wait at the end) would be late for the stop's sake, not the server's.
            if min(now, self.end) - sent > CLAIM_WAIT + LATE:
                window.late += 1
            elif not pause:
                window.held += 1
            claimed = answer.json()
            if claimed:
                await self.complete(client, index, state, claimed, now)
                if state["again"]:
                    return
            if pause:
                window.refused += 1
                await asyncio.sleep(pause * (1 + random.random()))  # noqa: S311 - as the daemon

    async def complete(self, client, index, state, claimed: list[dict], moment: float) -> None:
        """Run nothing, report at once in an exchange (which may claim more: those too).
        Until its answer the daemon holds a job: not idle, it heartbeats when due."""
        state["busy"] = True
        try:
            await self._exchange(client, index, state, claimed, moment)
        finally:
            state["busy"] = False

    async def _exchange(self, client, index, state, claimed: list[dict], moment: float) -> None:
        url = f"/api/v1/daemons/{state['id']}/exchange/"
        while claimed:
            for invocation in claimed:
                self.claimed[str(invocation["id"])] = moment
            outcomes = [
                Outcome(Running(job, daemon_id=state["id"]), "succeeded", None, "", 0.0).body()
                for job in claimed
            ]
            body = {"outcomes": outcomes, "limit": 1, "wait": 0, "wires": WIRES}
            try:
                answer = await client.post(url, json=body)
            except httpx.HTTPError as exc:
                self.failed(f"exchange {type(exc).__name__}")
                return
            if self._not_live(answer, state):
                return
            if answer.status_code != 200:
                self.failed(f"exchange {answer.status_code} {_code(answer)}".rstrip())
                return
            moment = state["answered"] = time.monotonic()
            self.renew(index, moment)
            claimed = answer.json().get("claimed") or []

    async def heartbeats(self, client: httpx.AsyncClient, index: int, state: dict) -> None:
        url = f"/api/v1/daemons/{state['id']}/heartbeat/"
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ending.wait(), self.interval)
            if self.ending.is_set():
                await self.drain(client, index, url)
                return
            idle, now = not state["busy"], time.monotonic()
            if claims_renew(
                idle=idle,
                answered=state["answered"],
                now=now,
                interval=self.interval,
                in_flight=index in self.polling,  # as ClaimLoop: a claim out renews us
            ):
                self.at(now).skipped += 1
                continue
            sent = time.monotonic()
            window = self.at(sent)  # a beat counts where it was sent; a failed one: never
            self.beating[index] = sent
            try:
                answer = await client.post(url, json={"held": []})
            except httpx.HTTPError as exc:
                self.failed(f"heartbeat {type(exc).__name__}")
                window.beats.append(math.inf)
                continue
            finally:
                self.beating.pop(index, None)
            now = time.monotonic()
            if answer.status_code in (401, 409):
                self._not_live(answer, state)
                continue  # the claim loop finds out too, and registers again or stops
            if answer.status_code != 200:
                self.failed(f"heartbeat {answer.status_code} {_code(answer)}".rstrip())
                window.beats.append(math.inf)
                continue
            window.beats.append(now - sent)
            self.renew(index, now)

    async def drain(self, client: httpx.AsyncClient, index: int, url: str) -> None:
        """The daemon says it is stopping (its first SIGTERM: `drain`), at a random moment
        of DRAIN_SPREAD: the server sets it draining and answers its waiting poll. Out
        (`beating`) from the stop on, so the fleet waits for it."""
        self.beating[index] = time.monotonic()
        try:
            await asyncio.sleep(random.uniform(0, DRAIN_SPREAD))  # noqa: S311
            answer = await client.post(url, json={"held": [], "drain": True})
            if answer.status_code != 200:
                self.failed(f"drain {answer.status_code} {_code(answer)}".rstrip())
        except httpx.HTTPError as exc:
            self.failed(f"drain {type(exc).__name__}")
        finally:
            self.beating.pop(index, None)

    async def submitter(self) -> None:
        """`submits` jobs a window, one at a time, evenly spaced, from the first window."""
        every = self.window / self.args["submits"]
        body = {"function": "lakeshore.functions.echo", "queue": self.args["queue"]}
        async with self.client(self.args["operator"], connections=1) as client:
            await self.started.wait()
            await asyncio.sleep(max(0.0, self.start_at - time.monotonic()) + every / 2)
            while time.monotonic() < self.end:
                started = time.monotonic()
                submit = {"sent": started, "answered": None, "id": None}
                self.submits.append(submit)
                try:
                    answer = await client.post("/api/v1/jobs/", json={**body, "args": [1]})
                    submit["id"] = str(answer.raise_for_status().json()["id"])
                    submit["answered"] = time.monotonic()
                except httpx.HTTPError as exc:
                    self.failed(f"submit {type(exc).__name__}")
                await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


def _code(answer: httpx.Response) -> str:
    """The error's code ({"error": {"code": …}}), as lakeshore.client reads it."""
    try:
        return str(answer.json()["error"].get("code", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def main() -> None:
    args = json.load(sys.stdin)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 2 * args["daemons"] + 100)  # two sockets a daemon, and some
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    json.dump(asyncio.run(Fleet(args).run()), sys.stdout)


if __name__ == "__main__":
    main()
