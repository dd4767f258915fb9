"""The SDK worker's side of the wire (POST /v1/daemon/poll, ack, result-chunk): an SDK
worker is a daemon (its first poll registers it, fleet/registration.py), its poll a
claim and its ack a completion (fleet/protocol.py). The producer's side (submit, await,
the result stream) and the wire's shared readers are jobs/sdk.py."""

from fleet import daemons, protocol, registration
from jobs.models import SDK_WIRES, TOPIC, Invocation, InvocationState
from jobs.sdk import (
    POLL_MAX_SECONDS,
    SDK_STATE,
    read_blob,
    read_invocation_id,
    read_number,
    read_text,
)
from jobs.sdk_frames import insert_frame
from lakeshore_admin.errors import Conflict, Invalid, NotFound

# What the SDK's worker acks: its own words, and ours (protocol.invocation_complete).
SDK_ACK_STATES = (InvocationState.SUCCEEDED, InvocationState.FAILED)


def poll_steps(body: dict, *, user, token=None):
    """POST /v1/daemon/poll: at most one run command, waiting up to `timeout_s`, as
    steps (jobs/waits.py): where it waits, it yields."""
    worker_id = read_text(body, "worker_id")
    queue = read_text(body, "queue", max_length=63)
    wait = read_number(body.get("timeout_s"), "timeout_s", default=1.0, low=0, high=3600)
    daemon = registration.sdk_worker_seen(owner=user, worker_id=worker_id, queue=queue, token=token)
    claimed = yield from protocol.claim_steps(
        daemon=daemon, limit=1, wait=min(wait, POLL_MAX_SECONDS), wires=SDK_WIRES
    )
    return {"commands": [_run_command(inv) for inv in claimed]}


def _run_command(invocation: Invocation) -> dict:
    blob = invocation.args_blob
    return {
        "kind": "run",
        "body": {
            "invocation_id": str(invocation.pk),
            "args_blob": bytes(blob) if blob is not None else b"",
            "attempt": invocation.attempts,
            "queue": invocation.queue,
            "run_config": invocation.run_config or {},
        },
    }


def _held_by(pk: int, token) -> Invocation | None:
    """The running invocation, if the token that polled it is this one. On the SDK's
    wire the token that polled an attempt is its holder: its ack carries no worker id
    and no attempt, so when the lease moved on to a worker polling with another token,
    an ack from the first is late (two workers sharing one token cannot be told apart:
    the README's "Guarantees" recommends one token per worker pool)."""
    invocation = Invocation.objects.select_related("daemon").filter(pk=pk).first()
    if invocation is None:
        raise NotFound(f"Invocation {pk} does not exist.")
    if invocation.state != InvocationState.RUNNING or invocation.daemon is None:
        return None
    if token is None or invocation.daemon.token_id != token.pk:
        return None
    return invocation


def ack(body: dict, *, token) -> dict:
    """POST /v1/daemon/ack: succeeded with result_blob, or failed with an error whose
    `retry` says whether another attempt may run (when attempts remain). An ack from a
    token that does not hold the running attempt changes nothing: 2xx `ignored`
    with claim_stale (a 4xx would end the stock worker)."""
    pk = read_invocation_id(body.get("invocation_id"))
    state = body.get("state")
    if state not in SDK_ACK_STATES:
        raise Invalid("state must be 'succeeded' or 'failed'.", fields={"state": "unknown"})
    error = body.get("error") or {}
    if not isinstance(error, dict):
        error = {"message": str(error)}
    result_blob = read_blob(body.get("result_blob"), "result_blob", required=False)
    invocation = _held_by(pk, token)
    if invocation is None:
        current = Invocation.objects.values_list("state", flat=True).get(pk=pk)
        if current == InvocationState.RUNNING:  # held under another token
            return {"ignored": True, "state": SDK_STATE[current], "reason": "claim_stale"}
        return {"ignored": True, "state": SDK_STATE[current], "reason": "not running"}
    message = str(error.get("message") or error.get("type") or "failed")[:100_000]
    try:
        done = protocol.invocation_complete(
            daemon=invocation.daemon,
            invocation_id=pk,
            attempt=invocation.attempts,
            outcome=state,
            result_blob=result_blob if state == InvocationState.SUCCEEDED else None,
            error="" if state == InvocationState.SUCCEEDED else message.replace("\x00", "\\x00"),
            retry=bool(error.get("retry", True)),
        )
    except Conflict as stale:  # lease expired and re-dispatched meanwhile, or dropped
        return {"ignored": True, "reason": stale.code}
    return {"state": SDK_STATE[done.state], "attempt": done.attempts}


def result_chunk(body: dict, *, token) -> dict:
    """POST /v1/daemon/result-chunk: one frame; the first write of a seq wins.

    An invocation's stream (a numeric id) takes frames only from the token that holds
    its running attempt, into that attempt's own stream (a retry writes a new one):
    anything else is ignored (2xx, claim_stale), before anything is written, so nobody
    can forge or end another's result. Any other id is a topic's name: it takes frames
    from the credential that opened it only (403 stream_not_yours), and one
    credential's topics together hold at most LAKESHORE_SDK_STREAM_MAX_FRAMES frames and
    LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL bytes (413 stream_full). A stream holds at
    most LAKESHORE_SDK_STREAM_MAX_FRAMES frames and _MAX_BYTES bytes (413 stream_full).
    A chunk from the worker running the job renews its lease."""
    stream = body.get("invocation_id")
    if isinstance(stream, int) and not isinstance(stream, bool):
        stream = str(stream)
    stream = read_text({"invocation_id": stream}, "invocation_id")
    seq = body.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not -(2**63) <= seq < 2**63:
        raise Invalid("seq must be an integer.", fields={"seq": "not an integer"})
    data = read_blob(body.get("bytes"), "bytes")
    final = bool(body.get("final", False))
    holder = None
    if stream.isdigit():
        holder = _held_by(read_invocation_id(stream), token)
        if holder is None:
            return {"seq": seq, "ignored": True, "reason": "claim_stale"}
    attempt = TOPIC if holder is None else holder.attempts
    token_id = token.pk if token is not None else None
    created = insert_frame(stream, seq, data, final, attempt=attempt, token_id=token_id)
    if holder is not None:
        daemons.touch(holder.daemon_id)
    return {"seq": seq, "duplicate": not created}
