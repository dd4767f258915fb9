"""The Python SDK's wire: what `dreamlake-lakeshore` 0.5.0 (`@dls.udf`, `SyncQueue`,
`python -m dreamlake.lakeshore.daemon`) sends, answered through the same services as
the REST API (../shared/design/SDK-WIRE.md records what the package expects).

    producer   submit · await · result stream     (an operator token)
    worker     poll · ack · result-chunk          (a daemon token)

(The result journal's writing, a result-chunk's frame, is jobs/sdk_frames.py.)

An SDK submit is an ordinary invocation: the same queues, admission rules, kinds,
keys, kills and lists. What differs is how its arguments travel: an opaque msgpack
blob (an Envelope for `@udf` calls and thunks, a bare value for `SyncQueue.submit`),
which the server never decodes beyond the function's name, to show it. The id the SDK
holds is the invocation's id: the submit answers it and the SDK adopts it.

An SDK worker is a daemon (its side of the wire: fleet/sdk_worker.py): its first poll
registers it (fleet.registration.sdk_worker_seen). It sends no heartbeat while it runs
a job, so a lease keeps the job (fleet/daemons.py, _SILENT_SQL). Its ack carries no
worker id: the invocation names its daemon, and the token must own that daemon. A late
or repeated ack answers 2xx with `ignored` (a 4xx would end the stock worker), and
changes nothing."""

import time

import msgpack
from django.conf import settings
from django.db import IntegrityError, connection
from django.db.models import BinaryField, F, Func
from django.db.models.functions import Substr

from jobs import services, waits, wakeup
from jobs.models import (
    SDK_WIRES,
    TERMINAL_STATES,
    TOPIC,
    Invocation,
    InvocationState,
    ResultFrame,
    Wire,
)
from lakeshore import sdk_job
from lakeshore_admin.errors import Busy, Invalid, NotFound, TooLarge

AWAIT_MAX_SECONDS = 25.0  # under the SDK's 30 s read timeout
LOOK_SDK = 2.0  # seconds between the looks of an await or stream that is notified
SUBMIT_BLOCK_MAX = 20.0  # the longest a submit waits for room in a full queue
POLL_MAX_SECONDS = 20.0
FUNCTION_MAX = 300
VALUE_FUNCTION = "(value)"  # what a bare SyncQueue.submit(value) shows as its function

# The states the SDK knows: it waits on pending/running and raises on the others.
SDK_STATE = {
    InvocationState.QUEUED: "pending",
    InvocationState.RUNNING: "running",
    InvocationState.SUCCEEDED: "succeeded",
    InvocationState.FAILED: "failed",
    InvocationState.TIMEOUT: "failed",
    InvocationState.KILLED: "killed",
}


# ---------------------------------------------------------------------------- checks


def stream_start(namespace: str, invocation_id: str, since: str) -> int:
    """The checks of a result stream's request: its namespace, its invocation id (at most
    200 characters) and `since` (an integer); the frame to start after."""
    check_namespace(namespace)
    try:
        start = int(since)
    except ValueError:
        raise Invalid(f"since must be an integer, got {since!r}.") from None
    if len(invocation_id) > 200:
        raise Invalid("The invocation id is longer than 200 characters.")
    return start


def check_namespace(namespace: str) -> None:
    if namespace != settings.LAKESHORE_SDK_NAMESPACE:
        raise NotFound(
            f"Namespace {namespace!r} does not exist: this server is the one namespace "
            f"{settings.LAKESHORE_SDK_NAMESPACE!r} (LAKESHORE_SDK_NAMESPACE).",
            code="namespace_unknown",
        )


def read_blob(value, name: str, *, required: bool = True) -> bytes | None:
    if value is None and not required:
        return None
    if not isinstance(value, bytes | bytearray):
        raise Invalid(f"{name} must be msgpack bin (bytes).", fields={name: "not bytes"})
    limit = settings.LAKESHORE_SDK_MAX_BLOB_BYTES
    if len(value) > limit:
        raise TooLarge(
            f"{name} is {len(value):,} bytes; the limit is {limit:,} "
            "(LAKESHORE_SDK_MAX_BLOB_BYTES). Pass large data by reference (a storage key).",
            extra={"limit": limit, "size": len(value)},
        )
    return bytes(value)


def read_text(body: dict, name: str, *, max_length: int = 200, allow_empty: bool = False) -> str:
    value = body.get(name)
    if not isinstance(value, str) or (not value and not allow_empty):
        raise Invalid(f"{name} must be a non-empty string.", fields={name: "missing"})
    if len(value) > max_length:
        raise Invalid(f"{name} is longer than {max_length} characters.", fields={name: "too long"})
    if "\x00" in value:
        raise Invalid(f"{name} holds a NUL character.", fields={name: "NUL"})
    return value


