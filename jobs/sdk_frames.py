"""Writing the SDK's result journal (POST /v1/daemon/result-chunk, fleet/sdk_worker.py):
one frame of an invocation's attempt, or of a topic, counted into its stream's totals
(jobs.ResultStream) and, for a topic, its credential's (jobs.TopicWriter), in the
statement that writes it. Reading the streams back is jobs/sdk.py's."""

from contextlib import nullcontext

from django.conf import settings
from django.db import connection, transaction

from jobs.models import TOPIC, ResultStream
from lakeshore_admin.errors import Forbidden, TooLarge

# One statement: count the frame into its stream's totals while they leave room, and
# write it only then. A repeated (stream, attempt, seq) counts without being written
# (the first write wins), which only brings the limit nearer for a worker that repeats
# itself. A topic's frame is also counted into its credential's totals (`budget`, after
# the stream's row: retention locks the two in that order too), and goes only into a
# topic that credential opened; an invocation's attempt is the holder's
# (fleet/sdk_worker.py checked it), so it counts only into its own stream.
_FRAME_SQL = """
WITH room AS (
    INSERT INTO jobs_resultstream AS s
           (stream, attempt, writer_token_id, frames, bytes, updated_at)
    VALUES (%(stream)s, %(attempt)s, %(token)s, 1, %(size)s, now())
    ON CONFLICT (stream, attempt) DO UPDATE
       SET frames = s.frames + 1, bytes = s.bytes + EXCLUDED.bytes, updated_at = now(),
           writer_token_id = coalesce(s.writer_token_id, EXCLUDED.writer_token_id)
     WHERE s.frames < %(max_frames)s AND s.bytes + EXCLUDED.bytes <= %(max_bytes)s{writer}
    RETURNING 1
), budget AS ({budget}), written AS (
    INSERT INTO jobs_resultframe (stream, attempt, seq, data, final, created_at)
    SELECT %(stream)s, %(attempt)s, %(seq)s, %(data)s, %(final)s, now() FROM budget
    ON CONFLICT (stream, attempt, seq) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM budget), (SELECT count(*) FROM written)
"""
_TOPIC_BUDGET = """
    INSERT INTO jobs_topicwriter AS w (token_id, frames, bytes, updated_at)
    SELECT %(token)s, 1, %(size)s, now() FROM room
    ON CONFLICT (token_id) DO UPDATE
       SET frames = w.frames + 1, bytes = w.bytes + EXCLUDED.bytes, updated_at = now()
     WHERE w.frames < %(max_frames)s AND w.bytes + EXCLUDED.bytes <= %(credential_bytes)s
    RETURNING 1"""
# a topic opened before its writer was recorded goes to the first credential that writes
_TOPIC_WRITER = """
       AND coalesce(s.writer_token_id, EXCLUDED.writer_token_id) = EXCLUDED.writer_token_id"""
_TOPIC_FRAME_SQL = _FRAME_SQL.format(budget=_TOPIC_BUDGET, writer=_TOPIC_WRITER)
_ATTEMPT_FRAME_SQL = _FRAME_SQL.format(budget="SELECT 1 FROM room", writer="")


def insert_frame(
    stream: str,
    seq: int,
    data: bytes,
    final: bool,
    *,
    attempt: int = TOPIC,
    token_id: int | None = None,
) -> bool:
    """Write one frame of `stream`: an invocation's `attempt` (the one `token_id` holds),
    or a topic (attempt TOPIC). True if written, False if that seq was there already.
    413 stream_full past the stream's bounds, or past the credential's for its topics
    together; 403 stream_not_yours for a topic another credential opened. Nothing is
    counted or written when it is refused."""
    if attempt == TOPIC and token_id is None:  # a console session: nothing to count against
        raise Forbidden("Writing a topic needs an API token.")
    max_frames = settings.LAKESHORE_SDK_STREAM_MAX_FRAMES
    max_bytes = settings.LAKESHORE_SDK_STREAM_MAX_BYTES
    if len(data) > max_bytes:
        raise _stream_full(stream, max_frames, max_bytes)
    params = {
        "stream": stream,
        "attempt": attempt,
        "token": token_id,
        "seq": seq,
        "data": data,
        "final": final,
        "size": len(data),
        "max_frames": max_frames,
        "max_bytes": max_bytes,
        "credential_bytes": settings.LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL,
    }
    topic = attempt == TOPIC
    # a topic's statement may count its stream before its credential refuses it: undone
    with transaction.atomic() if topic else nullcontext(), connection.cursor() as cursor:
        cursor.execute(_TOPIC_FRAME_SQL if topic else _ATTEMPT_FRAME_SQL, params)
        counted, written = cursor.fetchone()
        if topic and not counted:
            transaction.set_rollback(True)
    if not counted:
        raise _refusal(stream, attempt, token_id, len(data))
    return bool(written)


def _refusal(stream: str, attempt: int, token_id: int, size: int):
    """Why a frame found no room: the stream is another credential's, the stream is
    full, or (a topic) its credential's topics are."""
    max_frames = settings.LAKESHORE_SDK_STREAM_MAX_FRAMES
    max_bytes = settings.LAKESHORE_SDK_STREAM_MAX_BYTES
    row = ResultStream.objects.filter(stream=stream, attempt=attempt).first()
    if attempt == TOPIC and row is not None and row.writer_token_id not in (None, token_id):
        return Forbidden(
            f"Topic {stream!r} was opened by another credential: a topic takes frames "
            "only from the credential that wrote its first frame.",
            code="stream_not_yours",
        )
    if row is not None and (row.frames >= max_frames or row.bytes + size > max_bytes):
        return _stream_full(stream, max_frames, max_bytes)
    credential_bytes = settings.LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL
    return TooLarge(
        f"This credential's topics are full: the topics one credential writes hold at "
        f"most {max_frames:,} frames and {credential_bytes:,} bytes together "
        "(LAKESHORE_SDK_STREAM_MAX_FRAMES, LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL) "
        "until retention sweeps them.",
        extra={"max_frames": max_frames, "max_bytes": credential_bytes},
        code="stream_full",
    )


def _stream_full(stream: str, max_frames: int, max_bytes: int) -> TooLarge:
    return TooLarge(
        f"Stream {stream!r} is full: a stream holds at most {max_frames:,} frames and "
        f"{max_bytes:,} bytes (LAKESHORE_SDK_STREAM_MAX_FRAMES, _MAX_BYTES).",
        extra={"max_frames": max_frames, "max_bytes": max_bytes},
        code="stream_full",
    )