def read_number(value, name: str, *, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise Invalid(f"{name} must be a number.", fields={name: "not a number"})
    if not low <= value <= high:
        raise Invalid(f"{name} must be between {low:g} and {high:g}.", fields={name: "range"})
    return float(value)


def read_invocation_id(value) -> int:
    """The SDK holds our id as a string."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not text.isdigit() or len(text) > 18:
        raise NotFound(f"Invocation {value!r} does not exist.")
    return int(text)


# ---------------------------------------------------------------------------- what a blob is


def describe(blob: bytes) -> tuple[str, str]:
    """(wire, function) of an args_blob: an Envelope names its function (`module.
    qualname` by reference, the qualname of a pickled one), read as the daemon reads it
    (lakeshore.sdk_job.describe); anything else is a bare value."""
    try:
        fn = sdk_job.describe(blob)
    except ValueError:
        return Wire.VALUE, VALUE_FUNCTION
    qualname = fn["qualname"] or "(unnamed)"
    name = f"{fn['module']}.{qualname}" if fn["kind"] == "ref" and fn["module"] else qualname
    return Wire.ENVELOPE, name[:FUNCTION_MAX]


HEAD_BYTES = 64 * 1024  # an Envelope's `fn` (its pickle at most 32 KiB) lies in these
FN_TEXT = ("kind", "module", "qualname", "where")


def shipped_function(invocation_id: int) -> dict | None:
    """The function as the SDK sent it in an Envelope: {"kind": "ref"|"pickle", "module",
    "qualname", "where"} (`where` names a pickled function's file and line:
    "<lambda> (/home/ana/run.py:8)"). Read from the first HEAD_BYTES of args_blob alone:
    the Envelope's keys come in the SDK's order (v, id, fn, then the arguments). None
    when they are not there."""
    head = (
        Invocation.objects.filter(pk=invocation_id)
        .annotate(head=Substr("args_blob", 1, HEAD_BYTES, output_field=BinaryField()))
        .values_list("head", flat=True)
        .first()
    )
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=HEAD_BYTES)
    unpacker.feed(bytes(head or b""))
    try:
        for _ in range(min(unpacker.read_map_header(), 3)):
            if unpacker.unpack() == "fn":
                fn = unpacker.unpack()
                break
            unpacker.skip()
        else:
            return None
    except (msgpack.OutOfData, msgpack.UnpackException, ValueError, TypeError):
        return None
    if not isinstance(fn, dict):
        return None
    text = {key: fn.get(key) if isinstance(fn.get(key), str) else "" for key in FN_TEXT}
    return {**text, "kind": text["kind"] or "ref"}


def function_note(invocation: Invocation) -> str:
    """How an SDK invocation's function travelled, beside its name on the job page."""
    if invocation.wire == Wire.VALUE:
        return "Python SDK: a bare value, SyncQueue.submit"
    fn = shipped_function(invocation.pk)
    if fn is None:
        return "Python SDK"
    if fn["kind"] == "ref":
        return "Python SDK: @dls.udf by reference, imported where it runs"
    where = fn["where"]
    named = f"{fn['qualname']} ("
    if where.startswith(named) and where.endswith(")"):
        where = where[len(named) : -1]  # "<lambda> (/home/ana/run.py:8)": the place alone
    return f"Python SDK: pickled{f', defined at {where}' if where else ''}"


# ---------------------------------------------------------------------------- producer


def submit(body: dict) -> tuple[Invocation, bool]:
    """POST …/producer/submit: queue the blob. (invocation, created); an idempotent
    key already used in the queue answers its invocation, whatever its state."""
    queue = read_text(body, "queue", max_length=63)
    blob = read_blob(body.get("args_blob"), "args_blob")
    run_config = body.get("run_config") or {}
    if not isinstance(run_config, dict):
        raise Invalid("run_config must be a map.", fields={"run_config": "not a map"})
    priority = read_number(
        run_config.get("priority"), "run_config.priority", default=0.0, low=-1e6, high=1e6
    )
    key = run_config.get("key") or ""
    if not isinstance(key, str) or len(key) > 200 or "\x00" in key:
        raise Invalid("run_config.key must be a string of at most 200 characters.")
    timeout = run_config.get("timeout_s")
    timeout_s = (
        None
        if timeout in (None, 0)
        else int(read_number(timeout, "run_config.timeout_s", default=0, low=1, high=2**31 - 1))
    )
    wire, function = describe(blob)
    try:
        return services.invocation_submit(
            function=function,
            queue=queue,
            priority=priority,
            key=key,
            timeout_s=timeout_s,
            max_attempts=settings.LAKESHORE_SDK_MAX_ATTEMPTS,
            # a queue with on_full=block holds the submit, but answers before the SDK's
            # own 30 s timeout would give up on it
            block_timeout=min(float(settings.LAKESHORE_BLOCK_TIMEOUT), SUBMIT_BLOCK_MAX),
            wire=wire,
            args_blob=blob,
            run_config=_plain(run_config),
        )
    except IntegrityError as exc:  # a value PostgreSQL refuses (run_config with NUL…)
        raise Invalid(f"The database refused the submit: {exc}") from None


def _plain(value):
    """run_config as JSON can hold it (bytes become their size; NUL is dropped)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, float) and value != value:
        return None
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def await_steps(body: dict) -> waits.Steps:
    """POST …/producer/await: the invocation's state once it is terminal, or when
    `timeout_s` (at most AWAIT_MAX_SECONDS) passes first, as steps (jobs/waits.py): it
    looks at the invocation, and yields a
    Wait between looks. An SDK invocation's end is notified (`inv:ID`,
    jobs/migrations/0012): it waits for that, looking again only every LOOK_SDK seconds
    as a safety net. One of the REST API's (nothing notifies its end) is looked at after
    a growing pause (20 ms to 250 ms). A wait refused (None), or a server that is
    stopping, answers the state last read."""
    pk = read_invocation_id(body.get("invocation_id"))
    wait = read_number(body.get("timeout_s"), "timeout_s", default=5.0, low=0, high=3600)
    deadline = time.monotonic() + min(wait, AWAIT_MAX_SECONDS)
    listening = [f"inv:{pk}"]
    seen = wakeup.listener.snapshot(listening)  # before the look: no end is missed
    row = _await_row(pk)
    pause = 0.02
    while row["state"] not in TERMINAL_STATES:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        _release_connection()
        look = LOOK_SDK if row["wire"] in SDK_WIRES else pause  # SDK_WIRES: notified
        woken = yield waits.Wait(listening, seen, min(look, left))
        if woken is None or wakeup.listener.closing:
            break
        pause = min(pause * 1.5, 0.25)
        seen = wakeup.listener.snapshot(listening)
        row = _await_row(pk)
    return _await_answer(row)


def _await_row(pk: int) -> dict:
    row = (
        Invocation.objects.filter(pk=pk)
        .values("state", "result_blob", "error", "timeout_s", "wire", "result")
        .first()
    )
    if row is None:
        raise NotFound(f"Invocation {pk} does not exist.")
    return row


def _await_answer(row: dict) -> dict:
    state = row["state"]
    answer = {"state": SDK_STATE[state], "result_blob": None, "result_ref": None, "error": None}
    if state == InvocationState.SUCCEEDED:
        blob = row["result_blob"]
        answer["result_blob"] = bytes(blob) if blob is not None else None
    elif state == InvocationState.TIMEOUT:
        answer["error"] = {"message": row["error"] or f"timed out after {row['timeout_s']} s"}
    elif state in (InvocationState.FAILED, InvocationState.KILLED):
        answer["error"] = {"message": row["error"] or state}
    return answer


# ---------------------------------------------------------------------------- stream


def open_frames(stream: str, since: int) -> waits.Holding:
    """The stream's frames (`frames`), holding a wait slot until the response is
    closed. Without a free slot, a stream that may have to wait for frames gets 503
    `busy` with Retry-After before its first byte: the SDK reads a stream that ends as
    complete, so a stream is refused whole rather than cut short. One that is over
    (a final frame stored, or its invocation ended) never waits: it is served."""
    who = waits.serving_principal()
    held = waits.slots.take(who)
    if not held and not _over(stream):
        raise Busy(
            "The server is serving as many waiting requests as it may (LAKESHORE_MAX_WAITS), "
            "or as many of this token's as it may (LAKESHORE_MAX_WAITS_PER_PRINCIPAL); open "
            "the stream again shortly.",
            retry_after=waits.retry_after(1),
        )
    return waits.Holding(frames(stream, since), held, who)


def _over(stream: str) -> bool:
    """No frame will come: its invocation ended, or (a topic) its final frame is there."""
    pk = invocation_of(stream)
    if pk is not None and Invocation.objects.filter(pk=pk).exists():
        return Invocation.objects.filter(pk=pk, state__in=TERMINAL_STATES).exists()
    return ResultFrame.objects.filter(stream=stream, attempt=TOPIC, final=True).exists()


def invocation_of(stream: str) -> int | None:
    """The invocation id a stream names (a number), or None: a topic's name."""
    return int(stream) if stream.isdigit() and len(stream) <= 18 else None


def frames(stream: str, since: int):
    """GET …/invocations/<id>/result/stream: the stored frames after `since`, then
    live ones, as bytes, one frame at a time (frame_steps, asleep in this thread
    between looks, woken by a frame or the invocation's end)."""
    steps = frame_steps(stream, since)
    try:
        for step in steps:
            if isinstance(step, waits.Wait):
                wakeup.listener.wait(step.queues, step.seen, step.seconds)
            else:
                yield from step
    finally:
        steps.close()


def frame_steps(stream: str, since: int):
    """The stream as steps: it yields the frames of each read (a list of bytes, at
    most LAKESHORE_SDK_STREAM_READ_BYTES, or one larger frame), or a Wait between looks
    that found nothing: for a frame (`frame:STREAM`) or the invocation's end (`inv:ID`),
    both notified (jobs/migrations/0012), looking again every LOOK_SDK seconds as a
    safety net. Holds no database connection between looks.

    An invocation's stream is its latest attempt's: each look reads the frames of the
    attempt the invocation is at, after the last seq sent (a retry's frames carry on
    from there). An attempt's final frame ends the stream only once the invocation has
    ended: an attempt that failed and is retried is not its end (the SDK would raise
    its ERROR frame), and the worker acks just after the final frame. A topic's stream
    ends at its final frame. Either ends once the invocation is over with nothing
    newer, or after LAKESHORE_SDK_STREAM_IDLE_SECONDS without a frame (a topic that
    nobody posts to)."""
    cursor = since
    idle_limit = float(settings.LAKESHORE_SDK_STREAM_IDLE_SECONDS)
    quiet_since = time.monotonic()
    pk = invocation_of(stream)
    listening = [f"frame:{stream}", *([f"inv:{pk}"] if pk is not None else [])]
    try:
        while True:
            seen = wakeup.listener.snapshot(listening)  # before the look
            row = (
                Invocation.objects.filter(pk=pk).values("state", "attempts").first()
                if pk is not None
                else None
            )
            attempt = TOPIC if row is None else row["attempts"]
            over = row is None or row["state"] in TERMINAL_STATES  # a final frame ends it
            rows = _next_frames(stream, attempt, cursor)  # read after the state: none missed
            ended = next((i for i, frame in enumerate(rows) if frame[2]), None)
            if ended is not None:
                rows = rows[: ended + 1] if over else rows[:ended]  # nothing after a final
            if rows:
                cursor = rows[-1][0]
                yield [bytes(data) for _, data, _ in rows]
                if ended is not None and over:
                    return
                quiet_since = time.monotonic()
                continue
            if row is not None and row["state"] in TERMINAL_STATES:
                return
            quiet = time.monotonic() - quiet_since
            if quiet >= idle_limit:
                return
            _release_connection()
            yield waits.Wait(listening, seen, min(LOOK_SDK, idle_limit - quiet))
    finally:
        _release_connection()


READ_FRAMES_MAX = 500  # frames one read loads, whatever their size


def _next_frames(stream: str, attempt: int, after: int) -> list[tuple[int, bytes, bool]]:
    """The attempt's frames after seq `after`, in order: as many as fit in
    LAKESHORE_SDK_STREAM_READ_BYTES (always at least one), at most READ_FRAMES_MAX.
    Their sizes are read first, so frames past the budget are never loaded."""
    frames_after = ResultFrame.objects.filter(stream=stream, attempt=attempt, seq__gt=after)
    sizes = list(
        frames_after.order_by("seq")
        .annotate(size=Func(F("data"), function="octet_length"))
        .values_list("seq", "size")[:READ_FRAMES_MAX]
    )
    budget, last = settings.LAKESHORE_SDK_STREAM_READ_BYTES, None
    for seq, size in sizes:
        if last is not None and size > budget:
            break
        budget -= size
        last = seq
    if last is None:
        return []
    return list(
        frames_after.filter(seq__lte=last).order_by("seq").values_list("seq", "data", "final")
    )


def _release_connection() -> None:
    """Hold no database connection while waiting (not inside a transaction: a test's)."""
    if not connection.in_atomic_block:
        connection.close()
